"""strategy_options: a leaderboard config is its strategy's options too (ZeRO-3 is not ZeRO-2)

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-06

A config was (workload, hardware, strategy, world size): FSDP with and without resharding after
forward, or a pipeline under two schedules, shared one median labelled by one of their runs. Runs
now keep their strategy's options as measured (`parallab.core.spec.options_key`, e.g.
`reshard_after_forward=false`), copied to their leaderboard entry, and the config key, the cells'
unique key, the counts and the config index take it. Backfilled here from each stored result's
strategy block; the cells and counts are then rederived from the entries with ingest's rules
(`subset_cells`, `counts_of`). The workload key (the CI series' key) is untouched. The downgrade
drops the column and rederives the cells and counts under the old key.
"""

from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from backend.store.leaderboard import counts_of, grouped_by_config, runs_by_config, subset_cells
from parallab.core.spec import options_key

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None

BATCH = 5000
COLUMN = "strategy_options"
TABLES = ("runs", "leaderboard_entries", "leaderboard_cells", "leaderboard_counts")
OLD_CONFIG = ("workload_key", "hardware_key", "strategy", "world_size")
NEW_CONFIG = (*OLD_CONFIG, COLUMN)
ATTRIBUTES = ("model", "shape_key", "precision", "activation_checkpointing", "grad_accumulation_steps", "micro_batch_size")
FILTERED = ("source", "branch", "user_id", "checks_failed", "checks_stated")
CELL_VALUES = ("subset", "runs", "best_tokens_per_s", "failed_runs", "stated_runs", "marks")
FIGURES = ("median_tokens_per_s", "interval_low", "interval_high", "interval_coverage", "median_run_id")
CONSTRAINT = "uq_leaderboard_cells_workload_key"
CONFIG_INDEX = "ix_leaderboard_entries_config"
CARRIED = ["id", "model", "source", "branch", "user_id"]
DOCUMENT = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")

runs = sa.table("runs", sa.column("id", sa.String), sa.column(COLUMN, sa.String))
results = sa.table("run_results", sa.column("run_id", sa.String), sa.column("document", DOCUMENT))


def _entries(config: tuple[str, ...]) -> Any:
    columns = ("id", "tokens_per_s", *config, *ATTRIBUTES, *FILTERED)
    return sa.table("leaderboard_entries", *(sa.column(c) for c in columns))


def _cells(config: tuple[str, ...]) -> Any:
    columns = (*config, *ATTRIBUTES, *CELL_VALUES, *FIGURES)
    return sa.table("leaderboard_cells", *(sa.column(c, sa.JSON) if c == "marks" else sa.column(c) for c in columns))


def _counts(config: tuple[str, ...]) -> Any:
    return sa.table("leaderboard_counts", *(sa.column(c) for c in (*config, *ATTRIBUTES, *FILTERED, "runs")))


def _backfill_runs() -> None:
    """Each run with a stored result: its strategy's options as the options key, then its entry's copy."""
    conn = op.get_bind()
    strategy = results.c.document["strategy"]
    update = sa.update(runs).where(runs.c.id == sa.bindparam("run_id")).values({COLUMN: sa.bindparam("options")})
    batch: list[dict[str, Any]] = []
    for run_id, block in conn.execute(sa.select(results.c.run_id, strategy)):
        options = block.get("options") if isinstance(block, dict) else None
        key = options_key(options) if isinstance(options, dict) else ""
        if key:
            batch.append({"run_id": run_id, "options": key})
        if len(batch) >= BATCH:
            conn.execute(update, batch)
            batch = []
    if batch:
        conn.execute(update, batch)
    op.execute(
        f"UPDATE leaderboard_entries SET {COLUMN} = (SELECT runs.{COLUMN} FROM runs WHERE runs.id = leaderboard_entries.id) "
        f"WHERE EXISTS (SELECT 1 FROM runs WHERE runs.id = leaderboard_entries.id AND runs.{COLUMN} <> '')"
    )


def _rederive(config: tuple[str, ...]) -> None:
    """Every config's cells and counts again from the entries, under `config` as the key."""
    conn = op.get_bind()
    entries, cells, counts = _entries(config), _cells(config), _counts(config)
    conn.execute(sa.delete(cells))
    conn.execute(sa.delete(counts))
    key = [entries.c[c] for c in config]
    attributes = {
        tuple(r[: len(config)]): dict(zip(ATTRIBUTES, r[len(config) :], strict=True))
        for r in conn.execute(sa.select(*key, *(sa.func.min(entries.c[c]) for c in ATTRIBUTES)).group_by(*key))
    }
    batch: list[dict[str, Any]] = []
    for found, members in grouped_by_config(conn.execute(runs_by_config(entries, config)), len(config)):
        fixed = {**dict(zip(config, found, strict=True)), **attributes[found]}
        batch += [{**fixed, **cell} for cell in subset_cells([m[len(config) :] for m in members])]
        if len(batch) >= BATCH:
            conn.execute(sa.insert(cells), batch)
            batch = []
    if batch:
        conn.execute(sa.insert(cells), batch)
    count_key = (*config, *ATTRIBUTES, *FILTERED)
    conn.execute(sa.insert(counts).from_select([*count_key, "runs"], counts_of(entries, count_key=count_key)))


def _keys(config: tuple[str, ...]) -> None:
    """The cells' unique key and the config index over `config` (the index keeps throughput last, as a key)."""
    with op.batch_alter_table("leaderboard_cells") as batch:
        batch.drop_constraint(CONSTRAINT, type_="unique")
        batch.create_unique_constraint(CONSTRAINT, [*config, "subset"])
    postgres = op.get_bind().dialect.name == "postgresql"
    op.drop_index(CONFIG_INDEX, table_name="leaderboard_entries")
    op.create_index(CONFIG_INDEX, "leaderboard_entries", [*config, "tokens_per_s"], postgresql_include=CARRIED if postgres else [])


def upgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column(COLUMN, sa.String(200), nullable=False, server_default=""))
    _keys(NEW_CONFIG)
    _backfill_runs()
    _rederive(NEW_CONFIG)


def downgrade() -> None:
    op.get_bind().execute(sa.delete(_cells(NEW_CONFIG)))  # split configs would collide under the old key
    _keys(OLD_CONFIG)
    for table in TABLES:
        with op.batch_alter_table(table) as batch:
            batch.drop_column(COLUMN)
    _rederive(OLD_CONFIG)
