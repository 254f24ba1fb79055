"""Keeping the leaderboard's tables in step with the runs, explicitly, in the writer's transaction.

`leaderboard_entries` holds one row per ranked run, `leaderboard_cells` one per config and
subset of its runs (`SUBSETS`: all, checks passed, checks verified, both) and `leaderboard_counts`
a config's runs per source, branch, uploader and check outcome (`COUNT_KEY`). No hook follows the
session: each store function that writes a run — its status (`runs.set_status`, which stores a
result's success too), its deletion (`runs.delete_run`) — calls `follow_run` or `forget_run` here,
under the run's row lock (MLflow's `_update_latest_metric_if_necessary` under `with_for_update()`).
A write that bypasses those functions (bulk loads) calls `rebuild`.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from itertools import groupby
from typing import Any

from sqlalchemy import (
    ColumnElement,
    case,
    delete,
    func,
    insert,
    select,
)
from sqlalchemy.orm import Session

from backend.models import LeaderboardCell as Cell
from backend.models import LeaderboardCount as Count
from backend.models import LeaderboardEntry as Entry
from backend.models import Run
from backend.store.leaderboard.board import (
    CELL_ATTRIBUTES,
    CONFIG,
    COUNT_KEY,
    ENTRY_COLUMNS,
    SUBSETS,
    equals,
)
from backend.store.leaderboard.dialect import lock_config, lock_configs
from parallab.core.stats import median_ranks


def eligible(run: Run) -> bool:
    """Whether a run is ranked: it succeeded with a throughput and a workload key."""
    return run.status == "succeeded" and run.tokens_per_s is not None and run.workload_key is not None


def follow_run(session: Session, run: Run, *, was_ranked: bool) -> None:
    """Bring the run's leaderboard row, and the cells and counts of each config it leaves or joins,
    in line with the run as it now is — called by the store function that just changed it, in its
    transaction, under the run's row lock (`lock_run`).

    `was_ranked`: whether the run may have a row already (it had succeeded before this write): a
    run that never succeeded has none, so nothing is deleted for it (ingest's common case). Each
    config's cells are recomputed from its rows (its median needs every one of them: an index
    range over the config, not an upsert of a running maximum). The tables are written with Core
    statements on the session's connection (the ORM's execute path cost more than the statements)."""
    session.flush()
    lock_run(session, run.id)
    old = _remove(session, run.id) if was_ranked else None
    key = tuple(getattr(run, c) for c in CONFIG) if eligible(run) else None
    if key is not None:
        lock_configs(session.connection(), [key] if old is None else [key, old])
        session.connection().execute(insert(Entry).values({c: getattr(run, c) for c in ENTRY_COLUMNS}))
    if old is not None:
        _refresh_cell(session, old)
    if key is not None and key != old:
        _refresh_cell(session, key)


def forget_run(session: Session, run_id: str) -> None:
    """Take a run off the leaderboard before it is deleted (under its row lock), its config's cells
    and counts recomputed from what is left."""
    lock_run(session, run_id)
    old = _remove(session, run_id)
    if old is not None:
        _refresh_cell(session, old)


def lock_run(session: Session, run_id: str) -> None:
    """The run's row lock (`SELECT ... FOR UPDATE` on Postgres; SQLite's one writer already holds it):
    two writes of one run maintain its row one after the other."""
    session.execute(select(Run.id).where(Run.id == run_id).with_for_update())


def _remove(session: Session, run_id: str) -> tuple[Any, ...] | None:
    """Delete the run's entry; the config it counted in, if it had one."""
    returning = delete(Entry).where(Entry.id == run_id).returning(*(getattr(Entry, c) for c in CONFIG))
    old = session.connection().execute(returning).first()
    return tuple(old) if old is not None else None


def lock_cells(session: Session, keys: Sequence[tuple[Any, ...]]) -> None:
    """Take the cell locks of these configs now, in one order (Postgres; a no-op elsewhere).

    An upload writes its configs' cells (these locks, taken again as each run is stored: they are
    re-entrant) and its CI series' rows. Taken here first, in key order, before anything of the
    upload is written, every upload takes them in the same order (cells, then series), so two
    uploads never wait for each other (a deadlock, answered 503)."""
    lock_configs(session.connection(), keys)


