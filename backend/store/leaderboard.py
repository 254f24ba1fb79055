"""SQL for the leaderboard and the scaling page: the maintained narrow tables, never result documents.

`leaderboard_entries` holds one row per ranked run, `leaderboard_cells` one per config and
subset of its runs (`SUBSETS`: all, checks passed, checks verified, both) and `leaderboard_counts`
a config's runs per source, branch, uploader and check outcome (`COUNT_KEY`), all kept in the
run's own transaction (MLflow's `latest_metrics` lesson). Nothing here ranks or
sorts every run (measured at 100,000 runs by benchmarks/queries.py): a page of every
run comes from an index in the board's whole order, or — for the two sorts no index holds, by
rank and by runs per config — is planned from the group and config sizes and reads only the
runs it can reach, its sizes summed from the counts; best-per-config reads the cells. Only the
page's rows get their rank and counts. Postgres gets the plans that need LATERAL and FETCH ... WITH TIES; SQLite (an embedded
lab's few runs) simpler windows over what the filters keep, with the same results.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import groupby
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Integer,
    and_,
    bindparam,
    case,
    cast,
    column,
    delete,
    event,
    exists,
    false,
    func,
    insert,
    inspect,
    or_,
    select,
    text,
    true,
    values,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Session, aliased

from backend.models import LeaderboardCell as Cell
from backend.models import LeaderboardCount as Count
from backend.models import LeaderboardEntry as Entry
from backend.models import Run
from parallab.core.stats import median_ranks

# Columns a leaderboard row carries, in display order.
ROW_COLUMNS = (
    "id",
    "name",
    "model",
    "strategy",
    "strategy_options",
    "world_size",
    "workload_key",
    "hardware_key",
    "tokens_per_s",
    "mfu",
    "peak_allocated_bytes_max",
    "step_time_median_s",
    "comm_time_fraction",
    "exposed_comm_fraction",
    "loss_max_rel_diff",
    "source",
    "branch",
    "commit",
    "created_at",
    "user_id",
    # The recipe dimensions
    "shape_key",
    "precision",
    "activation_checkpointing",
    "grad_accumulation_steps",
    "micro_batch_size",
    # The correctness checks it failed and those its uploader stated (comma-separated, or null)
    "checks_failed",
    "checks_stated",
)
SORTABLE = frozenset(ROW_COLUMNS) - {"checks_failed", "checks_stated", "strategy_options"} | {"rank", "config_runs"}
RECIPE_FILTERS = ("precision", "activation_checkpointing", "grad_accumulation_steps", "micro_batch_size")
FILTERS = ("model", "hardware_key", "strategy", "world_size", "source", "branch", "user_id", *RECIPE_FILTERS)
GROUPINGS = ("workload", "shape", *RECIPE_FILTERS)
"""How runs are grouped for ranking: `workload` — the same workload key (recipe included: only
identical workloads compete); `shape` — the same model shape and batch, every recipe competing;
a recipe dimension — within a shape, one group per value of that dimension."""

CONFIG = ("workload_key", "hardware_key", "strategy", "world_size", "strategy_options")
"""One config: its runs share a workload, hardware, strategy, world size and the strategy's options as
measured (FSDP resharding or not, a pipeline's schedule, virtual stages and micro-batches: each
its own row, median and n; the CI series keep the workload key alone)."""
KEYED = frozenset(CONFIG) | {"shape_key"}
"""Columns compared with `=` (never null on a ranked run, and indexed); the others null-safely."""
ENTRY_COLUMNS = tuple(c.name for c in Entry.__table__.columns)
CELL_ATTRIBUTES = ("model", "shape_key", *RECIPE_FILTERS)
"""What a config's cell carries besides its key and counts (the same for each of its runs)."""
CELL_FILTERS = frozenset({"model", "hardware_key", "strategy", "world_size", *RECIPE_FILTERS})
"""Filters the cells can answer; under the others (source, branch, user) the sizes come from the
counts and a config's figures from its filtered runs."""
CHECK_FILTERS = ("checks", "verified")
"""Filters on a run's checks (`checks="passed"`: every check that applies present and passed, none
failed or missing; `verified=True`: produced by the lab's own worker — ingest never leaves an
upload's `checks_stated` null). The cells answer them too: a config has a cell per subset they
can keep (`SUBSETS`)."""
SUBSETS: dict[str, tuple[bool, bool]] = {
    "all": (False, False),
    "passed": (True, False),
    "verified": (False, True),
    "passed_verified": (True, True),
}
"""A config's cells, each over a subset of its runs: (only runs that failed no check, only runs
whose checks the lab made itself). A subset with no runs has no cell."""
COUNT_KEY = (*CONFIG, *CELL_ATTRIBUTES, "source", "branch", "user_id", "checks_failed", "checks_stated")
"""What one `leaderboard_counts` row counts the runs of: a config and every run column a filter reads."""
SORT_WORK_MEM = "64MB"
RECIPE_CONFIG = ("shape_key", "hardware_key", "strategy", "world_size", "strategy_options", *RECIPE_FILTERS)


def partition(group: str) -> tuple[str, ...]:
    """The columns that make one ranking group under `group` (see GROUPINGS)."""
    if group == "workload":
        return ("workload_key", "hardware_key")
    if group == "shape":
        return ("shape_key", "hardware_key")
    return ("shape_key", "hardware_key", group)


def eligible(run: Run) -> bool:
    """Whether a run is ranked: it succeeded with a throughput and a workload key."""
    return run.status == "succeeded" and run.tokens_per_s is not None and run.workload_key is not None


WATCHED = frozenset(ENTRY_COLUMNS) | {"status"}
"""The run attributes its leaderboard row depends on."""


@event.listens_for(Session, "after_flush")
def _follow_runs(session: Session, flush_context: Any) -> None:
    """Every flush that adds, changes or deletes runs through the ORM brings their leaderboard rows
    and cells along, in the same transaction: status changes, ingest, the uploader recorded after
    ingest, a deleted run. (Bulk Core statements bypass this: `delete_run` removes the row itself,
    and bulk loads call `rebuild`.)"""
    for obj in session.deleted:
        if isinstance(obj, Run):
            _deleted(session, obj)
    for obj in session.new | session.dirty:
        if isinstance(obj, Run) and (obj in session.new or _touched(obj)):
            sync_entry(session, obj)


