"""uploads relabelled: a stored upload is never verified, and a check it does not carry is "not checked"

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-06

Ingest now labels an upload (a run whose source is the CI upload path, `ingest.UPLOAD_SOURCE`)
with a `?` in `checks_failed` for each check that applies and that it does not carry
(`gradient?`), and a `checks_stated` that is never null (the stated checks, the missing ones, or
`upload`): `verified=true` keeps only the lab's own runs and `checks=passed` needs every check
present and passed. Uploads stored before that kept the old labels — one stored with nothing
stated was still listed as verified. Here every stored upload is labelled again by ingest's own
functions (`labelled`, `check_columns`): its run row, its leaderboard entry and
`summary.checks_not_checked` in its stored document; then the cells and counts of every config
whose runs changed are rederived from the entries (`subset_cells`, `counts_of`), CONFIG_BATCH
configs a statement. Uploads are read BATCH at a time in id order, so a lab of a million runs
never holds them all.

The lab's own runs are untouched: their labels never depended on the upload path. A document
that no longer reads as a result document keeps its failed checks and, being an upload, loses
its verified label (`checks_stated` set to `upload` where it was null).

The schema does not change and the new labels are what ingest writes at 0025 too, so the
downgrade leaves them: an upgrade after it finds nothing to change.
"""

from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa
from alembic import op
from pydantic import ValidationError
from sqlalchemy.dialects import postgresql

from backend.services.ingest import UPLOAD_SOURCE, UPLOADED, check_columns, labelled
from backend.store.leaderboard import counts_of, grouped_by_config, runs_by_config, subset_cells
from parallab.core.result import ResultDocument

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None

BATCH = 1000
CONFIG_BATCH = 500
CONFIG = ("workload_key", "hardware_key", "strategy", "world_size", "strategy_options")
ATTRIBUTES = ("model", "shape_key", "precision", "activation_checkpointing", "grad_accumulation_steps", "micro_batch_size")
FILTERED = ("source", "branch", "user_id", "checks_failed", "checks_stated")
CELL_VALUES = ("subset", "runs", "best_tokens_per_s", "failed_runs", "stated_runs", "marks")
FIGURES = ("median_tokens_per_s", "interval_low", "interval_high", "interval_coverage", "median_run_id")
CHECKS = ("checks_failed", "checks_stated")
DOCUMENT = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")

runs = sa.table("runs", sa.column("id", sa.String), sa.column("source", sa.String), *(sa.column(c, sa.String) for c in CHECKS))
results = sa.table("run_results", sa.column("run_id", sa.String), sa.column("document", DOCUMENT))
entries = sa.table("leaderboard_entries", *(sa.column(c) for c in ("id", "tokens_per_s", *CONFIG, *ATTRIBUTES, *FILTERED)))
cells = sa.table(
    "leaderboard_cells", *(sa.column(c, sa.JSON) if c == "marks" else sa.column(c) for c in (*CONFIG, *ATTRIBUTES, *CELL_VALUES, *FIGURES))
)
counts = sa.table("leaderboard_counts", *(sa.column(c) for c in (*CONFIG, *ATTRIBUTES, *FILTERED, "runs")))


def relabel(document: Any, failed: str | None, stated: str | None) -> tuple[dict[str, str | None], Any]:
    """An upload's check columns and its stored document as ingest labels them now."""
    try:
        parsed = labelled(ResultDocument.model_validate(document))
    except ValidationError:
        return {"checks_failed": failed, "checks_stated": stated or UPLOADED}, document
    summary = {**document["summary"], "checks_not_checked": list(parsed.summary.checks_not_checked)}
    return check_columns(parsed, uploaded=True), {**document, "summary": summary}


def _uploads(conn: Any) -> Iterator[list[Any]]:
    """Every upload with its stored document, BATCH at a time, in id order (keyset: no offset)."""
    after = ""
    while True:
        page = conn.execute(
            sa.select(runs.c.id, runs.c.checks_failed, runs.c.checks_stated, results.c.document)
            .join(results, results.c.run_id == runs.c.id)
            .where(runs.c.source == UPLOAD_SOURCE, runs.c.id > after)
            .order_by(runs.c.id)
            .limit(BATCH)
        ).all()
        if not page:
            return
        yield page
        after = page[-1].id


def _relabel_batch(conn: Any, page: list[Any]) -> set[tuple[Any, ...]]:
    """Write one batch's new labels (only where they changed); the configs of the entries that changed."""
    changed: list[dict[str, Any]] = []
    documents: list[dict[str, Any]] = []
    for row in page:
        columns, document = relabel(row.document, row.checks_failed, row.checks_stated)
        if (columns["checks_failed"], columns["checks_stated"]) != (row.checks_failed, row.checks_stated):
            changed.append({"key": row.id, **{f"new_{c}": columns[c] for c in CHECKS}})
        if document != row.document:
            documents.append({"key": row.id, "new_document": document})
    if documents:
        conn.execute(
            sa.update(results).where(results.c.run_id == sa.bindparam("key")).values(document=sa.bindparam("new_document")), documents
        )
    if not changed:
        return set()
    labels = {c: sa.bindparam(f"new_{c}") for c in CHECKS}
    conn.execute(sa.update(runs).where(runs.c.id == sa.bindparam("key")).values(labels), changed)
    conn.execute(sa.update(entries).where(entries.c.id == sa.bindparam("key")).values(labels), changed)
    ids = [c["key"] for c in changed]
    return {tuple(r) for r in conn.execute(sa.select(*(entries.c[c] for c in CONFIG)).where(entries.c.id.in_(ids)))}


def _rederive(conn: Any, keys: list[tuple[Any, ...]]) -> None:
    """These configs' cells and counts again from their entries (the rules ingest keeps them by):
    one ordered read of their entries, a statement per table (a config key is never null on an entry)."""

    def which(table: Any) -> Any:
        return sa.tuple_(*(table.c[c] for c in CONFIG)).in_(keys)

    conn.execute(sa.delete(cells).where(which(cells)))
    conn.execute(sa.delete(counts).where(which(counts)))
    key = [entries.c[c] for c in CONFIG]
    attributes = {
        tuple(r[: len(CONFIG)]): dict(zip(ATTRIBUTES, r[len(CONFIG) :], strict=True))
        for r in conn.execute(sa.select(*key, *(sa.func.min(entries.c[c]) for c in ATTRIBUTES)).where(which(entries)).group_by(*key))
    }
    made: list[dict[str, Any]] = []
    for found, members in grouped_by_config(conn.execute(runs_by_config(entries, CONFIG).where(which(entries))), len(CONFIG)):
        fixed = {**dict(zip(CONFIG, found, strict=True)), **attributes[found]}
        made += [{**fixed, **cell} for cell in subset_cells([m[len(CONFIG) :] for m in members])]
    if made:
        conn.execute(sa.insert(cells), made)
    count_key = (*CONFIG, *ATTRIBUTES, *FILTERED)
    conn.execute(sa.insert(counts).from_select([*count_key, "runs"], counts_of(entries, [which(entries)], count_key=count_key)))


def upgrade() -> None:
    conn = op.get_bind()
    touched: set[tuple[Any, ...]] = set()
    for page in _uploads(conn):
        touched |= _relabel_batch(conn, page)
    keys = sorted(touched, key=repr)
    for start in range(0, len(keys), CONFIG_BATCH):
        _rederive(conn, keys[start : start + CONFIG_BATCH])


def downgrade() -> None:
    """Nothing to undo: the schema is 0025's and so is the labelling rule (see the module's docstring)."""
