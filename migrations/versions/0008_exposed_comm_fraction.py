"""runs.exposed_comm_fraction: the leaderboard's exposed-communication column (issue #9)

Revision ID: 0008
Revises: 0004
Create Date: 2026-12-07

Communication that no compute overlaps, as a fraction of the step (the summary's
`exposed_comm_fraction`, max over ranks), denormalised onto `runs` at ingest so the leaderboard
sorts on it without loading result documents. Null for runs stored before it was measured.
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("exposed_comm_fraction", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("exposed_comm_fraction")
