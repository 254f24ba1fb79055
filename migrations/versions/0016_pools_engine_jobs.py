"""declared pools (kind slurm) and the runs an outside scheduler holds

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-01

`pools`: a pool an admin declares with its settings (a Slurm pool's partition, account, QoS, GPUs
per node, time limit, Python environment and run directory on the cluster). `engine_jobs`: one row
per run submitted to a scheduler, with the scheduler's job id, its last seen state and reason,
node list and output file — what the agent (or a restarted one) watches.
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    op.create_table(
        "pools",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("settings", JSON, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_pools")),
    )
    op.create_table(
        "engine_jobs",
        sa.Column("run_id", sa.String(length=32), nullable=False),
        sa.Column("engine", sa.String(length=16), nullable=False),
        sa.Column("pool", sa.String(length=64), nullable=False),
        sa.Column("job_id", sa.String(length=64), nullable=False),
        sa.Column("state", sa.String(length=32), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("nodes", sa.String(length=1000), nullable=True),
        sa.Column("output", sa.String(length=1000), nullable=True),
        sa.Column("submitted_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished", sa.Boolean(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_engine_jobs_run_id_runs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", name=op.f("pk_engine_jobs")),
    )
    with op.batch_alter_table("engine_jobs") as batch:
        batch.create_index(batch.f("ix_engine_jobs_pool"), ["pool"], unique=False)


def downgrade() -> None:
    op.drop_table("engine_jobs")
    op.drop_table("pools")
