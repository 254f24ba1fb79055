"""leaderboard: a config's cells per subset of its runs (checks passed, verified, both)

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-04

The board's check filters (`checks=passed`, `verified=true`) kept only some of a config's runs,
so its median over them came from the runs: at 1,000,000 runs the best-per-config board with
both filters read a million entries' window (1.2 s p95). Each config now has a cell per subset
of its runs — all of them (the cell that was there), those that passed their checks, those whose
checks the lab made, and both — kept in the run's transaction as the first one is, so every
filter combination reads cells.

The existing cells become the `all` subset (their rows untouched); the others are derived from
the entries here, with ingest's own rule (`backend.store.leaderboard.subset_cells`), in one
ordered pass. The downgrade drops only what was derived.
"""

from typing import Any

import sqlalchemy as sa
from alembic import op

from backend.store.leaderboard import grouped_by_config, runs_by_config, subset_cells

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

BATCH = 5000
CONSTRAINT = "uq_leaderboard_cells_workload_key"
CONFIG = ("workload_key", "hardware_key", "strategy", "world_size")
ATTRIBUTES = ("model", "shape_key", "precision", "activation_checkpointing", "grad_accumulation_steps", "micro_batch_size")
COUNTS = ("runs", "best_tokens_per_s", "failed_runs", "stated_runs")
FIGURES = ("median_tokens_per_s", "interval_low", "interval_high", "interval_coverage", "median_run_id")

entries = sa.table(
    "leaderboard_entries",
    sa.column("id", sa.String),
    sa.column("tokens_per_s", sa.Float),
    sa.column("checks_failed", sa.String),
    sa.column("checks_stated", sa.String),
    *(sa.column(c) for c in CONFIG),
)
cells = sa.table("leaderboard_cells", sa.column("subset", sa.String), *(sa.column(c) for c in (*CONFIG, *ATTRIBUTES, *COUNTS, *FIGURES)))


def upgrade() -> None:
    with op.batch_alter_table("leaderboard_cells") as batch:
        batch.add_column(sa.Column("subset", sa.String(16), nullable=False, server_default="all"))
        batch.drop_constraint(CONSTRAINT, type_="unique")
        batch.create_unique_constraint(CONSTRAINT, [*CONFIG, "subset"])
    conn = op.get_bind()
    attributes = {
        tuple(r[: len(CONFIG)]): dict(zip(ATTRIBUTES, r[len(CONFIG) :], strict=True))
        for r in conn.execute(sa.select(*(cells.c[c] for c in (*CONFIG, *ATTRIBUTES))).where(cells.c.subset == "all"))
    }
    rows = conn.execute(runs_by_config(entries, CONFIG))
    batch_rows: list[dict[str, Any]] = []
    for key, members in grouped_by_config(rows, len(CONFIG)):
        if key not in attributes:  # (an entry without a cell: nothing the board showed)
            continue
        fixed = {**dict(zip(CONFIG, key, strict=True)), **attributes[key]}
        derived = [cell for cell in subset_cells([m[len(CONFIG) :] for m in members]) if cell["subset"] != "all"]
        batch_rows += [{**fixed, **{k: v for k, v in cell.items() if k in cells.c}} for cell in derived]  # (0022 adds the marks)
        if len(batch_rows) >= BATCH:
            conn.execute(sa.insert(cells), batch_rows)
            batch_rows = []
    if batch_rows:
        conn.execute(sa.insert(cells), batch_rows)


def downgrade() -> None:
    op.get_bind().execute(sa.delete(cells).where(cells.c.subset != "all"))
    with op.batch_alter_table("leaderboard_cells") as batch:
        batch.drop_constraint(CONSTRAINT, type_="unique")
        batch.create_unique_constraint(CONSTRAINT, list(CONFIG))
        batch.drop_column("subset")
