"""leaderboard stragglers: each entry carries its run's straggler flag, and each cell its config's
straggler counts, so a leaderboard page flags its rows from the cells it already reads

Revision ID: 0029
Revises: 0028
Create Date: 2026-12-06

The leaderboard's "⚑ k of n runs had a straggler" was counted per request from `runs`: an OR of
one condition per config on the page over a table with no index on the config, so every page
scanned the runs (0.4 s at 100,000 runs). Here `leaderboard_entries.straggler` copies
`runs.straggler` (ingest's `follow_run` copies every entry column from its run), and
`leaderboard_cells.straggler_runs` / `straggler_analysed` hold, per config, its ranked runs with a
rank named and those the analysis covered — maintained with the cell's other figures under the
config's lock. Both are backfilled here from the runs, one statement each.
"""

import sqlalchemy as sa
from alembic import op

revision = "0029"
down_revision = "0028"
branch_labels = None
depends_on = None

CONFIG = ("workload_key", "hardware_key", "strategy", "world_size", "strategy_options")
"""A config's key at this revision."""


def upgrade() -> None:
    op.add_column("leaderboard_entries", sa.Column("straggler", sa.Boolean(), nullable=True))
    op.add_column("leaderboard_cells", sa.Column("straggler_runs", sa.Integer(), nullable=False, server_default="0"))
    op.add_column("leaderboard_cells", sa.Column("straggler_analysed", sa.Integer(), nullable=False, server_default="0"))
    conn = op.get_bind()
    runs = sa.table("runs", sa.column("id", sa.String), sa.column("straggler", sa.Boolean))
    entry_cols = [sa.column(c) for c in CONFIG]
    entries = sa.table("leaderboard_entries", sa.column("id", sa.String), sa.column("straggler", sa.Boolean), *entry_cols)
    cells = sa.table(
        "leaderboard_cells",
        *(sa.column(c) for c in CONFIG),
        sa.column("straggler_runs", sa.Integer),
        sa.column("straggler_analysed", sa.Integer),
    )
    flagged = sa.select(runs.c.straggler).where(runs.c.id == entries.c.id).scalar_subquery()
    conn.execute(sa.update(entries).values(straggler=flagged))
    counted = (
        sa.select(
            *(entries.c[c] for c in CONFIG),
            sa.func.sum(sa.case((entries.c.straggler.is_(True), 1), else_=0)).label("named"),
            sa.func.count(entries.c.straggler).label("analysed"),
        )
        .where(entries.c.straggler.is_not(None))
        .group_by(*(entries.c[c] for c in CONFIG))
        .subquery()
    )
    same = [cells.c[c] == counted.c[c] if c != "hardware_key" else cells.c[c].is_not_distinct_from(counted.c[c]) for c in CONFIG]
    conn.execute(sa.update(cells).where(*same).values(straggler_runs=counted.c.named, straggler_analysed=counted.c.analysed))


def downgrade() -> None:
    op.drop_column("leaderboard_cells", "straggler_analysed")
    op.drop_column("leaderboard_cells", "straggler_runs")
    op.drop_column("leaderboard_entries", "straggler")
