"""reference_curves: fp32 reference loss curves shared by the lab (issue 12)

Revision ID: 0011
Revises: 0007
Create Date: 2026-11-30

The first run of a workload used to pay for its single-process fp32 reference on every host (the
cache was a file per host). Workers now fetch the curve from this table into the host cache before
launching, and store the curve a run computed, once (insert on conflict do nothing).
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0011"
down_revision = "0007"
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    op.create_table(
        "reference_curves",
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("device", sa.String(length=16), nullable=False),
        sa.Column("model", sa.String(length=64), nullable=False),
        sa.Column("seed", sa.Integer(), nullable=False),
        sa.Column("steps", sa.Integer(), nullable=False),
        sa.Column("workload", JSON, nullable=False),
        sa.Column("loss", JSON, nullable=False),
        sa.Column("run_id", sa.String(length=32), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_reference_curves_run_id_runs"), ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("key", "device", name=op.f("pk_reference_curves")),
    )


def downgrade() -> None:
    op.drop_table("reference_curves")
