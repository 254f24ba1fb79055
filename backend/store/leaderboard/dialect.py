"""The leaderboard's plans that differ by database: Postgres gets the ones that need LATERAL,
FETCH ... WITH TIES, arrays and advisory locks; SQLite (an embedded lab's few runs) simpler
windows over what the filters keep, with the same results."""

from __future__ import annotations

import json
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    Float,
    Integer,
    Text,
    any_,
    bindparam,
    cast,
    column,
    exists,
    func,
    select,
    text,
    true,
    values,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Session, aliased

from backend.models import LeaderboardCell as Cell
from backend.models import LeaderboardEntry as Entry
from backend.store.leaderboard.board import (
    CONFIG,
    SORT_WORK_MEM,
    Board,
    any_of,
    cell_conditions,
    conditions,
    direction,
    entry_conditions,
    group_order,
    match,
    tallied_sizes,
)


def page_ranks(session: Session, board: Board, rows: list[dict[str, Any]], sizes: dict[tuple[Any, ...], int]) -> dict[str, int]:
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
            .where(*entry_conditions(filters, group, other), *match(other, Entry, group_cols), other.tokens_per_s > Entry.tokens_per_s)
            .scalar_subquery()
        )
        return {run_id: int(n) + 1 for run_id, n in session.execute(select(Entry.id, faster).where(Entry.id.in_(page_ids)))}
    if board.cellable:
        marked = _ranks_by_marks(session, board, rows)
        if marked is not None:
            return marked
    on_page: dict[tuple[Any, ...], list[float]] = {}
    for row in rows:
        on_page.setdefault(tuple(row[c] for c in group_cols), []).append(row["tokens_per_s"])
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
    competing = [*entry_conditions(filters, group, e.c), *match(e.c, groups.c, group_cols)]
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


def _ranks_by_marks(session: Session, board: Board, rows: list[dict[str, Any]]) -> dict[str, int] | None:
    """The page's ranks from its groups' cells' marks (`rank_marks`), when the cells answer the
    filters: for each run and each config of its group, the runs faster than the first mark at or
    above the run's throughput, plus the runs between the two. Where that mark's position follows
    the mark below it (a config with no more runs than marks: every mark), no run lies between the
    two marks and the run's faster runs of that config are every run from the mark's position up;
    otherwise the runs in the band are one short index range per (run, config), all counted and
    summed per run in one statement — sent only when some band needs it.

    At most two statements whose text does not depend on the page: the cells of the page's groups
    (found from the page's ids), and the counts of the bands, sent as four arrays of numbers (the
    band's run on the page, its cell's id, its bounds). None when a config has no hardware key (its
    range is not indexable) or no marks yet: the caller reads the groups instead."""
    group_cols = board.group_cols
    cells, table = Cell.__table__, Entry.__table__
    page = table.alias("page")
    on_page = exists().where(page.c.id == any_(bindparam("page_ids", [row["id"] for row in rows], type_=ARRAY(table.c.id.type))))
    query = select(cells.c.id, cells.c.runs, *(cells.c[c] for c in group_cols), cast(cells.c.marks, Text).label("marks")).where(
        *cell_conditions(board.filters, board.group), on_page.where(*match(page.c, cells.c, group_cols))
    )
    configs: dict[tuple[Any, ...], list[tuple[int, int, Marks]]] = {}
    for cell in session.execute(query):
        if cell.marks is None or cell.hardware_key is None:
            return None
        configs.setdefault(tuple(cell[2 : 2 + len(group_cols)]), []).append((cell.id, cell.runs, _decoded_marks(cell.marks)))
    faster = [0] * len(rows)
    bands: list[list[Any]] = [[], [], [], []]  # each band's run on the page, cell id, low and high bound
    for at, row in enumerate(rows):
        x = row["tokens_per_s"]
        for cell_id, n, (speeds, above, follows) in configs.get(tuple(row[c] for c in group_cols), []):
            i = bisect_left(speeds, x)
            if i == len(speeds):  # faster than every run of this config
                continue
            mark = speeds[i]
            if mark > x and follows[i] >= 0:  # no run between the marks: those from the mark up are faster
                faster[at] += n - follows[i]
                continue
            faster[at] += above[i]
            if mark > x:
                for column, value in zip(bands, (at, cell_id, x, mark), strict=True):
                    column.append(value)
    if bands[0]:
        kinds = (Integer, Integer, Float, Float)
        arrays: list[Any] = [
            cast(bindparam(f"band_{n}", _array_text(v), type_=Text), ARRAY(k))
            for n, v, k in zip(("at", "cell", "lo", "hi"), bands, kinds, strict=True)
        ]
        band = func.unnest(*arrays).table_valued("at", "cell", "lo", "hi").render_derived(name="band")
        owner, e = cells.alias("owner"), table.alias("e")
        between = (
            select(func.count())
            .where(
                *conditions(board.filters, e.c),
                *(e.c[c] == owner.c[c] for c in CONFIG),
                e.c.tokens_per_s > band.c.lo,
                e.c.tokens_per_s <= band.c.hi,
            )
            .scalar_subquery()
        )
        summed = select(band.c.at, func.sum(between)).select_from(band.join(owner, owner.c.id == band.c.cell)).group_by(band.c.at)
        for at, n in session.execute(summed):
            faster[at] += int(n)
    return {row["id"]: n + 1 for row, n in zip(rows, faster, strict=True)}


