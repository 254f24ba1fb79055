"""runs.idempotency_body_sha256: what an Idempotency-Key was first used with (issue #10)

Revision ID: 0003
Revises: 0006
Create Date: 2026-12-01

A repeated `Idempotency-Key` returns the run stored with it only when the body is the same
document; a different body under the same key is refused (409). The hash of the first body is
kept beside the key. Runs stored before this migration have none and replay as before.
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("idempotency_body_sha256", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("idempotency_body_sha256")
