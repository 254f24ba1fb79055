"""leaderboard_entries: the group and config indexes carry the filter columns (issue 12)

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-30

The every-run board's planned sorts (by rank, by runs per config) and the per-row rank count read
a group's or a config's runs in throughput order, filtered by source, branch, user or a recipe
dimension. With only the key in the index, each filtered read fetched every heap row of the range
(or ANDed a bitmap of half the table); with the filter columns INCLUDEd it is an index-only scan.
Postgres only (SQLite has no INCLUDE: its indexes are left as they were).
"""

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


def _recreate(include: bool) -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for name, (columns, covered) in INDEXES.items():
        op.drop_index(name, table_name="leaderboard_entries")
        op.create_index(name, "leaderboard_entries", list(columns), postgresql_include=list(covered) if include else [])


def upgrade() -> None:
    _recreate(include=True)


def downgrade() -> None:
    _recreate(include=False)
