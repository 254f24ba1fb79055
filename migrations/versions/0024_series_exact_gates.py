"""series_counters and series_accepts: exact gates on counters that do not vary from run to run

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-06

Each result on a series keeps its exact counters (bytes and calls per collective and group
size, model state per rank, traced activations, parameter count, pipeline actions) and how they
differ from the baseline series' latest result of the same config; a series' family keeps the
changes its owner accepted as intended. New tables only: the downgrade drops them.
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "series_counters",
        sa.Column("run_id", sa.String(length=32), nullable=False),
        sa.Column("series_id", sa.String(length=32), nullable=False),
        sa.Column("config_key", sa.String(length=64), nullable=False),
        sa.Column("counters", JSON, nullable=False),
        sa.Column("baseline_run_id", sa.String(length=32), nullable=True),
        sa.Column("changes", JSON, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_series_counters_run_id_runs"), ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["series_id"], ["series.id"], name=op.f("fk_series_counters_series_id_series"), ondelete="CASCADE"),
        sa.ForeignKeyConstraint(
            ["baseline_run_id"], ["runs.id"], name=op.f("fk_series_counters_baseline_run_id_runs"), ondelete="SET NULL"
        ),
        sa.PrimaryKeyConstraint("run_id", name=op.f("pk_series_counters")),
    )
    op.create_index("ix_series_counters_series_config", "series_counters", ["series_id", "config_key", "created_at"], unique=False)
    op.create_table(
        "series_accepts",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("family", sa.String(length=32), nullable=False),
        sa.Column("series_id", sa.String(length=32), nullable=False),
        sa.Column("counter", sa.String(length=200), nullable=False),
        sa.Column("value", sa.Float(), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["series_id"], ["series.id"], name=op.f("fk_series_accepts_series_id_series"), ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], name=op.f("fk_series_accepts_user_id_users"), ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_series_accepts")),
        sa.UniqueConstraint("family", "counter", "value", name="uq_series_accepts_family_counter_value"),
    )
    op.create_index(op.f("ix_series_accepts_family"), "series_accepts", ["family"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_series_accepts_family"), table_name="series_accepts")
    op.drop_table("series_accepts")
    op.drop_index("ix_series_counters_series_config", table_name="series_counters")
    op.drop_table("series_counters")
