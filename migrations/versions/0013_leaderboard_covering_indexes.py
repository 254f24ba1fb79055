"""leaderboard_entries: the group and config indexes carry the filter columns (issue 12)

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-30

The every-run board's planned sorts (by rank, by runs per config) and the per-row rank count read
a group's or a config's runs in throughput order, filtered by source, branch, user or a recipe
dimension. With only the key in the index, each filtered read fetched every heap row of the range
(or ANDed a bitmap of half the table); with the filter columns INCLUDEd it is an index-only scan.
The sort indexes of 0010 and 0012 carry the shape and recipe columns the same way: grouped by
shape, a deep page of every run sorted by a metric read 50,000 heap rows to order its ties.
Postgres only (SQLite has no INCLUDE: its indexes are left as they were).
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

FILTERED = (
    "id",
    "model",
    "strategy",
    "world_size",
    "source",
    "branch",
    "user_id",
    "precision",
    "activation_checkpointing",
    "grad_accumulation_steps",
    "micro_batch_size",
)
INDEXES = {
    "ix_leaderboard_entries_workload": (("workload_key", "hardware_key", "tokens_per_s"), FILTERED),
    "ix_leaderboard_entries_shape": (("shape_key", "hardware_key", "tokens_per_s"), FILTERED),
    "ix_leaderboard_entries_config": (
        ("workload_key", "hardware_key", "strategy", "world_size"),
        ("tokens_per_s", "id", "model", "source", "branch", "user_id"),
    ),
}


GROUPED = ("shape_key", "precision", "activation_checkpointing", "grad_accumulation_steps", "micro_batch_size")
SORTED_COLUMNS = (  # 0010's and 0012's sort indexes
    "tokens_per_s",
    "mfu",
    "step_time_median_s",
    "peak_allocated_bytes_max",
    "comm_time_fraction",
    "exposed_comm_fraction",
    "loss_max_rel_diff",
    "created_at",
    "strategy",
    "precision",
    "source",
    "branch",
)


def _recreate(include: bool) -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for name, (columns, covered) in INDEXES.items():
        op.drop_index(name, table_name="leaderboard_entries")
        op.create_index(name, "leaderboard_entries", list(columns), postgresql_include=list(covered) if include else [])
    # a sort index in the board's whole order, carrying the grouping columns: a page of every run
    # grouped by shape or a recipe dimension sorts ties after the model without a heap fetch
    for column in SORTED_COLUMNS:
        tail = ["model", "workload_key", "hardware_key", *([sa.text("tokens_per_s DESC")] if column != "tokens_per_s" else []), "id"]
        covered = [c for c in GROUPED if c != column] if include else []
        for direction in ("desc", "asc"):
            name = f"ix_leaderboard_entries_{column}_{direction}"
            op.drop_index(name, table_name="leaderboard_entries")
            order = sa.text(f"{column} {direction.upper()} NULLS LAST")
            op.create_index(name, "leaderboard_entries", [order, *tail], postgresql_include=covered)


def upgrade() -> None:
    _recreate(include=True)


def downgrade() -> None:
    _recreate(include=False)
