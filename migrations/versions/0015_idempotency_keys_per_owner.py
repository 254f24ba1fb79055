"""runs: an Idempotency-Key is unique per owner, not across the lab

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-01

A key was unique across all users, so one team could take another's predictable keys (a CI job
named after its build number) and turn their uploads into 409s or replays of its own run. Each
key now belongs to the uploading token's user (`idempotency_owner`; 0 for a token without a
user): two users may use the same key, and a lookup never crosses owners. Stored keys keep
working: their owner is the run's uploader.
"""

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch_op:
        batch_op.add_column(sa.Column("idempotency_owner", sa.Integer(), nullable=True))
    op.execute("UPDATE runs SET idempotency_owner = COALESCE(user_id, 0) WHERE idempotency_key IS NOT NULL")
    with op.batch_alter_table("runs") as batch_op:
        batch_op.drop_constraint("uq_runs_idempotency_key", type_="unique")
        batch_op.create_unique_constraint("uq_runs_idempotency_owner_key", ["idempotency_owner", "idempotency_key"])


def downgrade() -> None:
    # Keys two owners share cannot both stay unique across the lab: the later runs lose theirs.
    op.execute(
        "UPDATE runs SET idempotency_key = NULL WHERE idempotency_key IS NOT NULL AND id NOT IN "
        "(SELECT MIN(id) FROM runs WHERE idempotency_key IS NOT NULL GROUP BY idempotency_key)"
    )
    with op.batch_alter_table("runs") as batch_op:
        batch_op.drop_constraint("uq_runs_idempotency_owner_key", type_="unique")
        batch_op.create_unique_constraint("uq_runs_idempotency_key", ["idempotency_key"])
        batch_op.drop_column("idempotency_owner")
