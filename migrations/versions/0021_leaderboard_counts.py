"""leaderboard_counts: a config's runs counted per source, branch, uploader and check outcome

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-04

A page of every run sorted by rank or by runs per config is planned from the sizes of its groups
and configs, and every page shows its total. Under a filter the cells do not hold (source,
branch, uploader) those were counts of the runs the filter keeps: at 1,000,000 runs two scans of
a third of the entries, 211 ms and 238 ms of a 471 ms page (p50, load average 2).
`leaderboard_counts` keeps, per config, how many runs share each (source, branch, uploader, checks failed, checks stated) — a few
thousand rows for a million runs — rewritten with the config's cells in the run's transaction,
so every size is a sum over them. Derived from the entries here (`counts_of`, the rule ingest
uses); the downgrade drops it.
"""

import sqlalchemy as sa
from alembic import op

from backend.store.leaderboard import counts_of

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

COUNT_KEY = (
    *("workload_key", "hardware_key", "strategy", "world_size"),
    *("model", "shape_key", "precision", "activation_checkpointing", "grad_accumulation_steps", "micro_batch_size"),
    *("source", "branch", "user_id", "checks_failed", "checks_stated"),
)
"""What a counts row counted at this revision (a config, its attributes, the run's filtered columns)."""
entries = sa.table("leaderboard_entries", *(sa.column(c) for c in COUNT_KEY))


def upgrade() -> None:
    counts = op.create_table(
        "leaderboard_counts",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("workload_key", sa.String(64), nullable=False),
        sa.Column("hardware_key", sa.String(200), nullable=True),
        sa.Column("strategy", sa.String(32), nullable=False),
        sa.Column("world_size", sa.Integer(), nullable=False),
        sa.Column("model", sa.String(64), nullable=False),
        sa.Column("shape_key", sa.String(64), nullable=True),
        sa.Column("precision", sa.String(8), nullable=True),
        sa.Column("activation_checkpointing", sa.String(16), nullable=True),
        sa.Column("grad_accumulation_steps", sa.Integer(), nullable=True),
        sa.Column("micro_batch_size", sa.Integer(), nullable=True),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("branch", sa.String(200), nullable=True),
        sa.Column("user_id", sa.Integer(), nullable=True),
        sa.Column("checks_failed", sa.String(64), nullable=True),
        sa.Column("checks_stated", sa.String(64), nullable=True),
        sa.Column("runs", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_leaderboard_counts")),
    )
    op.create_index("ix_leaderboard_counts_config", "leaderboard_counts", ["workload_key", "hardware_key", "strategy", "world_size"])
    op.get_bind().execute(sa.insert(counts).from_select([*COUNT_KEY, "runs"], counts_of(entries, count_key=COUNT_KEY)))


def downgrade() -> None:
    op.drop_index("ix_leaderboard_counts_config", table_name="leaderboard_counts")
    op.drop_table("leaderboard_counts")
