"""the fleet: workers, run nodes, and where a run runs (issues 10 and 13)

Revision ID: 0006
Revises: 0008
Create Date: 2026-11-30

Workers register and heartbeat (`workers`); a run's lease is its worker's heartbeat; a run's
hosts and their ranks' process groups are its `run_nodes` (one row per node, node 0 included).
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0006"
down_revision = "0008"
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("pool", sa.String(length=64), nullable=True))
        batch.add_column(sa.Column("worker_id", sa.String(length=32), nullable=True))
        batch.add_column(sa.Column("host", sa.String(length=200), nullable=True))
        batch.create_index(batch.f("ix_runs_pool"), ["pool"], unique=False)
    op.create_table(
        "workers",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("host", sa.String(length=200), nullable=False),
        sa.Column("machine", sa.String(length=200), nullable=False),
        sa.Column("address", sa.String(length=200), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("pool", sa.String(length=64), nullable=False),
        sa.Column("device", sa.String(length=16), nullable=False),
        sa.Column("device_name", sa.String(length=200), nullable=True),
        sa.Column("device_count", sa.Integer(), nullable=False),
        sa.Column("memory_per_device_bytes", sa.BigInteger(), nullable=True),
        sa.Column("interconnect", sa.String(length=32), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("run_id", sa.String(length=32), nullable=True),
        sa.Column("node_rank", sa.Integer(), nullable=True),
        sa.Column("reserved_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_workers_run_id_runs"), ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_workers")),
    )
    with op.batch_alter_table("workers") as batch:
        batch.create_index(batch.f("ix_workers_host"), ["host"], unique=False)
        batch.create_index(batch.f("ix_workers_pool"), ["pool"], unique=False)
        batch.create_index(batch.f("ix_workers_heartbeat_at"), ["heartbeat_at"], unique=False)
        batch.create_index(batch.f("ix_workers_run_id"), ["run_id"], unique=False)
    op.create_table(
        "run_nodes",
        sa.Column("run_id", sa.String(length=32), nullable=False),
        sa.Column("node_rank", sa.Integer(), nullable=False),
        sa.Column("worker_id", sa.String(length=32), nullable=False),
        sa.Column("host", sa.String(length=200), nullable=False),
        sa.Column("machine", sa.String(length=200), nullable=False),
        sa.Column("endpoint", sa.String(length=260), nullable=True),
        sa.Column("pgid", sa.Integer(), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("records", JSON, nullable=True),
        sa.Column("reserved_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_run_nodes_run_id_runs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", "node_rank", name=op.f("pk_run_nodes")),
    )
    with op.batch_alter_table("run_nodes") as batch:
        batch.create_index(batch.f("ix_run_nodes_worker_id"), ["worker_id"], unique=False)


def downgrade() -> None:
    op.drop_table("run_nodes")
    op.drop_table("workers")
    with op.batch_alter_table("runs") as batch:
        batch.drop_index(batch.f("ix_runs_pool"))
        batch.drop_column("host")
        batch.drop_column("worker_id")
        batch.drop_column("pool")
