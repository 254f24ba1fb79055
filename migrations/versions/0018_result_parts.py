"""run_result_parts: a result document's heavy parts apart from it, compressed

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-02

A traced run's timeline (up to 80,000 events), each rank's per-step arrays and a collectives
sweep are most of a document's bytes, and one chart of one page draws each. They move out of
`run_results.document` into `run_result_parts` (one row per part: its JSON, zlib-compressed, and
how many items it holds), so the pages that show a summary — compare, the run's header — read
only the light rest. Every existing document is split here, in batches (nothing is lost: the
downgrade puts every part back where it came from). The split is `backend.store.result_parts`'s,
the one ingest uses.
"""

from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from backend.store.result_parts import merge, split

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

BATCH = 500
DOCUMENT = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")
results = sa.table("run_results", sa.column("run_id", sa.String), sa.column("document", DOCUMENT))
parts = sa.table(
    "run_result_parts",
    sa.column("run_id", sa.String),
    sa.column("part", sa.String),
    sa.column("items", sa.Integer),
    sa.column("data", sa.LargeBinary),
)


def upgrade() -> None:
    op.create_table(
        "run_result_parts",
        sa.Column("run_id", sa.String(length=32), nullable=False),
        sa.Column("part", sa.String(length=32), nullable=False),
        sa.Column("items", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_run_result_parts_run_id_runs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", "part", name=op.f("pk_run_result_parts")),
    )
    conn = op.get_bind()
    if conn.dialect.name == "postgresql":
        # already compressed: no second (pglz) attempt, stored out of line as it is
        op.execute("ALTER TABLE run_result_parts ALTER COLUMN data SET STORAGE EXTERNAL")
    for batch in _batches(conn):
        rows: list[dict[str, Any]] = []
        for run_id, document in batch:
            light, taken = split(document)
            if not taken:
                continue
            conn.execute(sa.update(results).where(results.c.run_id == run_id).values(document=light))
            rows += [{"run_id": run_id, "part": key, "items": items, "data": data} for key, (items, data) in taken.items()]
        if rows:
            conn.execute(sa.insert(parts), rows)


def downgrade() -> None:
    conn = op.get_bind()
    for batch in _batches(conn):
        ids = [run_id for run_id, _ in batch]
        stored: dict[str, list[tuple[str, bytes]]] = {}
        for run_id, key, data in conn.execute(sa.select(parts.c.run_id, parts.c.part, parts.c.data).where(parts.c.run_id.in_(ids))):
            stored.setdefault(run_id, []).append((key, data))
        for run_id, document in batch:
            if run_id in stored:
                conn.execute(sa.update(results).where(results.c.run_id == run_id).values(document=merge(document, stored[run_id])))
    op.drop_table("run_result_parts")


def _batches(conn: Any) -> Any:
    """Every (run_id, document) of run_results, BATCH at a time in run_id order (keyset paging)."""
    after = ""
    while True:
        batch = conn.execute(
            sa.select(results.c.run_id, results.c.document).where(results.c.run_id > after).order_by(results.c.run_id).limit(BATCH)
        ).all()
        if not batch:
            return
        yield [(run_id, document) for run_id, document in batch]
        after = batch[-1][0]
