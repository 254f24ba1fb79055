"""runs: a series' latest runs by one index range (issue 12)

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-30

Judging a CI upload reads its series' latest window + 1 runs (`store.series.latest_values`). With
only `series_id` indexed, that read every run of the series and sorted them: it grew with the
series (about 0.5 ms at 1,000 results). (series_id, created_at, id) answers it from the newest
end; it also serves what the single-column index did (the foreign key's look-ups).
"""

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch_op:
        batch_op.drop_index("ix_runs_series_id")
        batch_op.create_index("ix_runs_series_created", ["series_id", "created_at", "id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch_op:
        batch_op.drop_index("ix_runs_series_created")
        batch_op.create_index("ix_runs_series_id", ["series_id"], unique=False)
