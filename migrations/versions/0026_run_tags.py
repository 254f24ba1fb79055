"""run_tags: a run's tags as rows, so the runs list filters by tag with an index and the run page
edits them

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-06

A run's tags were only in its stored spec (JSON): no list could filter on them without reading
every spec, and nothing could change them after the submit. Each tag is now a row (run, tag),
written when the run is stored (from its spec's tags) and by the run page's edit; backfilled here
from the specs. The spec keeps the tags it was submitted with.
"""

import json
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None

BATCH = 5000


def upgrade() -> None:
    op.create_table(
        "run_tags",
        sa.Column("run_id", sa.String(32), sa.ForeignKey("runs.id", ondelete="CASCADE", name="fk_run_tags_run_id_runs"), nullable=False),
        sa.Column("tag", sa.String(64), nullable=False),
        sa.PrimaryKeyConstraint("run_id", "tag", name="pk_run_tags"),
    )
    op.create_index("ix_run_tags_tag", "run_tags", ["tag"])
    conn = op.get_bind()
    tags = sa.table("run_tags", sa.column("run_id", sa.String), sa.column("tag", sa.String))
    runs = sa.table("runs", sa.column("id", sa.String), sa.column("spec", sa.JSON))
    rows: list[dict[str, Any]] = []
    for run_id, spec in conn.execute(sa.select(runs.c.id, runs.c.spec)):
        if isinstance(spec, str):
            spec = json.loads(spec)
        for tag in dict.fromkeys((spec or {}).get("tags") or []):
            if isinstance(tag, str) and 0 < len(tag) <= 64:
                rows.append({"run_id": run_id, "tag": tag})
        if len(rows) >= BATCH:
            conn.execute(tags.insert(), rows)
            rows = []
    if rows:
        conn.execute(tags.insert(), rows)


def downgrade() -> None:
    op.drop_index("ix_run_tags_tag", table_name="run_tags")
    op.drop_table("run_tags")