def _refresh_cell(session: Session, key: tuple[Any, ...]) -> None:
    """Bring one config's cells up to date from its entries, under a lock on that config on
    Postgres so that two ingests of one config never both miss the other's run.

    Two reads of the config's index range: its attributes (an aggregate), and its runs in
    throughput order with their checks, from which every subset's counts, median, interval and
    run at the median come (`subset_cells`)."""
    conn = session.connection()
    lock_config(conn, key)
    match = equals(Entry, CONFIG, key)
    attributes = conn.execute(select(*(func.min(getattr(Entry, c)).label(c) for c in CELL_ATTRIBUTES), *STRAGGLERS).where(*match)).one()
    conn.execute(delete(Cell).where(*equals(Cell, CONFIG, key)))
    ordered = conn.execute(select(*RUN_CHECKS).where(*match).order_by(Entry.tokens_per_s, Entry.id)).all()
    cells = [{**dict(zip(CONFIG, key, strict=True)), **attributes._mapping, **cell} for cell in subset_cells(ordered)]
    if cells:
        conn.execute(insert(Cell), cells)
    conn.execute(delete(Count).where(*equals(Count, CONFIG, key)))
    conn.execute(insert(Count).from_select([*COUNT_KEY, "runs"], counts_of(Entry.__table__, match)))


def counts_of(entries: Any, where: Sequence[ColumnElement[bool]] = (), count_key: Sequence[str] = COUNT_KEY) -> Any:
    """The `leaderboard_counts` rows of the entries `where` keeps: one per distinct `count_key`
    (the config's attributes are one value per config: grouping by them adds no rows; a migration
    passes the key of its time)."""
    key = [entries.c[c] for c in count_key]
    return select(*key, func.count().label("runs")).where(*where).group_by(*key)


STRAGGLERS = (
    func.coalesce(func.sum(case((Entry.straggler.is_(True), 1), else_=0)), 0).label("straggler_runs"),
    func.count(Entry.straggler).label("straggler_analysed"),
)
"""A config's straggler counts, as its every cell carries them: its runs with a rank named a
straggler, and those the analysis covered (the rest were untraced or stored before it)."""

RUN_CHECKS = (Entry.id, Entry.tokens_per_s, Entry.checks_failed.is_not(None), Entry.checks_stated.is_not(None))
"""What `subset_cells` reads of a run: its id, throughput, whether it failed a check and whether its checks were stated."""


def subset_cells(members: Sequence[Sequence[Any]]) -> list[dict[str, Any]]:
    """A config's cells, one per non-empty subset (`SUBSETS`): its runs' count, best, failed and
    stated counts and median figures (`config_figures`), from its runs in ascending (throughput,
    id) order as `RUN_CHECKS` reads them."""
    cells: list[dict[str, Any]] = []
    for subset, (passed_only, verified_only) in SUBSETS.items():
        kept = [m for m in members if not (passed_only and m[2]) and not (verified_only and m[3])]
        if not kept:
            continue
        figures = config_figures(len(kept), {pos: (m[0], m[1]) for pos, m in enumerate(kept, start=1)})
        counts = {"runs": len(kept), "best_tokens_per_s": kept[-1][1], "failed_runs": sum(bool(m[2]) for m in kept)}
        marks = rank_marks([m[1] for m in kept])
        cells.append({"subset": subset, **counts, "stated_runs": sum(bool(m[3]) for m in kept), **figures, "marks": marks})
    return cells


RANK_MARKS = 256
"""Marks a cell keeps: a config of up to 256 runs has one at each of its runs, and a run's rank
then counts none of them; in a larger config a rank reads at most 1/256 of it (migration 0030)."""


