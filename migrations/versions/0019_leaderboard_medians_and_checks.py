"""leaderboard: a config's median with its interval, and each run's failed and stated checks

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-02

The leaderboard ranks a config by the median throughput of its runs (not the luckiest run) and
shows n and the median's 95 % interval (order statistics, `parallab.core.stats`). A median cannot
be kept by adding to a running maximum, and SQLite has no median aggregate: each config's cell
keeps its median, interval, coverage and the run at the median, recomputed from the config's
entries in the run's transaction as its count is.

`checks_failed` (loss, gradient, replica: the correctness checks the run failed, by the stored
flags' rule) and `checks_stated` (`summary.checks_stated`: what the uploader stated and the lab
could not recompute) are denormalised onto `runs` and `leaderboard_entries`, so the board greys,
hides and labels runs without reading documents; each cell counts its failed and stated runs.

Everything added is derived from what was stored (result documents and entries): it is backfilled
here, and the downgrade drops only it.
"""

from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from backend.store.leaderboard import config_figures
from parallab.core.flags import failed_checks

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

BATCH = 500
DOCUMENT = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")
CONFIG = ("workload_key", "hardware_key", "strategy", "world_size")
CELL_FIGURES = ("median_tokens_per_s", "interval_low", "interval_high", "interval_coverage", "median_run_id")
CHECK_COLUMNS = ("checks_failed", "checks_stated")

runs = sa.table("runs", sa.column("id", sa.String), sa.column("checks_failed", sa.String), sa.column("checks_stated", sa.String))
results = sa.table("run_results", sa.column("run_id", sa.String), sa.column("document", DOCUMENT))
entries = sa.table(
    "leaderboard_entries",
    sa.column("id", sa.String),
    sa.column("tokens_per_s", sa.Float),
    sa.column("checks_failed", sa.String),
    sa.column("checks_stated", sa.String),
    *(sa.column(c) for c in CONFIG),
)
cells = sa.table(
    "leaderboard_cells",
    sa.column("id", sa.Integer),
    sa.column("failed_runs", sa.Integer),
    sa.column("stated_runs", sa.Integer),
    *(sa.column(c) for c in (*CONFIG, *CELL_FIGURES)),
)


def upgrade() -> None:
    for table in ("runs", "leaderboard_entries"):
        with op.batch_alter_table(table) as batch:
            for name in CHECK_COLUMNS:
                batch.add_column(sa.Column(name, sa.String(64), nullable=True))
    with op.batch_alter_table("leaderboard_cells") as batch:
        for name in ("median_tokens_per_s", "interval_low", "interval_high", "interval_coverage"):
            batch.add_column(sa.Column(name, sa.Float(), nullable=True))
        batch.add_column(sa.Column("median_run_id", sa.String(32), nullable=True))
        batch.add_column(sa.Column("failed_runs", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("stated_runs", sa.Integer(), nullable=False, server_default="0"))
    conn = op.get_bind()
    for batch_rows in _batches(conn):
        updates = [{"run_id": run_id, **_checks(document)} for run_id, document in batch_rows]
        updates = [u for u in updates if u["new_failed"] is not None or u["new_stated"] is not None]
        if updates:
            conn.execute(
                sa.update(runs)
                .where(runs.c.id == sa.bindparam("run_id"))
                .values(checks_failed=sa.bindparam("new_failed"), checks_stated=sa.bindparam("new_stated")),
                updates,
            )
    for name in CHECK_COLUMNS:
        conn.execute(sa.update(entries).values({name: sa.select(runs.c[name]).where(runs.c.id == entries.c.id).scalar_subquery()}))
    _fill_cells(conn)


def downgrade() -> None:
    with op.batch_alter_table("leaderboard_cells") as batch:
        for name in (*CELL_FIGURES, "failed_runs", "stated_runs"):
            batch.drop_column(name)
    for table in ("leaderboard_entries", "runs"):
        with op.batch_alter_table(table) as batch:
            for name in CHECK_COLUMNS:
                batch.drop_column(name)


def _checks(document: Any) -> dict[str, str | None]:
    """What ingest's `check_columns` gives the stored document (the same rule, from its JSON)."""
    document = document if isinstance(document, dict) else {}
    summary = document.get("summary") if isinstance(document.get("summary"), dict) else {}
    workload = document.get("workload") if isinstance(document.get("workload"), dict) else {}
    failed = failed_checks(summary, str(workload.get("precision") or "fp32"))
    stated = [str(name) for name in dict.fromkeys(summary.get("checks_stated") or [])]
    return {"new_failed": ",".join(failed)[:64] or None, "new_stated": ",".join(stated)[:64] or None}


def _fill_cells(conn: Any) -> None:
    """Each cell's counts of failed and stated runs, and its median figures (`config_figures`, as
    ingest computes them), from one ordered pass over the entries."""
    ids = {tuple(r[:-1]): r[-1] for r in conn.execute(sa.select(*(cells.c[c] for c in CONFIG), cells.c.id))}
    order = [entries.c[c] for c in CONFIG]
    rows = conn.execute(
        sa.select(*order, entries.c.id, entries.c.tokens_per_s, entries.c.checks_failed, entries.c.checks_stated).order_by(
            *order, entries.c.tokens_per_s, entries.c.id
        )
    )
    updates: list[dict[str, Any]] = []

    def done(key: tuple[Any, ...], members: list[Any]) -> None:
        if key not in ids:
            return
        figures = config_figures(len(members), {i: (m.id, m.tokens_per_s) for i, m in enumerate(members, start=1)})
        updates.append(
            {
                "cell_id": ids[key],
                **{f"new_{k}": v for k, v in figures.items()},
                "new_failed_runs": sum(m.checks_failed is not None for m in members),
                "new_stated_runs": sum(m.checks_stated is not None for m in members),
            }
        )

    key: tuple[Any, ...] | None = None
    members: list[Any] = []
    for row in rows:
        here = tuple(row[: len(CONFIG)])
        if here != key:
            if key is not None:
                done(key, members)
            key, members = here, []
        members.append(row)
    if key is not None:
        done(key, members)
    if updates:
        names = (*CELL_FIGURES, "failed_runs", "stated_runs")
        conn.execute(
            sa.update(cells).where(cells.c.id == sa.bindparam("cell_id")).values({c: sa.bindparam(f"new_{c}") for c in names}),
            updates,
        )


def _batches(conn: Any) -> Any:
    """Every (run_id, document) of run_results, BATCH at a time in run_id order (keyset paging)."""
    after = ""
    while True:
        batch = conn.execute(
            sa.select(results.c.run_id, results.c.document).where(results.c.run_id > after).order_by(results.c.run_id).limit(BATCH)
        ).all()
        if not batch:
            return
        yield list(batch)
        after = batch[-1][0]
