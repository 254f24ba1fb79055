"""series: an owner — the user whose upload started the series (ownership on every write)

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-01

Changing a series' test, window, baseline or thresholds, or dismissing one of its alerts, is for
its owner or an admin. The owner is the user whose upload created it; a series made before this
migration is given the uploader of its oldest result that has one. A series without any (made by
an ownerless token) can be changed by admins only.
"""

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("series") as batch_op:
        batch_op.add_column(sa.Column("user_id", sa.Integer(), nullable=True))
        batch_op.create_foreign_key(batch_op.f("fk_series_user_id_users"), "users", ["user_id"], ["id"], ondelete="SET NULL")
    op.execute(
        "UPDATE series SET user_id = (SELECT runs.user_id FROM runs WHERE runs.series_id = series.id AND runs.user_id IS NOT NULL "
        "ORDER BY runs.created_at, runs.id LIMIT 1)"
    )


def downgrade() -> None:
    with op.batch_alter_table("series") as batch_op:
        batch_op.drop_constraint(batch_op.f("fk_series_user_id_users"), type_="foreignkey")
        batch_op.drop_column("user_id")
