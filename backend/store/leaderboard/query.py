"""Reading the leaderboard and the scaling page from the maintained narrow tables, never result documents.

Nothing here ranks or sorts every run (measured at 100,000 runs by benchmarks/queries.py): a
page of every run comes from an index in the board's whole order, or — for the two sorts no index
holds, by rank and by runs per config — is planned from the group and config sizes and reads only
the runs it can reach, its sizes summed from the counts; best-per-config reads the cells. Only the
page's rows get their rank and counts (`dialect`: the plans that differ by database).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Integer,
    and_,
    any_,
    bindparam,
    case,
    cast,
    exists,
    false,
    func,
    or_,
    select,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Session

from backend.models import LeaderboardCell as Cell
from backend.models import LeaderboardEntry as Entry
from backend.models import Run
from backend.models.leaderboard import SORTED_COLUMNS
from backend.store.leaderboard.board import (
    CELL_FILTERS,
    CONFIG,
    FILTERS,
    ROW_COLUMNS,
    SORTABLE,
    Board,
    any_of,
    cell_conditions,
    conditions,
    direction,
    equals,
    group_order,
    match,
    partition,
    tallied_sizes,
    tally_source,
)
from backend.store.leaderboard.dialect import by_rank, page_ranks, with_work_mem
from backend.store.leaderboard.maintain import FIGURES, config_figures, median_positions


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
    parts = partition(board.group)
    # every config's median run, only the columns that rank and order the configs; the page's rows whole after
    ordering = [c for c in ROW_COLUMNS if c in {"id", "model", *parts, BEST_SORTS.get(board.sort or "", board.sort)}]
    by_id = _rows_by_id(session, ordering, [c["median_run_id"] for c in configs])
    rows: list[dict[str, Any]] = []
    for figures in configs:
        row = by_id.get(figures["median_run_id"])
        if row is not None:  # (a run deleted between the two reads)
            rows.append({**row, **figures, "config_runs": figures["n"]})
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
    page = rows[board.offset : board.offset + board.limit]
    whole = _rows_by_id(session, ROW_COLUMNS, [r["id"] for r in page])
    return [{**whole[r["id"]], **r} for r in page if r["id"] in whole], len(rows)


def _rows_by_id(session: Session, columns: Sequence[str], ids: list[str]) -> dict[str, dict[str, Any]]:
    """These runs' `columns` (id among them) by id, 5,000 at a time (on Postgres the ids sent as one
    array, not a parameter each)."""
    by_id: dict[str, dict[str, Any]] = {}
    postgres = session.get_bind().dialect.name == "postgresql"
    for chunk in range(0, len(ids), 5000):
        some = ids[chunk : chunk + 5000]
        which = Entry.id == any_(bindparam("ids", some, type_=ARRAY(Entry.id.type))) if postgres else Entry.id.in_(some)
        query = select(*(getattr(Entry, c) for c in columns)).where(which)
        by_id.update({r.id: dict(r._mapping) for r in session.execute(query)})
    return by_id


BEST_SORTS = {"tokens_per_s": "median_tokens_per_s", "config_runs": "n"}
"""Best per config, a sort by throughput is by the config's median."""


