"""leaderboard_cells.marks: 256 marks a cell, each with its position, so most ranks count no runs

Revision ID: 0030
Revises: 0029
Create Date: 2026-12-06

A run's rank on an every-run page was the marks above it plus, for each config of its group, a
count of the runs between it and the config's next mark: about 545 index ranges for a page of 50
runs at 100,000 runs, the largest SQL cost of those pages. A cell now keeps up to 256 marks
(`backend.store.leaderboard.rank_marks`: [throughput, runs faster, position]); where a mark's
position follows the one below it no run lies between them, and the runs faster than a run there
are known from the position alone — every mark of a config of up to 256 runs. Rewritten here from
the entries in one ordered pass, with ingest's rule (`subset_cells`). The downgrade keeps the
marks and drops their positions (the reader of revision 0029 reads [throughput, runs faster]).
"""

from typing import Any

import sqlalchemy as sa
from alembic import op

from backend.store.leaderboard import grouped_by_config, runs_by_config, subset_cells

revision = "0030"
down_revision = "0029"
branch_labels = None
depends_on = None

BATCH = 5000
CONFIG = ("workload_key", "hardware_key", "strategy", "world_size", "strategy_options")
"""A config's key at this revision."""

entries = sa.table(
    "leaderboard_entries",
    sa.column("id", sa.String),
    sa.column("tokens_per_s", sa.Float),
    sa.column("checks_failed", sa.String),
    sa.column("checks_stated", sa.String),
    *(sa.column(c) for c in CONFIG),
)
cells = sa.table(
    "leaderboard_cells",
    sa.column("id", sa.Integer),
    sa.column("subset", sa.String),
    sa.column("marks", sa.JSON),
    *(sa.column(c) for c in CONFIG),
)


def upgrade() -> None:
    conn = op.get_bind()
    statement = (
        sa.update(cells)
        .where(*(cells.c[c].is_not_distinct_from(sa.bindparam(f"key_{c}")) for c in CONFIG), cells.c.subset == sa.bindparam("key_subset"))
        .values(marks=sa.bindparam("new_marks"))
    )
    updates: list[dict[str, Any]] = []
    for key, members in grouped_by_config(conn.execute(runs_by_config(entries, CONFIG)), len(CONFIG)):
        fixed = {f"key_{c}": v for c, v in zip(CONFIG, key, strict=True)}
        for cell in subset_cells([m[len(CONFIG) :] for m in members]):
            updates.append({**fixed, "key_subset": cell["subset"], "new_marks": cell["marks"]})
        if len(updates) >= BATCH:
            conn.execute(statement, updates)
            updates = []
    if updates:
        conn.execute(statement, updates)


def downgrade() -> None:
    conn = op.get_bind()
    statement = sa.update(cells).where(cells.c.id == sa.bindparam("cell_id")).values(marks=sa.bindparam("new_marks"))
    updates = [
        {"cell_id": cell_id, "new_marks": [m[:2] for m in marks]}
        for cell_id, marks in conn.execute(sa.select(cells.c.id, cells.c.marks).where(cells.c.marks.is_not(None)))
    ]
    for start in range(0, len(updates), BATCH):
        conn.execute(statement, updates[start : start + BATCH])
