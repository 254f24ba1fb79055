"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("scopes", sa.String(length=200), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_tokens")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_api_tokens_token_hash")),
    )
    op.create_table(
        "runs",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("spec", sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("progress", sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("idempotency_key", sa.String(length=200), nullable=True),
        sa.Column("strategy", sa.String(length=32), nullable=False),
        sa.Column("world_size", sa.Integer(), nullable=False),
        sa.Column("model", sa.String(length=64), nullable=False),
        sa.Column("workload_key", sa.String(length=64), nullable=True),
        sa.Column("hardware_key", sa.String(length=200), nullable=True),
        sa.Column("branch", sa.String(length=200), nullable=True),
        sa.Column("commit", sa.String(length=80), nullable=True),
        sa.Column("tokens_per_s", sa.Float(), nullable=True),
        sa.Column("step_time_median_s", sa.Float(), nullable=True),
        sa.Column("mfu", sa.Float(), nullable=True),
        sa.Column("peak_allocated_bytes_max", sa.BigInteger(), nullable=True),
        sa.Column("comm_time_fraction", sa.Float(), nullable=True),
        sa.Column("loss_max_rel_diff", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runs")),
        sa.UniqueConstraint("idempotency_key", name=op.f("uq_runs_idempotency_key")),
    )
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_runs_created_at"), ["created_at"], unique=False)
        batch_op.create_index("ix_runs_leaderboard", ["workload_key", "hardware_key", "tokens_per_s"], unique=False)
        batch_op.create_index(batch_op.f("ix_runs_model"), ["model"], unique=False)
        batch_op.create_index(batch_op.f("ix_runs_source"), ["source"], unique=False)
        batch_op.create_index(batch_op.f("ix_runs_status"), ["status"], unique=False)
        batch_op.create_index("ix_runs_status_created", ["status", "created_at"], unique=False)
        batch_op.create_index(batch_op.f("ix_runs_strategy"), ["strategy"], unique=False)

    op.create_table(
        "comm_metrics",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.String(length=32), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("op", sa.String(length=32), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("time_s", sa.Float(), nullable=False),
        sa.Column("busbw_gbps", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_comm_metrics_run_id_runs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_comm_metrics")),
    )
    with op.batch_alter_table("comm_metrics", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_comm_metrics_run_id"), ["run_id"], unique=False)

    op.create_table(
        "rank_metrics",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.String(length=32), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("params_bytes", sa.BigInteger(), nullable=False),
        sa.Column("grads_bytes", sa.BigInteger(), nullable=False),
        sa.Column("optimizer_bytes", sa.BigInteger(), nullable=False),
        sa.Column("peak_allocated_bytes", sa.BigInteger(), nullable=True),
        sa.Column("peak_rss_bytes", sa.BigInteger(), nullable=True),
        sa.Column("step_time_median_s", sa.Float(), nullable=True),
        sa.Column("comm_time_fraction", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_rank_metrics_run_id_runs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_rank_metrics")),
    )
    with op.batch_alter_table("rank_metrics", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_rank_metrics_run_id"), ["run_id"], unique=False)

    op.create_table(
        "run_results",
        sa.Column("run_id", sa.String(length=32), nullable=False),
        sa.Column("schema_version", sa.Integer(), nullable=False),
        sa.Column("document", sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_run_results_run_id_runs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", name=op.f("pk_run_results")),
    )
    op.create_table(
        "run_traces",
        sa.Column("run_id", sa.String(length=32), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_run_traces_run_id_runs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", "rank", name=op.f("pk_run_traces")),
    )


def downgrade() -> None:
    op.drop_table("run_traces")
    op.drop_table("run_results")
    with op.batch_alter_table("rank_metrics", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_rank_metrics_run_id"))

    op.drop_table("rank_metrics")
    with op.batch_alter_table("comm_metrics", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_comm_metrics_run_id"))

    op.drop_table("comm_metrics")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_runs_strategy"))
        batch_op.drop_index("ix_runs_status_created")
        batch_op.drop_index(batch_op.f("ix_runs_status"))
        batch_op.drop_index(batch_op.f("ix_runs_source"))
        batch_op.drop_index(batch_op.f("ix_runs_model"))
        batch_op.drop_index("ix_runs_leaderboard")
        batch_op.drop_index(batch_op.f("ix_runs_created_at"))

    op.drop_table("runs")
    op.drop_table("api_tokens")
