"""accounts, login sessions, token owners, CI series and their verdicts (issue #11)

Revision ID: 0004
Revises: 0002
Create Date: 2026-11-30

Users with a role and their login sessions; each API token gets an owner (null for tokens made
before accounts), a display prefix and its last use; each run records who submitted or uploaded
it, its CI series and the rest of its CI metadata; series and the verdicts of their results.
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0004"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "series",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("family", sa.String(length=32), nullable=False),
        sa.Column("repository", sa.String(length=500), nullable=True),
        sa.Column("branch", sa.String(length=200), nullable=False),
        sa.Column("workload_key", sa.String(length=64), nullable=False),
        sa.Column("hardware_key", sa.String(length=200), nullable=False),
        sa.Column("strategy", sa.String(length=32), nullable=False),
        sa.Column("world_size", sa.Integer(), nullable=False),
        sa.Column("options", sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"), nullable=False),
        sa.Column("model", sa.String(length=64), nullable=False),
        sa.Column("label", sa.String(length=300), nullable=False),
        sa.Column("test", sa.String(length=16), nullable=False),
        sa.Column("window", sa.Integer(), nullable=False),
        sa.Column("baseline_branch", sa.String(length=200), nullable=False),
        sa.Column("alpha", sa.Float(), nullable=False),
        sa.Column("mad_k", sa.Float(), nullable=False),
        sa.Column("min_change", sa.Float(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_series")),
    )
    with op.batch_alter_table("series", schema=None) as batch_op:
        batch_op.create_index("ix_series_family_branch", ["family", "branch"], unique=False)

    op.create_table(
        "users",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("email", sa.String(length=320), nullable=False),
        sa.Column("password_hash", sa.String(length=255), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("disabled", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_login_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_users")),
        sa.UniqueConstraint("email", name=op.f("uq_users_email")),
    )
    op.create_table(
        "user_sessions",
        sa.Column("id_hash", sa.String(length=64), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], name=op.f("fk_user_sessions_user_id_users"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id_hash", name=op.f("pk_user_sessions")),
    )
    with op.batch_alter_table("user_sessions", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_user_sessions_user_id"), ["user_id"], unique=False)

    op.create_table(
        "series_verdicts",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("series_id", sa.String(length=32), nullable=False),
        sa.Column("run_id", sa.String(length=32), nullable=False),
        sa.Column("metric", sa.String(length=32), nullable=False),
        sa.Column("value", sa.Float(), nullable=False),
        sa.Column("verdict", sa.String(length=16), nullable=False),
        sa.Column("change", sa.Float(), nullable=True),
        sa.Column("baseline_center", sa.Float(), nullable=True),
        sa.Column("lower", sa.Float(), nullable=True),
        sa.Column("upper", sa.Float(), nullable=True),
        sa.Column("baseline_n", sa.Integer(), nullable=False),
        sa.Column("baseline_branch", sa.String(length=200), nullable=False),
        sa.Column("test", sa.String(length=16), nullable=False),
        sa.Column("threshold", sa.Float(), nullable=False),
        sa.Column("p_value", sa.Float(), nullable=True),
        sa.Column("dismissed", sa.Boolean(), nullable=False),
        sa.Column("dismissed_by", sa.Integer(), nullable=True),
        sa.Column("dismissed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("dismiss_note", sa.String(length=500), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["dismissed_by"], ["users.id"], name=op.f("fk_series_verdicts_dismissed_by_users"), ondelete="SET NULL"),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_series_verdicts_run_id_runs"), ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["series_id"], ["series.id"], name=op.f("fk_series_verdicts_series_id_series"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_series_verdicts")),
        sa.UniqueConstraint("run_id", "metric", name="uq_series_verdicts_run_metric"),
    )
    with op.batch_alter_table("series_verdicts", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_series_verdicts_run_id"), ["run_id"], unique=False)
        batch_op.create_index("ix_series_verdicts_series_metric", ["series_id", "metric"], unique=False)

    with op.batch_alter_table("api_tokens", schema=None) as batch_op:
        batch_op.add_column(sa.Column("user_id", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("prefix", sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.create_index(batch_op.f("ix_api_tokens_user_id"), ["user_id"], unique=False)
        batch_op.create_foreign_key(batch_op.f("fk_api_tokens_user_id_users"), "users", ["user_id"], ["id"], ondelete="CASCADE")

    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("user_id", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("series_id", sa.String(length=32), nullable=True))
        batch_op.add_column(sa.Column("repository", sa.String(length=500), nullable=True))
        batch_op.add_column(sa.Column("pr", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("ci_url", sa.String(length=500), nullable=True))
        batch_op.create_index(batch_op.f("ix_runs_series_id"), ["series_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_runs_user_id"), ["user_id"], unique=False)
        batch_op.create_foreign_key(batch_op.f("fk_runs_series_id_series"), "series", ["series_id"], ["id"], ondelete="SET NULL")
        batch_op.create_foreign_key(batch_op.f("fk_runs_user_id_users"), "users", ["user_id"], ["id"], ondelete="SET NULL")


def downgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("fk_runs_user_id_users"), type_="foreignkey")
        batch_op.drop_constraint(batch_op.f("fk_runs_series_id_series"), type_="foreignkey")
        batch_op.drop_index(batch_op.f("ix_runs_user_id"))
        batch_op.drop_index(batch_op.f("ix_runs_series_id"))
        batch_op.drop_column("ci_url")
        batch_op.drop_column("pr")
        batch_op.drop_column("repository")
        batch_op.drop_column("series_id")
        batch_op.drop_column("user_id")

    with op.batch_alter_table("api_tokens", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("fk_api_tokens_user_id_users"), type_="foreignkey")
        batch_op.drop_index(batch_op.f("ix_api_tokens_user_id"))
        batch_op.drop_column("last_used_at")
        batch_op.drop_column("prefix")
        batch_op.drop_column("user_id")

    with op.batch_alter_table("series_verdicts", schema=None) as batch_op:
        batch_op.drop_index("ix_series_verdicts_series_metric")
        batch_op.drop_index(batch_op.f("ix_series_verdicts_run_id"))

    op.drop_table("series_verdicts")
    with op.batch_alter_table("user_sessions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_user_sessions_user_id"))

    op.drop_table("user_sessions")
    op.drop_table("users")
    with op.batch_alter_table("series", schema=None) as batch_op:
        batch_op.drop_index("ix_series_family_branch")

    op.drop_table("series")
