"""Migrations are the only schema source: one head, no drift from the models, indexes intact."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect

from backend.db import get_engine
from backend.migrate import alembic_config, downgrade, upgrade
from backend.models import Base


def test_one_head(sqlite_url: str) -> None:
    heads = ScriptDirectory.from_config(alembic_config(sqlite_url)).get_heads()
    assert len(heads) == 1, f"migrations must have one head, found {heads}"


def test_models_and_migrations_do_not_drift(db_url: str) -> None:
    with get_engine(db_url).connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        diff = compare_metadata(context, Base.metadata)
    assert diff == [], f"models and migrations differ: {diff}"


def test_indexes_survive_migrations(db_url: str) -> None:
    # MLflow #14465: a migration that dropped indexes made every list page slow.
    inspector = inspect(get_engine(db_url))
    names = {ix["name"] for ix in inspector.get_indexes("runs")}
    assert {"ix_runs_leaderboard", "ix_runs_status_created", "ix_runs_created_at", "ix_runs_strategy"} <= names
    assert "ix_rank_metrics_run_id" in {ix["name"] for ix in inspector.get_indexes("rank_metrics")}


def test_downgrade_then_upgrade_round_trips(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'rt.db'}"
    upgrade(url)
    downgrade(url, "base")
    assert "runs" not in inspect(get_engine(url)).get_table_names()
    upgrade(url)
    assert "runs" in inspect(get_engine(url)).get_table_names()
