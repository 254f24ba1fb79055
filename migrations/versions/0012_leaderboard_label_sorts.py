"""leaderboard_entries: an index per direction for the every-run sorts by strategy, precision, source and branch (issue 12)

Revision ID: 0012
Revises: 0010
Create Date: 2026-11-30

Migration 0010 indexed the metric sorts in the board's whole order (the column, nulls last; then
model, workload, hardware, throughput descending, id); the label columns the board also sorts by
were a sort of every narrow row. These make a page of them, however deep, an index-only scan too.
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0010"
branch_labels = None
depends_on = None

LABEL_COLUMNS = ("strategy", "precision", "source", "branch")


def upgrade() -> None:
    tail = ["model", "workload_key", "hardware_key", sa.text("tokens_per_s DESC"), "id"]
    # SQLite has no NULLS LAST in an index: there the index serves the order up to the nulls
    nulls = " NULLS LAST" if op.get_bind().dialect.name == "postgresql" else ""
    for column in LABEL_COLUMNS:
        op.create_index(f"ix_leaderboard_entries_{column}_desc", "leaderboard_entries", [sa.text(f"{column} DESC{nulls}"), *tail])
        op.create_index(f"ix_leaderboard_entries_{column}_asc", "leaderboard_entries", [sa.text(f"{column} ASC{nulls}"), *tail])


def downgrade() -> None:
    for column in LABEL_COLUMNS:
        op.drop_index(f"ix_leaderboard_entries_{column}_asc", table_name="leaderboard_entries")
        op.drop_index(f"ix_leaderboard_entries_{column}_desc", table_name="leaderboard_entries")
