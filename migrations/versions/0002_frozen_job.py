"""runs.job: the resolved job, frozen at submission

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30

A run's job is resolved once, when it is submitted; the worker and the ranks read this frozen copy
instead of resolving the spec again. CI uploads have none (null).
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("job", sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("job")