def rank_marks(speeds: Sequence[float]) -> list[list[float]]:
    """[throughput, how many runs are faster, position] at RANK_MARKS evenly spaced positions of a
    config's runs in ascending throughput (0-based; the last is its fastest). A run at x is slower
    than exactly `faster + the runs in (x, mark]` of them, for the first mark at or above x — one
    short index range — so the rank never counts a whole group; and when that mark's position
    follows the mark below it (no run lies between them), those runs are known without reading
    them: every run from the mark's position up (`config size − position`)."""
    n = len(speeds)
    positions = sorted({-(-k * n // RANK_MARKS) - 1 for k in range(1, RANK_MARKS + 1)})
    return [[speeds[p], n - bisect_right(speeds, speeds[p]), p] for p in positions]


def runs_by_config(entries: Any, key: Sequence[str] = CONFIG) -> Any:
    """Every entry as its config then what `subset_cells` reads (`RUN_CHECKS`), one config after
    another in (throughput, id) order — the one pass the bulk rebuild and the migrations that
    derive cells make (`entries`: the table, or a migration's snapshot of it; `key`: the config
    key of the migration's time)."""
    config = [entries.c[c] for c in key]
    checks = (entries.c.id, entries.c.tokens_per_s, entries.c.checks_failed.is_not(None), entries.c.checks_stated.is_not(None))
    return select(*config, *checks).order_by(*config, entries.c.tokens_per_s, entries.c.id)


def grouped_by_config(rows: Any, width: int) -> Any:
    """(key, its rows) for rows ordered by their first `width` columns (one config after another)."""
    return groupby(rows, key=lambda row: tuple(row[:width]))


def median_positions(n: int) -> set[int]:
    """The 1-based positions, in ascending throughput, that a config of n runs needs read: the
    middle one or two, and the order statistics bounding the median's interval."""
    lo, hi, _ = median_ranks(n)
    return {(n + 1) // 2, n // 2 + 1, lo, hi}


FIGURES = ("median_tokens_per_s", "interval_low", "interval_high", "interval_coverage", "median_run_id")
"""What `config_figures` gives a cell."""


def config_figures(n: int, at: dict[int, tuple[str, float]]) -> dict[str, Any]:
    """A config's figure from its runs at `median_positions(n)` ({position: (run id, tokens/s)}):
    the median, its 95 % interval and that interval's coverage (`parallab.core.stats`: the same
    numbers as `median_interval` of every run's throughput), and the run standing for the config —
    the one at the median (of two, the faster)."""
    lo, hi, coverage = median_ranks(n)
    lower, upper = at[(n + 1) // 2][1], at[n // 2 + 1][1]
    return {
        "median_tokens_per_s": lower if n % 2 else (lower + upper) / 2,
        "interval_low": at[lo][1],
        "interval_high": at[hi][1],
        "interval_coverage": coverage,
        "median_run_id": at[n // 2 + 1][0],
    }


def rebuild(session: Session) -> int:
    """Refill both tables from `runs` (what migration 0010 backfills; for bulk loads that bypass
    ingest). Returns the entries written."""
    session.execute(delete(Cell))
    session.execute(delete(Count))
    session.execute(delete(Entry))
    ranked = select(*(getattr(Run, c) for c in ENTRY_COLUMNS)).where(
        Run.status == "succeeded", Run.tokens_per_s.is_not(None), Run.workload_key.is_not(None)
    )
    session.execute(insert(Entry).from_select(list(ENTRY_COLUMNS), ranked))
    _fill_cells(session)
    session.execute(insert(Count).from_select([*COUNT_KEY, "runs"], counts_of(Entry.__table__)))
    return session.execute(select(func.count()).select_from(Entry)).scalar_one()


def _fill_cells(session: Session) -> None:
    """Every config's cells (`subset_cells`), from one aggregate of its attributes and one ordered
    pass over the entries (a bulk load's rebuild), written CELL_BATCH at a time."""
    config = [getattr(Entry, c) for c in CONFIG]
    named = (*CELL_ATTRIBUTES, *(s.name for s in STRAGGLERS))
    attributes = {
        tuple(r[: len(CONFIG)]): dict(zip(named, r[len(CONFIG) :], strict=True))
        for r in session.execute(select(*config, *(func.min(getattr(Entry, c)) for c in CELL_ATTRIBUTES), *STRAGGLERS).group_by(*config))
    }
    rows = session.execute(runs_by_config(Entry.__table__))
    batch: list[dict[str, Any]] = []
    for key, members in grouped_by_config(rows, len(CONFIG)):
        fixed = {**dict(zip(CONFIG, key, strict=True)), **attributes[key]}
        batch += [{**fixed, **cell} for cell in subset_cells([m[len(CONFIG) :] for m in members])]
        if len(batch) >= CELL_BATCH:
            session.connection().execute(insert(Cell), batch)
            batch = []
    if batch:
        session.connection().execute(insert(Cell), batch)


CELL_BATCH = 5000
