"""runs.reproduces_id: a lab run that re-ran an uploaded configuration, linked to the upload

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-06

An upload is never verified: the lab did not run it. `POST /api/v1/runs/{id}/reproduce` queues the
upload's own job spec on a pool; the new run (a worker's, so verified) points at the upload it
reproduces, and both pages put measured against stated (`backend.services.reproduce`). Nothing is
derived from stored data: the column starts empty, and the downgrade drops only it.
"""

import sqlalchemy as sa
from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch_op:
        batch_op.add_column(sa.Column("reproduces_id", sa.String(32), nullable=True))
        batch_op.create_foreign_key(batch_op.f("fk_runs_reproduces_id_runs"), "runs", ["reproduces_id"], ["id"], ondelete="SET NULL")
        batch_op.create_index(batch_op.f("ix_runs_reproduces_id"), ["reproduces_id"])


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch_op:
        batch_op.drop_index(batch_op.f("ix_runs_reproduces_id"))
        batch_op.drop_constraint(batch_op.f("fk_runs_reproduces_id_runs"), type_="foreignkey")
        batch_op.drop_column("reproduces_id")
