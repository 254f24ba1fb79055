"""run straggler flag: whether a rank of the run was named a straggler, as a column the runs list
and the leaderboard filter and count on

Revision ID: 0028
Revises: 0027
Create Date: 2026-12-06

The straggler analysis (`summary.stragglers` in the result document) was only in the stored
document: no list could filter on it without reading every document. `runs.straggler` is true
when a rank was named, false when the runs' collectives were matched and none stood out, null
when the run was not analysed (untraced, or stored before the analysis). Ingest writes it with
the run's other summary columns; here it is backfilled from the stored documents, BATCH at a
time in run-id order.
"""

import json

import sqlalchemy as sa
from alembic import op

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None

BATCH = 2000


def upgrade() -> None:
    op.add_column("runs", sa.Column("straggler", sa.Boolean(), nullable=True))
    conn = op.get_bind()
    runs = sa.table("runs", sa.column("id", sa.String), sa.column("straggler", sa.Boolean))
    results = sa.table("run_results", sa.column("run_id", sa.String), sa.column("document", sa.JSON))
    after = ""
    while True:
        rows = conn.execute(
            sa.select(results.c.run_id, results.c.document).where(results.c.run_id > after).order_by(results.c.run_id).limit(BATCH)
        ).all()
        if not rows:
            break
        for run_id, document in rows:
            if isinstance(document, str):
                document = json.loads(document)
            summary = (document or {}).get("summary") if isinstance(document, dict) else None
            named = summary.get("stragglers") if isinstance(summary, dict) else None
            if isinstance(named, list):
                conn.execute(sa.update(runs).where(runs.c.id == run_id).values(straggler=bool(named)))
        after = rows[-1][0]


def downgrade() -> None:
    op.drop_column("runs", "straggler")
