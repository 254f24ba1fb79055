"""leaderboard_entries: the leaderboard's maintained table, one narrow row per ranked run (issue 12)

Revision ID: 0010
Revises: 0007
Create Date: 2026-11-30

A run is ranked when it succeeded with a throughput and a workload key. Its row copies the
columns the leaderboard shows, filters and sorts on; ingest writes it in the run's own
transaction, and it goes with the run. Backfilled here from the runs already stored.
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0007"
branch_labels = None
depends_on = None

COLUMNS = (
    "id",
    "name",
    "model",
    "strategy",
    "world_size",
    "workload_key",
    "hardware_key",
    "shape_key",
    "tokens_per_s",
    "mfu",
    "peak_allocated_bytes_max",
    "step_time_median_s",
    "comm_time_fraction",
    "exposed_comm_fraction",
    "loss_max_rel_diff",
    "source",
    "branch",
    "commit",
    "created_at",
    "user_id",
    "precision",
    "activation_checkpointing",
    "grad_accumulation_steps",
    "micro_batch_size",
)


def upgrade() -> None:
    op.create_table(
        "leaderboard_entries",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("name", sa.String(200), nullable=True),
        sa.Column("model", sa.String(64), nullable=False),
        sa.Column("strategy", sa.String(32), nullable=False),
        sa.Column("world_size", sa.Integer(), nullable=False),
        sa.Column("workload_key", sa.String(64), nullable=False),
        sa.Column("hardware_key", sa.String(200), nullable=True),
        sa.Column("shape_key", sa.String(64), nullable=True),
        sa.Column("tokens_per_s", sa.Float(), nullable=False),
        sa.Column("mfu", sa.Float(), nullable=True),
        sa.Column("peak_allocated_bytes_max", sa.BigInteger(), nullable=True),
        sa.Column("step_time_median_s", sa.Float(), nullable=True),
        sa.Column("comm_time_fraction", sa.Float(), nullable=True),
        sa.Column("exposed_comm_fraction", sa.Float(), nullable=True),
        sa.Column("loss_max_rel_diff", sa.Float(), nullable=True),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("branch", sa.String(200), nullable=True),
        sa.Column("commit", sa.String(80), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=True),
        sa.Column("precision", sa.String(8), nullable=True),
        sa.Column("activation_checkpointing", sa.String(16), nullable=True),
        sa.Column("grad_accumulation_steps", sa.Integer(), nullable=True),
        sa.Column("micro_batch_size", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(["id"], ["runs.id"], name=op.f("fk_leaderboard_entries_id_runs"), ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], name=op.f("fk_leaderboard_entries_user_id_users"), ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_leaderboard_entries")),
    )
    columns = ", ".join(f'"{c}"' for c in COLUMNS)
    op.execute(
        f"INSERT INTO leaderboard_entries ({columns}) SELECT {columns} FROM runs "
        "WHERE status = 'succeeded' AND tokens_per_s IS NOT NULL AND workload_key IS NOT NULL"
    )
    op.create_index("ix_leaderboard_entries_workload", "leaderboard_entries", ["workload_key", "hardware_key", "tokens_per_s"])
    op.create_index("ix_leaderboard_entries_shape", "leaderboard_entries", ["shape_key", "hardware_key", "tokens_per_s"])
    op.create_index("ix_leaderboard_entries_config", "leaderboard_entries", ["workload_key", "hardware_key", "strategy", "world_size"])
    op.create_index("ix_leaderboard_entries_user", "leaderboard_entries", ["user_id"])


def downgrade() -> None:
    op.drop_table("leaderboard_entries")
