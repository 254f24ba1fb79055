"""The settings are grouped by concern in the code (`settings.limits.max_world_size`), and the
environment stays flat: every PARALLAB_* variable that the README, docs/, .env.example or compose
name still sets its field, each one set here and its grouped field read back."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, get_args

import pytest
from pydantic import BaseModel, SecretStr

from backend.config import ServerLimits, Settings, environment_names
from parallab.core.jobs import Limits

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", ROOT / ".env.example", *ROOT.glob("docker-compose*.yml"), *sorted((ROOT / "docs").rglob("*.md"))]
DOCUMENTS += sorted((ROOT / "docs").rglob("*.yml"))
NAME = re.compile(r"\bPARALLAB_[A-Z0-9]+(?:_[A-Z0-9]+)*\b")

NOT_SETTINGS = {
    "PARALLAB_SERVER": "the CLI client's server URL (parallab upload/ci)",
    "PARALLAB_TOKEN": "the CLI client's API token",
    "PARALLAB_SCREENSHOTS": "where the screenshot tests write their images",
    "PARALLAB_VENV": "the virtual environment ./run uses",
    "PARALLAB_TEST_WORKERS": "how many pytest-xdist workers ./run test starts",
    "PARALLAB_TEST_UNIT_SECONDS": "where a whole test run under xdist writes each unit's measured seconds",
}
"""Documented variables that are read by a client or a script, not by Settings."""


def documented() -> list[str]:
    names = {name for path in DOCUMENTS for name in NAME.findall(path.read_text())}
    return sorted(names - set(NOT_SETTINGS))


def test_the_documents_name_the_settings_at_all() -> None:
    names = documented()
    assert {"PARALLAB_HOME", "PARALLAB_DATABASE_URL", "PARALLAB_MAX_WORLD_SIZE", "PARALLAB_SECRET_KEY"} <= set(names)
    assert len(names) >= 60, names


def test_the_names_that_are_no_settings_are_indeed_none() -> None:
    assert not {name.removeprefix("PARALLAB_").lower() for name in NOT_SETTINGS} & set(environment_names(Settings))


def _different(field: str, info: Any, default: Any) -> tuple[str, Any]:
    """A value for `field` other than its default, as the environment writes it and as the field then holds it."""
    special: dict[str, tuple[str, Any]] = {
        "allowed_modules": ("examples.lab_model:build, mylab.models:gpt", frozenset({"examples.lab_model:build", "mylab.models:gpt"})),
        "quota_exempt_emails": ('["ci-bot@lab.org"]', ["ci-bot@lab.org"]),
        "admin_password": ("pw-from-env", "pw-from-env"),
        "worker_netns": ("emu-node-1", "emu-node-1"),
        "pool": ("h100x8", "h100x8"),
        "default_pool": ("h100x8", "h100x8"),
        "host": ("0.0.0.0", "0.0.0.0"),
    }
    if field in special:
        return special[field]
    kind = next((arg for arg in get_args(info.annotation) if arg is not type(None)), info.annotation)
    if kind is bool:
        return str(not default).lower(), not default
    if kind is int:
        return str((default or 0) + 3), (default or 0) + 3
    if kind is float:
        return str((default or 1.0) * 1.5), (default or 1.0) * 1.5
    if kind is Path:
        return "/tmp/parallab-env-test", Path("/tmp/parallab-env-test")
    assert kind in (str, SecretStr), f"{field}: no test value for {kind}"
    return "from-env-x1", "from-env-x1"


@pytest.mark.parametrize("name", documented())
def test_each_documented_variable_still_sets_its_field(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    names = environment_names(Settings)
    key = name.removeprefix("PARALLAB_").lower()
    assert key in names, f"{name} is documented but sets no setting (renamed or dropped?)"
    group, field = names[key]
    model: type[BaseModel] = Settings if group is None else Settings.model_fields[group].annotation  # type: ignore[assignment]
    info = model.model_fields[field]
    default = Settings() if group is None else getattr(Settings(), group)
    written, expected = _different(field, info, getattr(default, field))
    assert expected != getattr(default, field)

    monkeypatch.setenv(name, written)
    settings = Settings()
    where = settings if group is None else getattr(settings, group)
    held = getattr(where, field)
    assert (held.get_secret_value() if isinstance(held, SecretStr) else held) == expected, f"{name} did not set {group}.{field}"


def test_the_constructor_and_a_copy_take_the_flat_names_and_the_constructor_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARALLAB_MAX_WORLD_SIZE", "3")
    monkeypatch.setenv("PARALLAB_MAX_STEPS", "70")
    settings = Settings(max_steps=5, host="0.0.0.0")
    assert (settings.limits.max_world_size, settings.limits.max_steps, settings.server.host) == (3, 5, "0.0.0.0")
    assert Settings(limits={"max_steps": 9}).limits.max_world_size == 3, "a group given in part keeps the environment's others"
    assert Settings(limits={"max_steps": 9}).limits.max_seq_len == ServerLimits().max_seq_len, "and the server's defaults"
    copy = settings.model_copy(update={"max_world_size": 16, "secret_key": "copied"})
    assert (copy.limits.max_world_size, copy.security.secret_key) == (16, "copied")
    assert settings.limits.max_world_size == 3 and not hasattr(copy, "max_world_size")
    copy.server.max_upload_bytes = 4096
    assert settings.server.max_upload_bytes != 4096, "a copy's groups are its own"


def test_the_limits_group_is_the_limits_a_job_is_checked_against() -> None:
    settings = Settings(max_world_size=2)
    assert isinstance(settings.limits, Limits) and settings.limits.whose == "the server's"
    assert "whose" not in environment_names(Settings), "the refusal's wording is no setting"
    planning = settings.limits.without_ceilings()
    assert planning.max_world_size is None and planning.allowed_modules == settings.limits.allowed_modules


def test_each_setting_has_one_name_across_the_groups() -> None:
    class Twice(Settings):
        worker_host: str = "x"  # also the worker group's field

    with pytest.raises(TypeError, match="worker_host"):
        environment_names(Twice)
