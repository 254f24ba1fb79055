"""leaderboard_entries: the leaderboard's maintained table, one narrow row per ranked run (issue 12)

Revision ID: 0010
Revises: 0011
Create Date: 2026-11-30

A run is ranked when it succeeded with a throughput and a workload key. Its row copies the
columns the leaderboard shows, filters and sorts on; ingest writes it in the run's own
transaction, and it goes with the run. An index per sort and direction makes a deep page an
index-only scan. leaderboard_cells: per (workload, hardware, strategy, world size), its runs and
best throughput, recomputed with each change. Both backfilled here from the runs already stored.
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0011"
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

SORTED_COLUMNS = (
    "tokens_per_s",
    "mfu",
    "step_time_median_s",
    "peak_allocated_bytes_max",
    "comm_time_fraction",
    "exposed_comm_fraction",
    "loss_max_rel_diff",
    "created_at",
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
    op.create_index("ix_leaderboard_entries_source", "leaderboard_entries", ["source"])
    op.create_index("ix_leaderboard_entries_branch", "leaderboard_entries", ["branch"])
    op.create_index(
        "ix_leaderboard_entries_default",
        "leaderboard_entries",
        ["model", "workload_key", "hardware_key", sa.text("tokens_per_s DESC"), "id"],
    )
    tail = ["model", "workload_key", "hardware_key", sa.text("tokens_per_s DESC"), "id"]
    # SQLite has no NULLS LAST in an index: there the index serves the order up to the nulls
    nulls = " NULLS LAST" if op.get_bind().dialect.name == "postgresql" else ""
    for column in SORTED_COLUMNS:
        rest = tail if column != "tokens_per_s" else [c for c in tail if not isinstance(c, sa.TextClause)]  # tied on it already
        op.create_index(f"ix_leaderboard_entries_{column}_desc", "leaderboard_entries", [sa.text(f"{column} DESC{nulls}"), *rest])
        op.create_index(f"ix_leaderboard_entries_{column}_asc", "leaderboard_entries", [sa.text(f"{column} ASC{nulls}"), *rest])
    op.create_table(
        "leaderboard_cells",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("workload_key", sa.String(64), nullable=False),
        sa.Column("hardware_key", sa.String(200), nullable=True),
        sa.Column("strategy", sa.String(32), nullable=False),
        sa.Column("world_size", sa.Integer(), nullable=False),
        sa.Column("model", sa.String(64), nullable=False),
        sa.Column("shape_key", sa.String(64), nullable=True),
        sa.Column("precision", sa.String(8), nullable=True),
        sa.Column("activation_checkpointing", sa.String(16), nullable=True),
        sa.Column("grad_accumulation_steps", sa.Integer(), nullable=True),
        sa.Column("micro_batch_size", sa.Integer(), nullable=True),
        sa.Column("runs", sa.Integer(), nullable=False),
        sa.Column("best_tokens_per_s", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_leaderboard_cells")),
        sa.UniqueConstraint("workload_key", "hardware_key", "strategy", "world_size", name=op.f("uq_leaderboard_cells_workload_key")),
    )
    op.execute(
        "INSERT INTO leaderboard_cells (workload_key, hardware_key, strategy, world_size, model, shape_key, precision, "
        "activation_checkpointing, grad_accumulation_steps, micro_batch_size, runs, best_tokens_per_s) "
        "SELECT workload_key, hardware_key, strategy, world_size, min(model), min(shape_key), min(precision), "
        "min(activation_checkpointing), min(grad_accumulation_steps), min(micro_batch_size), count(*), max(tokens_per_s) "
        "FROM leaderboard_entries GROUP BY workload_key, hardware_key, strategy, world_size"
    )


def downgrade() -> None:
    op.drop_table("leaderboard_cells")
    op.drop_table("leaderboard_entries")
