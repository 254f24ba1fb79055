"""leaderboard_cells.marks: where a config's runs stand, so a rank never counts a whole group

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-04

A page of every run sorted by anything but throughput shows each run's rank: one plus the faster
runs of its group, which an index can only count by reading them — at a million runs a read of
up to 117,000 entries per group on the page, 250–350 ms of a 450 ms page. Each cell now keeps
32 marks over its runs ([throughput, runs faster]; `backend.store.leaderboard.rank_marks`),
rewritten with the cell, so a run's rank is the marks above it plus a count of at most 1/32 of
each config. Backfilled here from the entries in one ordered pass, with ingest's rule
(`subset_cells`). The count between a run and the next mark is an index range: the config index
takes its throughput as a key column (it was carried in the index only). The downgrade drops the
column and puts the index back as it was.
"""

from typing import Any

import sqlalchemy as sa
from alembic import op

from backend.store.leaderboard import grouped_by_config, runs_by_config, subset_cells

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None

BATCH = 5000
CONFIG = ("workload_key", "hardware_key", "strategy", "world_size")
CONFIG_INDEX = "ix_leaderboard_entries_config"
CARRIED = ["id", "model", "source", "branch", "user_id"]
"""What the config index carries besides its key (Postgres: migration 0013)."""

entries = sa.table(
    "leaderboard_entries",
    sa.column("id", sa.String),
    sa.column("tokens_per_s", sa.Float),
    sa.column("checks_failed", sa.String),
    sa.column("checks_stated", sa.String),
    *(sa.column(c) for c in CONFIG),
)
cells = sa.table("leaderboard_cells", sa.column("subset", sa.String), sa.column("marks", sa.JSON), *(sa.column(c) for c in CONFIG))


def _config_index(keyed_speed: bool) -> None:
    """The config index with its throughput as a key column, or carried (as 0013 left it)."""
    postgres = op.get_bind().dialect.name == "postgresql"
    op.drop_index(CONFIG_INDEX, table_name="leaderboard_entries")
    key = [*CONFIG, *(["tokens_per_s"] if keyed_speed else [])]
    carried = CARRIED if keyed_speed else ["tokens_per_s", *CARRIED]
    op.create_index(CONFIG_INDEX, "leaderboard_entries", key, postgresql_include=carried if postgres else [])


def upgrade() -> None:
    _config_index(keyed_speed=True)
    with op.batch_alter_table("leaderboard_cells") as batch:
        batch.add_column(sa.Column("marks", sa.JSON(), nullable=True))
    conn = op.get_bind()
    rows = conn.execute(runs_by_config(entries, CONFIG))
    statement = (
        sa.update(cells)
        .where(*(cells.c[c].is_not_distinct_from(sa.bindparam(f"key_{c}")) for c in CONFIG), cells.c.subset == sa.bindparam("key_subset"))
        .values(marks=sa.bindparam("new_marks"))
    )
    updates: list[dict[str, Any]] = []
    for key, members in grouped_by_config(rows, len(CONFIG)):
        for cell in subset_cells([m[len(CONFIG) :] for m in members]):
            fixed = {f"key_{c}": v for c, v in zip(CONFIG, key, strict=True)}
            updates.append({**fixed, "key_subset": cell["subset"], "new_marks": cell["marks"]})
        if len(updates) >= BATCH:
            conn.execute(statement, updates)
            updates = []
    if updates:
        conn.execute(statement, updates)


def downgrade() -> None:
    with op.batch_alter_table("leaderboard_cells") as batch:
        batch.drop_column("marks")
    _config_index(keyed_speed=False)