def _cell_medians(session: Session, board: Board) -> list[dict[str, Any]]:
    """Each config's figures as its cell holds them. Ranked within a workload a cell is a config;
    within a shape a config (shape and recipe) is one cell too, unless its runs' workload keys
    differ beyond the recipe columns — those few configs are read from their runs."""
    cols = [getattr(Cell, c) for c in board.config]
    query = select(*cols, Cell.runs, Cell.failed_runs, Cell.stated_runs, *(getattr(Cell, c) for c in FIGURES)).where(
        *cell_conditions(board.filters, board.group)
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
    conds = [*board.conds, *([any_of(Entry, config, only)] if only is not None else [])]
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
    by rank (`by_rank`, either direction) and by runs per config (`_by_config_runs`).
    """
    filters, group, sort, group_cols = board.filters, board.group, board.sort, board.group_cols
    if sort not in INDEXED_SORTS or group != "workload" or not board.cellable:  # a sort, or the groups' ranges read, may need room
        with_work_mem(session)
    known_ranks: dict[str, int] | None = None
    known_sizes: dict[str, dict[tuple[Any, ...], int]] = {}  # a planner's whole group or config sizes
    if sort == "rank":
        known_ranks, known_sizes["group_size"] = by_rank(session, board)
        page_ids = list(known_ranks)
    elif sort == "config_runs":
        page_ids, known_sizes["config_runs"] = _by_config_runs(session, board)
    else:
        tail = group_order(Entry, group_cols)
        first = [direction(getattr(Entry, sort), board.descending)] if sort is not None else []
        # a shape grouping keeps only runs with a shape; when every run has one (the usual case, one
        # index look-up to know), leaving the test out keeps the sort index's read index-only
        shaped = board.conds if group == "workload" or _any_shapeless(session, filters) else conditions(filters)
        ids_query = select(Entry.id).where(*shaped).order_by(*first, *tail, Entry.tokens_per_s.desc(), Entry.id)
        if board.after is None and _from_sort_index(board):
            page_ids = _deep_grouped_page(session, board, shaped, ids_query)
        elif board.after is None:
            page_ids = list(session.execute(ids_query.limit(board.limit).offset(board.offset)).scalars())
        else:
            page_ids = _after_key(session, board, ids_query)
    counted = {"config_runs": board.config, "group_size": group_cols}
    # every config's size (the planner's, else one sum of the cells or the counts — never a count of
    # every run); each group's is the sum of its configs' (a group's columns are among a config's),
    # unless a planner knows it, and the total the sum of them all
    configs = known_sizes.get("config_runs") or tallied_sizes(session, board, board.config)
    tallies = {"config_runs": configs, "group_size": known_sizes.get("group_size") or summed(configs, board.config, group_cols)}
    total = sum(tallies["group_size"].values())
    if not page_ids:
        return [], total
    cells = Cell.__table__
    analysed = and_(*match(cells.c, Entry, CONFIG), cells.c.subset == "all", cells.c.straggler_analysed > 0)
    query = (
        select(*(getattr(Entry, c) for c in ROW_COLUMNS), cells.c.straggler_runs, cells.c.straggler_analysed)
        .select_from(Entry.__table__.outerjoin(cells, analysed))
        .where(Entry.id.in_(page_ids))
    )
    by_id = {r.id: dict(r._mapping) for r in session.execute(query)}  # with its config's straggler counts (as `straggler_counts`)
    rows = [by_id[i] for i in page_ids if i in by_id]
    ranks = known_ranks if known_ranks is not None else page_ranks(session, board, rows, tallies["group_size"])
    for row in rows:
        row["rank"] = ranks[row["id"]]
        for label, columns in counted.items():
            row[label] = tallies[label].get(tuple(row[c] for c in columns), 0)
    return rows, total


INDEXED_SORTS = frozenset({None, *SORTED_COLUMNS})
"""The every-run sorts an index holds in the board's whole order when ranked within a workload
(None: the default order's index); under another grouping the order's tail differs from the index's."""


def summed(sizes: dict[tuple[Any, ...], int], columns: Sequence[str], within: Sequence[str]) -> dict[tuple[Any, ...], int]:
    """Sizes keyed by `columns` summed by `within` (some of those columns)."""
    at = [list(columns).index(c) for c in within]
    out: dict[tuple[Any, ...], int] = {}
    for key, n in sizes.items():
        part = tuple(key[i] for i in at)
        out[part] = out.get(part, 0) + n
    return out


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


DEEP_FROM_INDEX = 1000
"""From this offset on, a page of every run grouped by other than the workload and sorted by a
measured column is found in its sort index's own order first (`_deep_grouped_page`)."""
MEASURED_SORTS = frozenset(SORTED_COLUMNS) - {"strategy", "precision", "source", "branch"}
"""The indexed sorts whose values rarely tie: a run's (value, model) holds few runs (a label's holds thousands)."""
PREFIX_CAP = 5000
"""The most runs of one (value, model) a deep grouped page reads to place itself; beyond, the plain query."""


def _from_sort_index(board: Board) -> bool:
    """Whether a page of every run is read through `_deep_grouped_page`."""
    return board.group != "workload" and board.sort in MEASURED_SORTS and board.offset >= DEEP_FROM_INDEX


def _deep_grouped_page(session: Session, board: Board, shaped: Sequence[ColumnElement[bool]], ids_query: Any) -> list[str]:
    """A deep page of every run sorted by a measured column under a shape or recipe grouping,
    without sorting the runs before it.

    The sort's index orders runs by (value, model, workload, hardware, throughput descending, id);
    the board by (value, model, the group's columns, throughput descending, id): the two agree on
    (value, model), so the run at the page's offset in the index's order has the (value, model) of
    the board's run there. That run is read from the index at the offset (a skip, no sort: the
    board's order re-sorts every (value, model) on the way, which at offset 50,000 cost twice the
    skip); the runs of its (value, model) before it in the index's order say how far into that
    (value, model) the page starts; the page is then read in the board's order from the first run of
    that (value, model) on. A (value, model) of more than PREFIX_CAP runs takes the plain query."""
    sort = board.sort or ""
    lead = getattr(Entry, sort)
    index_tail = [Entry.workload_key, Entry.hardware_key, *([Entry.tokens_per_s.desc()] if sort != "tokens_per_s" else []), Entry.id]
    index_order = [direction(lead, board.descending), Entry.model, *index_tail]
    at = session.execute(select(lead, Entry.model, Entry.id).where(*shaped).order_by(*index_order).offset(board.offset).limit(1)).first()
    if at is None:
        return []
    value, model, run_id = at
    same = [lead.is_(None) if value is None else lead == value, Entry.model == model]
    prefix = list(session.execute(select(Entry.id).where(*shaped, *same).order_by(*index_order).limit(PREFIX_CAP + 1)).scalars())
    if len(prefix) > PREFIX_CAP or run_id not in prefix:  # (or the run went between the two reads)
        return list(session.execute(ids_query.limit(board.limit).offset(board.offset)).scalars())
    into = prefix.index(run_id)
    if value is None:  # nulls come last: from this model on among them
        return list(session.execute(ids_query.where(lead.is_(None), Entry.model >= model).offset(into).limit(board.limit)).scalars())
    beyond = lead < value if board.descending else lead > value
    bound = lead <= value if board.descending else lead >= value
    first = ids_query.where(bound, or_(beyond, Entry.model >= model))
    ids = list(session.execute(first.offset(into).limit(board.limit)).scalars())
    if lead.nullable and len(ids) < board.limit:  # then the runs with no value, last in either direction
        ids += session.execute(ids_query.where(lead.is_(None)).limit(board.limit - len(ids))).scalars()
    return ids


def _any_shapeless(session: Session, filters: dict[str, Any]) -> bool:
    """Whether a run the filters keep has no shape key (a CI upload whose workload no longer resolves)."""
    return bool(session.execute(select(exists().where(Entry.shape_key.is_(None), *conditions(filters)))).scalar())


def _by_config_runs(session: Session, board: Board) -> tuple[list[str], dict[tuple[Any, ...], int]]:
    """A page of every run sorted by runs per config, planned from the config sizes: rows of one
    (runs, model, group) block are that block's configs' runs by throughput, and blocks come in
    the configs' order, so only the blocks the page overlaps are read. Returns the page's ids and
    every config's size."""
    config, group_cols, conds, offset, limit = board.config, board.group_cols, board.conds, board.offset, board.limit
    source, tallied = tally_source(board)
    cols = [getattr(source, c) for c in config]
    sized = select(cast(func.sum(source.runs), Integer).label("runs"), func.min(source.model).label("model"), *cols).where(*tallied)
    configs = sized.group_by(*cols).subquery("configs")
    ordered = select(configs).order_by(
        configs.c.runs.desc() if board.descending else configs.c.runs.asc(),
        *group_order(configs.c, group_cols),
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
            which = [and_(*equals(Entry, config, m)) for m in members]
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


def straggler_counts(session: Session, run_ids: Sequence[str]) -> dict[str, tuple[int, int]]:
    """{run id: (its config's ranked runs with a rank named a straggler, those the analysis covered)}
    for the runs on a page, from their configs' cells (one statement whose text does not change
    with the page); a run whose config has no analysed run is left out."""
    if not run_ids:
        return {}
    page = Entry.__table__.alias("page")
    cells = Cell.__table__
    query = (
        select(page.c.id, cells.c.straggler_runs, cells.c.straggler_analysed)
        .select_from(page.join(cells, and_(*match(cells.c, page.c, CONFIG), cells.c.subset == "all")))
        .where(page.c.id.in_(list(run_ids)), cells.c.straggler_analysed > 0)
    )
    return {run_id: (int(named), int(analysed)) for run_id, named, analysed in session.execute(query)}