def _deleted(session: Session, run: Run) -> None:
    """A run deleted through the ORM: its entry went with it (the foreign key cascades, before this
    hook runs), so the configs it could have counted in — as loaded, and as last changed — are
    recomputed from what is left."""
    remove_entry(session, run.id)
    committed = inspect(run).committed_state
    for key in {tuple(committed.get(c, getattr(run, c)) for c in CONFIG), tuple(getattr(run, c) for c in CONFIG)}:
        if key[0] is not None:
            _refresh_cell(session, key)


def _touched(run: Run) -> bool:
    state = inspect(run)
    return any(state.attrs[name].history.has_changes() for name in WATCHED)


def sync_entry(session: Session, run: Run) -> None:
    """Make the run's leaderboard row and its config's cell agree with the run (written, rewritten
    or removed), in the caller's transaction (the run row is already written).

    A run being inserted has no row yet (nothing to delete). Each config the run leaves or joins
    has its cell recomputed from that config's rows (its median needs every one of them: an index
    range over the config, not an upsert of a running maximum).

    The tables are written with Core statements on the session's connection (no ORM objects are
    involved: the ORM's execute path cost more than the statements)."""
    # Runs inserted in this transaction without a row (not yet eligible): no delete needed either.
    transaction, unranked = session.info.get("leaderboard_unranked", (None, set()))
    if transaction is not session.get_transaction():
        transaction, unranked = session.get_transaction(), set()
        session.info["leaderboard_unranked"] = (transaction, unranked)
    old = None if run in session.new or run.id in unranked else _remove(session, run.id)
    key = tuple(getattr(run, c) for c in CONFIG) if eligible(run) else None
    if key is not None:
        unranked.discard(run.id)
        session.connection().execute(insert(Entry).values({c: getattr(run, c) for c in ENTRY_COLUMNS}))
    elif run in session.new:
        unranked.add(run.id)
    if old is not None:
        _refresh_cell(session, old)
    if key is not None and key != old:
        _refresh_cell(session, key)


def remove_entry(session: Session, run_id: str) -> None:
    """Take a run off the leaderboard (it is being deleted), its config's cell recomputed."""
    old = _remove(session, run_id)
    if old is not None:
        _refresh_cell(session, old)


def _remove(session: Session, run_id: str) -> tuple[Any, ...] | None:
    """Delete the run's entry; the config it counted in, if it had one."""
    returning = delete(Entry).where(Entry.id == run_id).returning(*(getattr(Entry, c) for c in CONFIG))
    old = session.connection().execute(returning).first()
    return tuple(old) if old is not None else None


def lock_cells(session: Session, runs: Sequence[Run]) -> None:
    """Take the cell locks of these runs' configs now, in one order (Postgres; a no-op elsewhere).

    An upload writes its config's cell (this lock, taken again in the flush: it is re-entrant)
    and its CI series' row. Taken here first, in key order, before the upload writes the series,
    every upload takes them in the same order (cells, then series), so two uploads never wait
    for each other (a deadlock, answered 503)."""
    conn = session.connection()
    if conn.dialect.name != "postgresql":
        return
    for key in sorted({_cell_lock_key(tuple(getattr(run, c) for c in CONFIG)) for run in runs if eligible(run)}):
        conn.execute(text("SELECT pg_advisory_xact_lock(hashtext(:key))"), {"key": key})


def _cell_lock_key(key: tuple[Any, ...]) -> str:
    return "cell:" + "|".join(map(str, key))


def _refresh_cell(session: Session, key: tuple[Any, ...]) -> None:
    """Bring one config's cells up to date from its entries, under a lock on that config on
    Postgres so that two ingests of one config never both miss the other's run.

    Two reads of the config's index range: its attributes (an aggregate), and its runs in
    throughput order with their checks, from which every subset's counts, median, interval and
    run at the median come (`subset_cells`)."""
    conn = session.connection()
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(hashtext(:key))"), {"key": _cell_lock_key(key)})
    match = _equals(Entry, CONFIG, key)
    attributes = conn.execute(select(*(func.min(getattr(Entry, c)).label(c) for c in CELL_ATTRIBUTES)).where(*match)).one()
    conn.execute(delete(Cell).where(*_equals(Cell, CONFIG, key)))
    ordered = conn.execute(select(*RUN_CHECKS).where(*match).order_by(Entry.tokens_per_s, Entry.id)).all()
    cells = [{**dict(zip(CONFIG, key, strict=True)), **attributes._mapping, **cell} for cell in subset_cells(ordered)]
    if cells:
        conn.execute(insert(Cell), cells)
    conn.execute(delete(Count).where(*_equals(Count, CONFIG, key)))
    conn.execute(insert(Count).from_select([*COUNT_KEY, "runs"], counts_of(Entry.__table__, match)))


def counts_of(entries: Any, where: Sequence[ColumnElement[bool]] = (), count_key: Sequence[str] = COUNT_KEY) -> Any:
    """The `leaderboard_counts` rows of the entries `where` keeps: one per distinct `count_key`
    (the config's attributes are one value per config: grouping by them adds no rows; a migration
    passes the key of its time)."""
    key = [entries.c[c] for c in count_key]
    return select(*key, func.count().label("runs")).where(*where).group_by(*key)


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


RANK_MARKS = 32
"""Marks a cell keeps: a run's rank then reads at most 1/32 of each config of its group."""


