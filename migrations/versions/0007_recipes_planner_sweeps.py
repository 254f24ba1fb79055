"""Recipe dimensions on runs, hardware profiles and sweeps (issue 14)

Revision ID: 0007
Revises: 0003
Create Date: 2026-11-30

- runs: precision, activation_checkpointing, grad_accumulation_steps, micro_batch_size (the
  leaderboard and compare filters), shape_key (the workload key without the recipe: ranking
  across recipes) and sweep_id (the sweep a run was queued by).
- hardware_profiles: what a `calibrate` run measured on a pool; the planner uses the latest.
- sweeps: a planned set of runs and the prediction that chose each.
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0007"
down_revision = "0003"
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    op.create_table(
        "sweeps",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("model", sa.String(length=64), nullable=False),
        sa.Column("world_size", sa.Integer(), nullable=False),
        sa.Column("request", JSON, nullable=False),
        sa.Column("hardware", JSON, nullable=False),
        sa.Column("candidates", JSON, nullable=False),
        sa.Column("planned", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sweeps")),
    )
    op.create_index(op.f("ix_sweeps_status"), "sweeps", ["status"])
    op.create_index(op.f("ix_sweeps_created_at"), "sweeps", ["created_at"])
    op.create_table(
        "hardware_profiles",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("pool", sa.String(length=100), nullable=False),
        sa.Column("hardware_key", sa.String(length=200), nullable=False),
        sa.Column("device_kind", sa.String(length=16), nullable=False),
        sa.Column("device_name", sa.String(length=200), nullable=True),
        sa.Column("world_size", sa.Integer(), nullable=False),
        sa.Column("profile", JSON, nullable=False),
        sa.Column("run_id", sa.String(length=32), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_hardware_profiles_run_id_runs"), ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_hardware_profiles")),
    )
    op.create_index(op.f("ix_hardware_profiles_pool"), "hardware_profiles", ["pool"])
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("precision", sa.String(length=8), nullable=True))
        batch.add_column(sa.Column("activation_checkpointing", sa.String(length=16), nullable=True))
        batch.add_column(sa.Column("grad_accumulation_steps", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("micro_batch_size", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("sweep_id", sa.String(length=32), nullable=True))
        batch.add_column(sa.Column("shape_key", sa.String(length=64), nullable=True))
        batch.create_foreign_key(op.f("fk_runs_sweep_id_sweeps"), "sweeps", ["sweep_id"], ["id"], ondelete="SET NULL")
        batch.create_index(op.f("ix_runs_sweep_id"), ["sweep_id"])
        batch.create_index("ix_runs_shape_group", ["shape_key", "hardware_key", "tokens_per_s"])


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_index("ix_runs_shape_group")
        batch.drop_index(op.f("ix_runs_sweep_id"))
        batch.drop_constraint(op.f("fk_runs_sweep_id_sweeps"), type_="foreignkey")
        for column in ("shape_key", "sweep_id", "micro_batch_size", "grad_accumulation_steps", "activation_checkpointing", "precision"):
            batch.drop_column(column)
    op.drop_index(op.f("ix_hardware_profiles_pool"), table_name="hardware_profiles")
    op.drop_table("hardware_profiles")
    op.drop_index(op.f("ix_sweeps_created_at"), table_name="sweeps")
    op.drop_index(op.f("ix_sweeps_status"), table_name="sweeps")
    op.drop_table("sweeps")
