"""`parallab plan` invoked in-process on a test's settings (the CLI reads them from the environment)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import typer
from typer.testing import CliRunner, Result

from backend.config import Settings, get_settings
from parallab.commands.plan import plan


def run_plan_cli(settings: Settings, monkeypatch: pytest.MonkeyPatch, args: Sequence[str]) -> Result:
    """`parallab plan ARGS` on `settings`' database and home; the cached settings cleared around it."""
    monkeypatch.setenv("PARALLAB_DATABASE_URL", settings.sqlalchemy_url)
    monkeypatch.setenv("PARALLAB_HOME", str(settings.resolved_home))
    get_settings.cache_clear()
    app = typer.Typer()
    app.command()(plan)
    try:
        return CliRunner().invoke(app, list(args))
    finally:
        get_settings.cache_clear()