def rank_marks(speeds: Sequence[float]) -> list[list[float]]:
    """[throughput, how many runs are faster] at RANK_MARKS evenly spaced positions of a config's
    runs in ascending throughput (the last is its fastest). A run at x is slower than exactly
    `faster + the runs in (x, mark]` of them, for the first mark at or above x — one short index
    range — so the rank never counts a whole group."""
    n = len(speeds)
    positions = sorted({-(-k * n // RANK_MARKS) - 1 for k in range(1, RANK_MARKS + 1)})
    return [[speeds[p], n - bisect_right(speeds, speeds[p])] for p in positions]


def subset_of(filters: dict[str, Any]) -> str:
    """The cells' subset that holds the runs the check filters keep."""
    wanted = (filters.get("checks") == "passed", bool(filters.get("verified")))
    return next(name for name, rule in SUBSETS.items() if rule == wanted)


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
    attributes = {
        tuple(r[: len(CONFIG)]): dict(zip(CELL_ATTRIBUTES, r[len(CONFIG) :], strict=True))
        for r in session.execute(select(*config, *(func.min(getattr(Entry, c)) for c in CELL_ATTRIBUTES)).group_by(*config))
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


def _conditions(filters: dict[str, Any], table: Any = Entry) -> list[ColumnElement[bool]]:
    """The filters applied to ranked runs (the table holds only those) or to cells."""
    conds: list[ColumnElement[bool]] = []
    for name in FILTERS:
        if name not in filters:
            continue
        value = filters.get(name)
        if value is not None and value != "":
            conds.append(getattr(table, name) == value)
    if filters.get("checks") == "passed":
        conds.append(table.checks_failed.is_(None))
    if filters.get("verified"):
        conds.append(table.checks_stated.is_(None))
    return conds


def _match(a: Any, b: Any, columns: Sequence[str]) -> list[ColumnElement[bool]]:
    """Equality on `columns` between two tables; recipe dimensions may be null (CI uploads that no
    longer resolve): null matches null there (not indexable, so only on columns after the keys)."""
    return _equals(a, columns, [getattr(b, c) for c in columns])


def leaderboard_rows(
    session: Session,
    *,
    filters: dict[str, Any],
    best_only: bool,
    sort: str | None,
    descending: bool,
    limit: int,
    offset: int,
    group: str = "workload",
    after: Sequence[Any] | None = None,
) -> tuple[list[dict[str, Any]], int]:
    """A page of leaderboard rows (each ranked within its group, see GROUPINGS) and the total;
    `after` (every run, sorted by a column: `keyset_sort`) starts the page after the run whose
    `page_key` it is, at a cost that does not grow with the depth (`offset` is then not read)."""
    sort = sort if sort in SORTABLE else None
    if after is not None and (best_only or not keyset_sort(sort)):
        raise ValueError("a cursor pages every run sorted by a column (not by rank or runs per config, nor best per config)")
    if after is not None and len(after) != len(page_columns(sort, group)):
        raise ValueError("cursor is not one this board returned")
    fixed = tuple(after) if after is not None else None
    board = Board(filters=filters, group=group, sort=sort, descending=descending, limit=limit, offset=offset, after=fixed)
    return _best_rows(session, board) if best_only else _every_run(session, board)


@dataclass(frozen=True)
class Board:
    """One request for leaderboard rows: what the planners, counts and orders share."""

    filters: dict[str, Any]
    group: str
    sort: str | None
    descending: bool
    limit: int
    offset: int
    after: tuple[Any, ...] | None = None
    """The page starts after the run with this `page_key` (keyset pagination), not at `offset`."""

    @property
    def conds(self) -> list[ColumnElement[bool]]:
        """The competing runs (see `_entry_conditions`)."""
        return _entry_conditions(self.filters, self.group)

    @property
    def cellable(self) -> bool:
        """Whether the cells answer every filter (CELL_FILTERS and the check filters), so the configs' figures and sizes come from them."""
        return {n for n, v in self.filters.items() if v is not None and v != ""} <= CELL_FILTERS | set(CHECK_FILTERS)

    @property
    def group_cols(self) -> tuple[str, ...]:
        return partition(self.group)

    @property
    def config(self) -> tuple[str, ...]:
        """The columns of one config: strategy and world size within a workload, or within a shape and recipe."""
        return CONFIG if self.group == "workload" else RECIPE_CONFIG


def _best_rows(session: Session, board: Board) -> tuple[list[dict[str, Any]], int]:
    """Each (strategy, world size[, recipe]) config as one row, ranked within its group by the
    median throughput of its runs (never the luckiest run), with n and the median's 95 % interval.

    The figures come from the maintained cells when they answer the filters (no filter on the
    runs themselves: source, branch, user; the check filters pick a cell subset), else from the
    runs the filters keep, of which only a few per config are read (`_config_medians`). The row's other columns
    are the run at the median's. Configs are a few hundred: they are ranked, sorted and paged
    here, and only the runs standing for them are read.
    """
    configs = _cell_medians(session, board) if board.cellable else _config_medians(session, board)
    ids = [c["median_run_id"] for c in configs]
    by_id: dict[str, dict[str, Any]] = {}
    for chunk in range(0, len(ids), 5000):
        query = select(*(getattr(Entry, c) for c in ROW_COLUMNS)).where(Entry.id.in_(ids[chunk : chunk + 5000]))
        by_id.update({r.id: dict(r._mapping) for r in session.execute(query)})
    rows: list[dict[str, Any]] = []
    for figures in configs:
        row = by_id.get(figures["median_run_id"])
        if row is not None:  # (a run deleted between the two reads)
            rows.append({**row, **figures, "config_runs": figures["n"]})
    parts = partition(board.group)
    groups: dict[tuple[Any, ...], list[float]] = {}
    for row in rows:
        groups.setdefault(tuple(row[c] for c in parts), []).append(row["median_tokens_per_s"])
    for row in rows:
        medians = groups[tuple(row[c] for c in parts)]
        row["rank"] = 1 + sum(m > row["median_tokens_per_s"] for m in medians)
        row["group_size"] = len(medians)
    rows.sort(key=lambda r: (r["model"], *((r[c] is None, "" if r[c] is None else r[c]) for c in parts), r["rank"], r["id"]))
    if board.sort is not None:
        column = BEST_SORTS.get(board.sort, board.sort)
        present = [r for r in rows if r[column] is not None]
        present.sort(key=lambda r: r[column], reverse=board.descending)  # stable: ties keep the order above
        rows = present + [r for r in rows if r[column] is None]
    return rows[board.offset : board.offset + board.limit], len(rows)


BEST_SORTS = {"tokens_per_s": "median_tokens_per_s", "config_runs": "n"}
"""Best per config, a sort by throughput is by the config's median."""


def _cell_medians(session: Session, board: Board) -> list[dict[str, Any]]:
    """Each config's figures as its cell holds them. Ranked within a workload a cell is a config;
    within a shape a config (shape and recipe) is one cell too, unless its runs' workload keys
    differ beyond the recipe columns — those few configs are read from their runs."""
    cols = [getattr(Cell, c) for c in board.config]
    query = select(*cols, Cell.runs, Cell.failed_runs, Cell.stated_runs, *(getattr(Cell, c) for c in FIGURES)).where(
        *_cell_conditions(board.filters, board.group)
    )
    cells: dict[tuple[Any, ...], list[Any]] = {}
    for r in session.execute(query):
        cells.setdefault(tuple(r[: len(cols)]), []).append(r)
    out: list[dict[str, Any]] = []
    split: list[tuple[Any, ...]] = []
    for key, members in cells.items():
        (cell, *more) = members
        if more or cell.median_run_id is None or cell.median_tokens_per_s is None:
            split.append(key)
            continue
        out.append(
            {"n": cell.runs, "runs": cell.runs, "failed_runs": cell.failed_runs, "stated_runs": cell.stated_runs}
            | {c: getattr(cell, c) for c in FIGURES}
        )
    if split:
        out += _config_medians(session, board, only=split)
    return out


def _config_medians(session: Session, board: Board, only: Sequence[tuple[Any, ...]] | None = None) -> list[dict[str, Any]]:
    """Each config's figures over the runs the filters keep (`only`: of these configs): its size
    first (an aggregate), then one window over the runs, of which only each config's
    `median_positions` come back."""
    config = board.config
    cols = [getattr(Entry, c) for c in config]
    conds = [*board.conds, *([_any_of(Entry, config, only)] if only is not None else [])]
    sizes = {n for (n,) in session.execute(select(func.count()).select_from(Entry).where(*conds).group_by(*cols))}
    if not sizes:
        return []
    ranked = select(
        *cols,
        Entry.id,
        Entry.tokens_per_s,
        func.row_number().over(partition_by=cols, order_by=(Entry.tokens_per_s, Entry.id)).label("pos"),
        func.count().over(partition_by=cols).label("n"),
        func.count(Entry.checks_failed).over(partition_by=cols).label("failed_runs"),
        func.count(Entry.checks_stated).over(partition_by=cols).label("stated_runs"),
    ).where(*conds)
    r = ranked.subquery("ranked")
    wanted = {n: sorted(median_positions(n)) for n in sizes}  # one to four positions each
    needed = or_(*(r.c.pos == case({n: ps[min(i, len(ps) - 1)] for n, ps in wanted.items()}, value=r.c.n, else_=-1) for i in range(4)))
    found: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in session.execute(select(r).where(needed)):
        key = tuple(row[: len(config)])
        entry = found.setdefault(key, {"n": row.n, "failed_runs": row.failed_runs, "stated_runs": row.stated_runs, "at": {}})
        entry["at"][row.pos] = (row.id, row.tokens_per_s)
    return [
        {"n": e["n"], "runs": e["n"], "failed_runs": e["failed_runs"], "stated_runs": e["stated_runs"], **config_figures(e["n"], e["at"])}
        for e in found.values()
    ]


def _every_run(session: Session, board: Board) -> tuple[list[dict[str, Any]], int]:
    """Every ranked run, a page at a time, without ranking them all.

    Within one group, rank order is throughput order, so "sort, model, group, rank, id" is the
    same order as "sort, model, group, tokens/s descending, id": the page's ids come from one
    index-ordered read of the narrow table (no window over every run), and only the page's rows
    get their rank (one plus the faster runs of their group, an index range count) and their
    config's run count. The two sorts no index holds are planned from the group and config sizes:
    by rank (`_by_rank`, either direction) and by runs per config (`_by_config_runs`).
    """
    filters, group, sort, group_cols = board.filters, board.group, board.sort, board.group_cols
    with_work_mem(session)
    known_ranks: dict[str, int] | None = None
    known_sizes: dict[str, dict[tuple[Any, ...], int]] = {}  # a planner's whole group or config sizes
    if sort == "rank":
        known_ranks, known_sizes["group_size"] = _by_rank(session, board)
        page_ids = list(known_ranks)
    elif sort == "config_runs":
        page_ids, known_sizes["config_runs"] = _by_config_runs(session, board)
    else:
        tail = _group_order(Entry, group_cols)
        first = [_direction(getattr(Entry, sort), board.descending)] if sort is not None else []
        # a shape grouping keeps only runs with a shape; when every run has one (the usual case, one
        # index look-up to know), leaving the test out keeps the sort index's read index-only
        shaped = board.conds if group == "workload" or _any_shapeless(session, filters) else _conditions(filters)
        ids_query = select(Entry.id).where(*shaped).order_by(*first, *tail, Entry.tokens_per_s.desc(), Entry.id)
        if board.after is None:
            page_ids = list(session.execute(ids_query.limit(board.limit).offset(board.offset)).scalars())
        else:
            page_ids = _after_key(session, board, ids_query)
    if known_sizes:  # a planner's sizes cover every competing run
        total = sum(next(iter(known_sizes.values())).values())
    else:  # a sum of the cells or the counts, not a count of every run
        source, conds = _tallies(board)
        total = session.execute(select(func.coalesce(func.sum(source.runs), 0)).where(*conds)).scalar_one()
    total = int(total)
    if not page_ids:
        return [], total
    query = select(*(getattr(Entry, c) for c in ROW_COLUMNS)).where(Entry.id.in_(page_ids))
    by_id = {r.id: dict(r._mapping) for r in session.execute(query)}
    rows = [by_id[i] for i in page_ids if i in by_id]
    counted = {"config_runs": board.config, "group_size": group_cols}
    tallies = {  # the planner's whole sizes, else the page's groups and configs (read once: the ranks use the groups')
        label: known_sizes.get(label) or _sizes(session, board, columns, only={tuple(row[c] for c in columns) for row in rows})
        for label, columns in counted.items()
    }
    ranks = known_ranks if known_ranks is not None else _page_ranks(session, board, rows, tallies["group_size"])
    for row in rows:
        row["rank"] = ranks[row["id"]]
        for label, columns in counted.items():
            row[label] = tallies[label].get(tuple(row[c] for c in columns), 0)
    return rows, total


def keyset_sort(sort: str | None) -> bool:
    """Whether every-run pages in this sort can be read after a key (an index order), not only at an offset."""
    return sort not in ("rank", "config_runs")


def page_columns(sort: str | None, group: str) -> list[str]:
    """The columns of the every-run board's whole order under `sort` and `group` (after the sort
    column: model, the group, throughput descending, id): a run's `page_key` is its values of them."""
    return [*([sort] if sort is not None else []), "model", *partition(group), "tokens_per_s", "id"]


def page_key(row: dict[str, Any], sort: str | None, group: str) -> list[Any]:
    """Where a row stands in the every-run board's order: the key a next page starts after."""
    return [row[c] for c in page_columns(sort, group)]


def _after_key(session: Session, board: Board, ids_query: Any) -> list[str]:
    """The ids of the page after `board.after` in the order `ids_query` reads, by keyset: the rows
    whose key comes later (nulls last in every column), each column compared in its direction.

    The first column also bounds the read (at or past the key's value), so Postgres starts its
    index scan there instead of counting off the rows before; the runs with no value in the sort
    column (last in either direction) are a second range, read only when the first runs out.
    """
    names = page_columns(board.sort, board.group)
    descending = [board.descending if board.sort is not None else False] * (board.sort is not None)
    descending += [False] * (len(names) - len(descending) - 2) + [True, False]
    cols = [Entry.__table__.c[c] for c in names]
    key = board.after or ()
    later: list[ColumnElement[bool]] = []
    for i, (col, desc, value) in enumerate(zip(cols, descending, key, strict=True)):
        if value is None:  # nothing but nulls come after a null, and they tie on it
            continue
        beyond: ColumnElement[bool] = col < value if desc else col > value
        if col.nullable:
            beyond = or_(beyond, col.is_(None))
        later.append(and_(*(c.is_(None) if v is None else c == v for c, v in zip(cols[:i], key[:i], strict=True)), beyond))
    after = or_(*later) if later else false()
    lead, first = cols[0], key[0]
    bound = [lead.is_(None)] if first is None else [lead <= first if descending[0] else lead >= first]
    ids = list(session.execute(ids_query.where(after, *bound).limit(board.limit)).scalars())
    if first is not None and lead.nullable and len(ids) < board.limit:
        ids += session.execute(ids_query.where(lead.is_(None)).limit(board.limit - len(ids))).scalars()
    return ids


def _page_ranks(session: Session, board: Board, rows: list[dict[str, Any]], sizes: dict[tuple[Any, ...], int]) -> dict[str, int]:
    """The rank of each run on a page: one plus the faster runs of its group (`sizes`: the
    competing runs of each group on the page).

    On Postgres, when the cells answer the filters, from their rank marks (`_ranks_by_marks`).
    Otherwise each group on the page is read from whichever end is nearer to its runs on the
    page, ranked as it streams: the runs above the group's middle from its fastest run down to
    the slowest of them (rank = one plus the runs read before, ties shared), the runs below it
    from its slowest run up to the fastest of them (rank = one plus the group's size minus the
    runs at most as fast). A page of random runs then reads about 0.4 of each of its groups rather
    than 0.67 (all of it at worst, half at worst per end). The middle is an estimate, the cells'
    median of medians (`_middles`): it only picks an end; every rank is exact either way.
    Elsewhere (SQLite: an embedded lab's few runs) each run's faster runs are counted.
    """
    filters, group, group_cols = board.filters, board.group, board.group_cols
    page_ids = [row["id"] for row in rows]
    if session.get_bind().dialect.name != "postgresql":
        other = aliased(Entry, name="other")
        faster = (
            select(func.count())
            .where(*_entry_conditions(filters, group, other), *_match(other, Entry, group_cols), other.tokens_per_s > Entry.tokens_per_s)
            .scalar_subquery()
        )
        return {run_id: int(n) + 1 for run_id, n in session.execute(select(Entry.id, faster).where(Entry.id.in_(page_ids)))}
    on_page: dict[tuple[Any, ...], list[float]] = {}
    for row in rows:
        on_page.setdefault(tuple(row[c] for c in group_cols), []).append(row["tokens_per_s"])
    if board.cellable:
        marked = _ranks_by_marks(session, board, rows, set(on_page))
        if marked is not None:
            return marked
    middles = _middles(session, group_cols, set(on_page))
    table = Entry.__table__
    plan = []
    for key, speeds in on_page.items():
        middle = middles.get(key, float("-inf"))
        upper, lower = [v for v in speeds if v >= middle], [v for v in speeds if v < middle]
        # (an end with none of the page's runs reads nothing: a floor above every run, a ceiling below)
        plan.append((*key, sizes.get(key, 0), min(upper, default=float("inf")), max(lower, default=float("-inf"))))
    groups = values(
        *(column(c, table.c[c].type) for c in group_cols),
        column("n", Integer),
        column("floor", table.c.tokens_per_s.type),
        column("ceiling", table.c.tokens_per_s.type),
        name="groups",
    ).data(plan)
    e = table.alias("e")
    competing = [*_entry_conditions(filters, group, e.c), *_match(e.c, groups.c, group_cols)]
    from_top = (
        select(e.c.id, func.rank().over(order_by=e.c.tokens_per_s.desc()).label("rank"))
        .where(*competing, e.c.tokens_per_s >= groups.c.floor)
        .order_by(e.c.tokens_per_s.desc())
        .lateral("from_top")
    )
    from_bottom = (
        select(e.c.id, (1 + groups.c.n - func.count().over(order_by=e.c.tokens_per_s.asc())).label("rank"))  # peers included
        .where(*competing, e.c.tokens_per_s <= groups.c.ceiling)
        .order_by(e.c.tokens_per_s.asc())
        .lateral("from_bottom")
    )
    ranks: dict[str, int] = {}
    for reached in (from_top, from_bottom):
        query = select(reached.c.id, reached.c.rank).select_from(groups.join(reached, true())).where(reached.c.id.in_(page_ids))
        ranks.update({run_id: int(rank) for run_id, rank in session.execute(query)})
    return ranks


def _ranks_by_marks(session: Session, board: Board, rows: list[dict[str, Any]], groups: set[tuple[Any, ...]]) -> dict[str, int] | None:
    """The page's ranks from its groups' cells' marks (`rank_marks`), when the cells answer the
    filters: for each run and each config of its group, the runs faster than the first mark at or
    above the run's throughput, plus the runs between the two — one short index range per
    (run, config), all counted in one statement. None when a config has no hardware key (its
    range is not indexable) or no marks yet: the caller reads the groups instead."""
    group_cols = board.group_cols
    cols = [getattr(Cell, c) for c in (*group_cols, *CONFIG)]
    which = _any_of(Cell, group_cols, groups)
    configs: dict[tuple[Any, ...], list[tuple[tuple[Any, ...], list[float], list[list[float]]]]] = {}
    for cell in session.execute(select(*cols, Cell.marks).where(*_cell_conditions(board.filters, board.group), which)):
        config = tuple(cell[len(group_cols) : len(group_cols) + len(CONFIG)])
        if cell.marks is None or any(v is None for v in config):
            return None
        configs.setdefault(tuple(cell[: len(group_cols)]), []).append((config, [m[0] for m in cell.marks], cell.marks))
    faster: dict[str, int] = {}
    bands: list[tuple[Any, ...]] = []
    for row in rows:
        faster[row["id"]] = 0
        x = row["tokens_per_s"]
        for config, speeds, marks in configs.get(tuple(row[c] for c in group_cols), []):
            i = bisect_left(speeds, x)
            if i == len(marks):  # faster than every run of this config
                continue
            mark, above = marks[i]
            faster[row["id"]] += int(above)
            if mark > x:
                bands.append((row["id"], *config, x, mark))
    if bands:
        table = Entry.__table__
        names = ("run_id", *CONFIG, "lo", "hi")
        types = (table.c.id.type, *(table.c[c].type for c in CONFIG), table.c.tokens_per_s.type, table.c.tokens_per_s.type)
        columns = list(zip(*bands, strict=True))  # one array per column: a few parameters, not one per value
        arrays = [
            bindparam(f"band_{name}", list(values), type_=ARRAY(kind)) for name, values, kind in zip(names, columns, types, strict=True)
        ]
        band = func.unnest(*arrays).table_valued(*names).render_derived(name="band")
        e = table.alias("e")
        between = (
            select(func.count())
            .where(
                *_conditions(board.filters, e.c),
                *(e.c[c] == band.c[c] for c in CONFIG),
                e.c.tokens_per_s > band.c.lo,
                e.c.tokens_per_s <= band.c.hi,
            )
            .scalar_subquery()
        )
        for run_id, n in session.execute(select(band.c.run_id, between)):
            faster[run_id] += int(n)
    return {run_id: n + 1 for run_id, n in faster.items()}


def _middles(session: Session, group_cols: Sequence[str], keys: set[tuple[Any, ...]]) -> dict[tuple[Any, ...], float]:
    """An estimate of each group's middle throughput: the median of its configs' medians, each
    weighted by its runs (every run's cells: a few rows a group)."""
    cols = [getattr(Cell, c) for c in group_cols]
    which = _any_of(Cell, group_cols, keys)
    query = select(*cols, Cell.runs, Cell.median_tokens_per_s).where(Cell.subset == "all", Cell.median_tokens_per_s.is_not(None), which)
    configs: dict[tuple[Any, ...], list[tuple[float, int]]] = {}
    for row in session.execute(query):
        configs.setdefault(tuple(row[: len(cols)]), []).append((row.median_tokens_per_s, row.runs))
    middles: dict[tuple[Any, ...], float] = {}
    for key, medians in configs.items():
        medians.sort()
        half, seen = sum(n for _, n in medians) / 2, 0
        for median, n in medians:
            seen += n
            if seen >= half:
                middles[key] = median
                break
    return middles


def _any_shapeless(session: Session, filters: dict[str, Any]) -> bool:
    """Whether a run the filters keep has no shape key (a CI upload whose workload no longer resolves)."""
    return bool(session.execute(select(exists().where(Entry.shape_key.is_(None), *_conditions(filters)))).scalar())


def _group_order(rows: Any, group_cols: Sequence[str]) -> list[ColumnElement]:
    """The board's order after its sort column: model, then the group (nulls last on every database)."""
    return [rows.model, *(getattr(rows, c).asc().nulls_last() for c in group_cols)]


def _direction(column: Any, descending: bool) -> ColumnElement:
    """A sort column's order: nulls last either way, on every database (group columns sort
    ascending, nulls last too: SQLite would put them first, Postgres' index order is the same)."""
    return (column.desc() if descending else column.asc()).nulls_last()


def _entry_conditions(filters: dict[str, Any], group: str, table: Any = Entry) -> list[ColumnElement[bool]]:
    """The runs that compete under `filters` and `group` (a shape-based group needs a shape)."""
    return [*_conditions(filters, table), *([] if group == "workload" else [table.shape_key.is_not(None)])]


def _cell_conditions(filters: dict[str, Any], group: str) -> list[ColumnElement[bool]]:
    """The cells that hold the runs `_entry_conditions` keeps, when every filter is a cell's
    (CELL_FILTERS; the check filters choose the subset)."""
    kept = {k: v for k, v in filters.items() if k in CELL_FILTERS}
    return [*_entry_conditions(kept, group, Cell), Cell.subset == subset_of(filters)]


def _equals(table: Any, columns: Sequence[str], values: Sequence[Any]) -> list[ColumnElement[bool]]:
    """Equality with given values on `columns`, null-safe off the keyed columns (as `_match`)."""
    return [
        getattr(table, c) == v if c in KEYED else getattr(table, c).is_not_distinct_from(v) for c, v in zip(columns, values, strict=True)
    ]


def _any_of(table: Any, columns: Sequence[str], keys: Iterable[Sequence[Any]]) -> ColumnElement[bool]:
    """Rows whose `columns` equal one of `keys` (`_equals` each)."""
    return or_(*(and_(*_equals(table, columns, key)) for key in keys))


def _sizes(session: Session, board: Board, columns: Sequence[str], only: set[tuple[Any, ...]] | None = None) -> dict[tuple[Any, ...], int]:
    """How many competing runs each value of `columns` (a group or a config) has, summed from the
    cells or the counts (`_tallies`); `only` restricts it to a few values (a page's)."""
    source, conds = _tallies(board)
    cols = [getattr(source, c) for c in columns]
    which = [] if only is None else [_any_of(source, columns, only)]
    query = select(*cols, cast(func.sum(source.runs), Integer)).where(*conds, *which)
    return {tuple(r[:-1]): int(r[-1]) for r in session.execute(query.group_by(*cols))}


def _tallies(board: Board) -> tuple[Any, list[ColumnElement[bool]]]:
    """Where the board's run counts are summed from, and which of its rows: the cells when they
    answer every filter (a few hundred rows), else the counts (a few thousand: every filter is a
    counts column) — never the runs."""
    if board.cellable:
        return Cell, _cell_conditions(board.filters, board.group)
    return Count, _entry_conditions(board.filters, board.group, Count)


def _by_config_runs(session: Session, board: Board) -> tuple[list[str], dict[tuple[Any, ...], int]]:
    """A page of every run sorted by runs per config, planned from the config sizes: rows of one
    (runs, model, group) block are that block's configs' runs by throughput, and blocks come in
    the configs' order, so only the blocks the page overlaps are read. Returns the page's ids and
    every config's size."""
    config, group_cols, conds, offset, limit = board.config, board.group_cols, board.conds, board.offset, board.limit
    source, tallied = _tallies(board)
    cols = [getattr(source, c) for c in config]
    sized = select(cast(func.sum(source.runs), Integer).label("runs"), func.min(source.model).label("model"), *cols).where(*tallied)
    configs = sized.group_by(*cols).subquery("configs")
    ordered = select(configs).order_by(
        configs.c.runs.desc() if board.descending else configs.c.runs.asc(),
        *_group_order(configs.c, group_cols),
    )
    blocks: list[tuple[int, tuple[Any, ...], list[tuple[Any, ...]]]] = []  # (runs, its sort key, member configs)
    sizes: dict[tuple[Any, ...], int] = {}
    for row in session.execute(ordered):
        head = (row.runs, row.model, *(getattr(row, c) for c in group_cols))
        member = tuple(getattr(row, c) for c in config)
        sizes[member] = row.runs
        if blocks and blocks[-1][1] == head:
            blocks[-1] = (blocks[-1][0] + row.runs, head, [*blocks[-1][2], member])
        else:
            blocks.append((row.runs, head, [member]))
    ids: list[str] = []
    start = 0
    for size, _, members in blocks:
        end = start + size
        if end > offset and start < offset + limit:
            lo = max(0, offset - start)
            which = [and_(*_equals(Entry, config, m)) for m in members]
            ids += session.execute(
                select(Entry.id)
                .where(*conds, or_(*which))
                .order_by(Entry.tokens_per_s.desc(), Entry.id)
                .offset(lo)
                .limit(offset + limit - start - lo)
            ).scalars()
        if end >= offset + limit:
            break
        start = end
    return ids, sizes


def _by_rank(session: Session, board: Board) -> tuple[dict[str, int], dict[tuple[Any, ...], int]]:
    """A page of every run sorted by rank (either direction). Returns {run id: rank} in page
    order, and the group sizes it was planned from.

    On Postgres only the band of ranks the page lies in is sorted, from the end of each group that
    reaches it (`_rank_band_rows`); elsewhere (SQLite: an embedded lab's few runs) one window
    ranks them all.
    """
    group_cols, descending, offset, limit = board.group_cols, board.descending, board.offset, board.limit
    sizes = _sizes(session, board, group_cols)
    total = sum(sizes.values())
    if offset >= total:
        return {}, sizes
    if session.get_bind().dialect.name != "postgresql":
        ranks = (
            select(
                Entry.id,
                Entry.model,
                *(getattr(Entry, c) for c in group_cols),
                func.rank().over(partition_by=[getattr(Entry, c) for c in group_cols], order_by=Entry.tokens_per_s.desc()).label("rank"),
            )
            .where(*board.conds)
            .subquery("ranks")
        )
        page = _rank_order(select(ranks.c.id, ranks.c.rank), ranks, group_cols, descending).offset(offset).limit(limit)
        return {run_id: int(rank) for run_id, rank in session.execute(page)}, sizes
    end = min(offset + limit, total)
    ra, rb = rank_band(sizes, offset=offset, end=end, descending=descending)
    step = 1
    while True:
        band, before = _rank_band_rows(session, board, sizes=sizes, band=(ra, rb))
        # ties rank more runs better than the sizes promise: best first, more may rank above the
        # band than the page skips; worst first, fewer may rank in or below it than the page needs
        short = before > offset if not descending else before + len(band) < end
        if not short or ra <= 1:
            start = offset - before
            return {run_id: rank for run_id, rank in band[start : start + limit]}, sizes
        ra, step = max(1, ra - step), step * 2


def rank_band(sizes: dict[tuple[Any, ...], int], *, offset: int, end: int, descending: bool) -> tuple[int, int]:
    """The band of ranks [ra, rb] that rows offset..end of the board lie in, from the group sizes.

    In a group of n runs at least min(r, n) rank r or better (exactly that many without ties;
    ties rank more of them better), and that grows with r, so each edge is a bisection. Best
    first: at least `end` runs rank rb or better, at most `offset` (without ties) better than ra.
    Worst first: at most `offset` runs rank worse than rb, at least `end` (without ties) ra or
    worse.
    """
    ranks = range(max(sizes.values()) + 1)
    total = sum(sizes.values())

    def at_least(r: int) -> int:
        return sum(min(r, n) for n in sizes.values())

    def first_reaching(target: int) -> int:
        return bisect_left(ranks, target, key=at_least)

    def last_within(target: int) -> int:
        return bisect_right(ranks, target, key=at_least) - 1

    if not descending:
        return last_within(offset) + 1, first_reaching(end)
    return last_within(total - end) + 1, first_reaching(total - offset)


def _rank_band_rows(
    session: Session, board: Board, *, sizes: dict[tuple[Any, ...], int], band: tuple[int, int]
) -> tuple[list[tuple[str, int]], int]:
    """One statement: the runs ranked in [ra, rb], in the board's order, and how many runs come
    before the band (best first, rank < ra; worst first, rank > rb).

    Each group is read from one end in index order, only as far as the band reaches, and ranked
    as it streams (no sort of the group): best first, its rb fastest runs (ties at the cut
    included: FETCH ... WITH TIES) hold every run of rank <= rb, each ranked by the runs read
    before it; worst first, its n - ra + 1 slowest runs (ties included) hold every run of rank
    >= ra, each ranked 1 + n minus the runs at most as fast. Only the band's rows are sorted.
    """
    ra, rb = band
    group_cols, descending = board.group_cols, board.descending
    table = Entry.__table__
    groups = values(*(column(c, table.c[c].type) for c in group_cols), column("n", Integer), column("take", Integer), name="groups").data(
        [(*key, n, min(n, rb) if not descending else max(0, n - ra + 1)) for key, n in sizes.items()]
    )
    e = table.alias("e")
    if descending:
        rank = 1 + groups.c.n - func.count().over(order_by=e.c.tokens_per_s.asc())  # peers included
    else:
        rank = func.rank().over(order_by=e.c.tokens_per_s.desc())
    reached = (
        select(e.c.id, e.c.model, *(e.c[c] for c in group_cols), rank.label("rank"))
        .where(*_entry_conditions(board.filters, board.group, e.c), *_match(e.c, groups.c, group_cols))
        .order_by(e.c.tokens_per_s.asc() if descending else e.c.tokens_per_s.desc())
        .fetch(groups.c.take, with_ties=True)
        .lateral("reached")
    )
    rows = select(reached).select_from(groups.join(reached, true())).cte("rows")
    before = select(func.count()).select_from(rows).where(rows.c.rank > rb if descending else rows.c.rank < ra).scalar_subquery()
    query = _rank_order(select(rows.c.id, rows.c.rank, before.label("before")), rows, group_cols, descending).where(
        rows.c.rank.between(ra, rb)
    )
    found = session.execute(query).all()
    counted = found[0].before if found else session.execute(select(before)).scalar_one()
    return [(run_id, int(rank)) for run_id, rank, _ in found], int(counted)


def _rank_order(query: Any, ranked: Any, group_cols: Sequence[str], descending: bool) -> Any:
    """The board's order when sorted by rank: rank, model, group, id."""
    return query.order_by(_direction(ranked.c.rank, descending), *_group_order(ranked.c, group_cols), ranked.c.id)


def with_work_mem(session: Session) -> None:
    """Give this transaction's sorts of the narrow table room in memory (Postgres; a no-op on SQLite)."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text(f"SET LOCAL work_mem = '{SORT_WORK_MEM}'"))


def specs(session: Session, run_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The job specs of a few runs (for group labels): small JSON, never result documents."""
    if not run_ids:
        return {}
    return {run_id: spec for run_id, spec in session.execute(select(Run.id, Run.spec).where(Run.id.in_(list(run_ids))))}


def filter_values(session: Session) -> dict[str, list[Any]]:
    """Distinct values of each filter over ranked runs, for the filter menus: the config's columns
    from the cells (a few hundred rows), the run's own (source, branch, user) by a skip scan of
    their index — never a pass over every run."""
    out: dict[str, list[Any]] = {}
    cell_columns = [name for name in FILTERS if name in CELL_FILTERS]
    combos = session.execute(select(*(getattr(Cell, name) for name in cell_columns)).where(Cell.subset == "all").distinct()).all()
    for i, name in enumerate(cell_columns):
        out[name] = sorted({row[i] for row in combos if row[i] is not None})
    for name in FILTERS:
        if name not in CELL_FILTERS:
            out[name] = sorted(v for v in session.execute(text(SKIP_SCAN.format(column=name))).scalars() if v is not None)
    return {name: out[name] for name in FILTERS}


SKIP_SCAN = (
    "WITH RECURSIVE skip(v) AS (SELECT min({column}) FROM leaderboard_entries UNION ALL "
    "SELECT (SELECT min({column}) FROM leaderboard_entries WHERE {column} > skip.v) FROM skip WHERE skip.v IS NOT NULL) "
    "SELECT v FROM skip WHERE v IS NOT NULL"
)
"""One column's distinct values, one index look-up each (Postgres has no loose index scan)."""


def workload_groups(session: Session) -> list[dict[str, Any]]:
    """Every (workload, hardware) group: its size, how many world sizes, and one run to label it.

    Summed from the maintained cells (one per config over all its runs: a few hundred rows), never
    from the runs: counted per (group, world size) first, so the distinct world sizes are a count.
    """
    sizes = (
        select(
            Cell.workload_key,
            Cell.hardware_key,
            Cell.world_size,
            func.min(Cell.model).label("model"),
            func.sum(Cell.runs).label("runs"),
            func.min(Cell.median_run_id).label("sample_id"),
        )
        .where(Cell.subset == "all")
        .group_by(Cell.workload_key, Cell.hardware_key, Cell.world_size)
        .subquery("sizes")
    )
    query = (
        select(
            sizes.c.workload_key,
            sizes.c.hardware_key,
            func.min(sizes.c.model).label("model"),
            func.sum(sizes.c.runs).label("runs"),
            func.count().label("world_sizes"),
            func.min(sizes.c.sample_id).label("sample_id"),
        )
        .group_by(sizes.c.workload_key, sizes.c.hardware_key)
        .order_by(func.count().desc(), func.sum(sizes.c.runs).desc(), sizes.c.workload_key)
    )
    return [{**r._mapping, "runs": int(r.runs)} for r in session.execute(query)]


def scaling_points(session: Session, *, workload_key: str, hardware_key: str) -> list[dict[str, Any]]:
    """Best tokens/s per (strategy, world size) within one group, from its configs' cells."""
    query = (
        select(
            Cell.strategy,
            Cell.world_size,
            func.max(Cell.best_tokens_per_s).label("tokens_per_s"),
            cast(func.sum(Cell.runs), Integer).label("runs"),
        )
        .where(Cell.subset == "all", Cell.workload_key == workload_key, Cell.hardware_key == hardware_key)
        .group_by(Cell.strategy, Cell.world_size)
        .order_by(Cell.strategy, Cell.world_size)
    )
    return [dict(r._mapping) for r in session.execute(query)]