Marks = tuple["array[float]", "array[int]", "array[int]"]
"""A cell's marks decoded: their throughputs (ascending, for bisection), the runs faster than
each, and each mark's position where it directly follows the mark below it (no run between the
two), else -1 (marks written before positions were kept say -1 throughout)."""
MARKS_KEPT = 4096
"""Decoded marks kept in memory, keyed by their JSON text (a few kB each; about 8 bytes a number decoded)."""
_marks: dict[str, Marks] = {}


def _decoded_marks(text: str) -> Marks:
    """A cell's marks from their JSON text, as flat arrays (`Marks`): decoded once per distinct
    text, not per page — a page reads the marks of every config of its groups, and a cell's marks
    change only when its config's runs do (the text then differs). Never mutated by a reader; kept
    whole until MARKS_KEPT texts, then started afresh."""
    found = _marks.get(text)
    if found is None:
        marks = json.loads(text)
        positions = [int(m[2]) if len(m) > 2 else None for m in marks]
        before = [-1, *positions[:-1]]
        follows = [p if p is not None and b is not None and p == b + 1 else -1 for p, b in zip(positions, before, strict=True)]
        found = (array("d", [m[0] for m in marks]), array("q", [int(m[1]) for m in marks]), array("q", follows))
        if len(_marks) >= MARKS_KEPT:
            _marks.clear()
        _marks[text] = found
    return found


def _array_text(values: Sequence[float]) -> str:
    """Numbers as one Postgres array literal (`repr` round-trips a float exactly): sent as one text
    parameter, a thousand numbers cost one string, not a dumper call and a quoting check each."""
    return "{" + ",".join(map(repr, values)) + "}"


def _middles(session: Session, group_cols: Sequence[str], keys: set[tuple[Any, ...]]) -> dict[tuple[Any, ...], float]:
    """An estimate of each group's middle throughput: the median of its configs' medians, each
    weighted by its runs (every run's cells: a few rows a group)."""
    cols = [getattr(Cell, c) for c in group_cols]
    which = any_of(Cell, group_cols, keys)
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


def by_rank(session: Session, board: Board) -> tuple[dict[str, int], dict[tuple[Any, ...], int]]:
    """A page of every run sorted by rank (either direction). Returns {run id: rank} in page
    order, and the group sizes it was planned from.

    On Postgres only the band of ranks the page lies in is sorted, from the end of each group that
    reaches it (`rank_band_rows`); elsewhere (SQLite: an embedded lab's few runs) one window
    ranks them all.
    """
    group_cols, descending, offset, limit = board.group_cols, board.descending, board.offset, board.limit
    sizes = tallied_sizes(session, board, group_cols)
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
        band, before = rank_band_rows(session, board, sizes=sizes, band=(ra, rb))
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


def rank_band_rows(
    session: Session, board: Board, *, sizes: dict[tuple[Any, ...], int], band: tuple[int, int]
) -> tuple[list[tuple[str, int]], int]:
    """One statement: the runs ranked in [ra, rb], in the board's order, and how many runs come
    before the band (best first, rank < ra; worst first, rank > rb).

    Each group is read from one end in index order, only as far as the band reaches, and ranked
    as it streams (no sort of the group): best first, its rb fastest runs (ties at the cut
    included: FETCH ... WITH TIES) hold every run of rank <= rb, those ranked better than the
    band skipped by the index scan (`_best_first_band`); worst first, its n - ra + 1 slowest
    runs (ties included) hold every run of rank >= ra, each ranked 1 + n minus the runs at most
    as fast. Only the band's rows are sorted.
    """
    ra, rb = band
    group_cols, descending = board.group_cols, board.descending
    if not descending:
        return _best_first_band(session, board, sizes=sizes, band=band)
    if _top_is_nearer(sizes, band):
        # worst first, a band in the upper half of its groups: the same band read from the top
        # (skipping the faster runs), before it every run not ranked in or better than the band
        in_band, better = _best_first_band(session, board, sizes=sizes, band=band, descending=True)
        return in_band, sum(sizes.values()) - better - len(in_band)
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
        .where(*entry_conditions(board.filters, board.group, e.c), *match(e.c, groups.c, group_cols))
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


def _top_is_nearer(sizes: dict[tuple[Any, ...], int], band: tuple[int, int]) -> bool:
    """Whether the band costs less read from each group's fastest run (the runs above it skipped in
    index order, about a third of a ranked row's cost each) than from its slowest (every run below
    it ranked)."""
    ra, rb = band
    from_bottom = sum(max(0, n - ra + 1) for n in sizes.values())
    from_top = 0.0
    for n in sizes.values():
        take = min(n, rb)
        skip = _skipped(ra, take)
        from_top += skip / 3 + (take - skip)
    return from_top < from_bottom


def _best_first_band(
    session: Session, board: Board, *, sizes: dict[tuple[Any, ...], int], band: tuple[int, int], descending: bool = False
) -> tuple[list[tuple[str, int]], int]:
    """`rank_band_rows` best first: each group's runs at positions ra - 2 to rb - 1 of its
    throughput order (ties at the cut included), the ones before skipped by the index scan (OFFSET:
    no window, no row kept for them). Each run read is ranked the runs skipped plus its rank among
    those read: exact for a run slower than the first one read (every skipped run is faster), and
    for a run as fast as that first run, at position ra - 2, both that figure and its true rank are
    below ra — it only counts before the band. (Skipping to ra - 1 would rank a run that ties a
    skipped one ra, in the band, when it ranks better.)

    Every run ranked rb or better is skipped or read (the read ends at the rb-th, ties included),
    so it also serves a worst-first page (`descending`: the band in that order) whose band lies
    nearer the groups' fast end: the runs ranked in it are exactly those found, and the count
    returned is still the runs ranked better than ra."""
    ra, rb = band
    group_cols = board.group_cols
    table = Entry.__table__
    plan, skipped = [], 0
    for key, n in sizes.items():
        take = min(n, rb)
        skip = _skipped(ra, take)
        skipped += skip
        if take > skip:
            plan.append((*key, skip, take - skip))
    if not plan:
        return [], skipped
    groups = values(
        *(column(c, table.c[c].type) for c in group_cols), column("skip", Integer), column("take", Integer), name="groups"
    ).data(plan)
    e = table.alias("e")
    reached = (
        select(e.c.id, e.c.model, *(e.c[c] for c in group_cols), e.c.tokens_per_s)
        .where(*entry_conditions(board.filters, board.group, e.c), *match(e.c, groups.c, group_cols))
        .order_by(e.c.tokens_per_s.desc())
        .offset(groups.c.skip)
        .fetch(groups.c.take, with_ties=True)
        .lateral("reached")
    )
    rows = select(reached, groups.c.skip).select_from(groups.join(reached, true())).subquery("rows")
    part = [rows.c[c] for c in group_cols]
    rank = rows.c.skip + func.rank().over(partition_by=part, order_by=rows.c.tokens_per_s.desc())
    ranked = select(rows.c.id, rows.c.model, *part, rank.label("rank")).cte("ranked")
    before = select(func.count()).select_from(ranked).where(ranked.c.rank < ra).scalar_subquery()
    query = _rank_order(select(ranked.c.id, ranked.c.rank, before.label("before")), ranked, group_cols, descending).where(
        ranked.c.rank.between(ra, rb)
    )
    found = session.execute(query).all()
    counted = found[0].before if found else session.execute(select(before)).scalar_one()
    return [(run_id, int(rank)) for run_id, rank, _ in found], skipped + int(counted)


def _skipped(ra: int, take: int) -> int:
    """How many of a group's fastest runs a best-first band skips: those before position ra - 2
    (0-based), the run there kept to stand for them, and never past the runs the band reads."""
    return max(0, min(ra - 2, take))


def _rank_order(query: Any, ranked: Any, group_cols: Sequence[str], descending: bool) -> Any:
    """The board's order when sorted by rank: rank, model, group, id."""
    return query.order_by(direction(ranked.c.rank, descending), *group_order(ranked.c, group_cols), ranked.c.id)


def with_work_mem(session: Session) -> None:
    """Give this transaction's sorts of the narrow table room in memory (Postgres; a no-op on SQLite)."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text(f"SET LOCAL work_mem = '{SORT_WORK_MEM}'"))


def lock_configs(conn: Any, keys: Sequence[tuple[Any, ...]]) -> None:
    """Take these configs' locks in key order (`lock_config`): every writer takes them in one order."""
    for key in sorted(set(keys), key=_lock_name):
        lock_config(conn, key)


def lock_config(conn: Any, key: tuple[Any, ...]) -> None:
    """One config's lock for the rest of the transaction (a Postgres advisory lock, re-entrant; a
    no-op on SQLite, whose one writer holds the database), so that two writers of one config never
    both miss the other's run."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(hashtext(:key))"), {"key": _lock_name(key)})


def _lock_name(key: tuple[Any, ...]) -> str:
    return "cell:" + "|".join(map(str, key))
