"""SQL for the leaderboard and the scaling page — only the indexed summary columns of `runs`.

Never loads result documents: with 10,000 runs the leaderboard is one windowed query over the
denormalised columns (MLflow's `latest_metrics` lesson), plus a look-up of the few specs shown.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import ColumnElement, Integer, and_, case, cast, delete, event, func, insert, inspect, literal, null, or_, select, text
from sqlalchemy.orm import Session, aliased

from backend.models import LeaderboardCell as Cell
from backend.models import LeaderboardEntry as Entry
from backend.models import Run

# Columns a leaderboard row carries, in display order.
ROW_COLUMNS = (
    "id",
    "name",
    "model",
    "strategy",
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
    # issue 14: the recipe dimensions
    "shape_key",
    "precision",
    "activation_checkpointing",
    "grad_accumulation_steps",
    "micro_batch_size",
)
SORTABLE = frozenset(ROW_COLUMNS) | {"rank", "config_runs"}
RECIPE_FILTERS = ("precision", "activation_checkpointing", "grad_accumulation_steps", "micro_batch_size")
FILTERS = ("model", "hardware_key", "strategy", "world_size", "source", "branch", "user_id", *RECIPE_FILTERS)
GROUPINGS = ("workload", "shape", *RECIPE_FILTERS)
"""How runs are grouped for ranking: `workload` — the same workload key (recipe included: only
identical workloads compete); `shape` — the same model shape and batch, every recipe competing;
a recipe dimension — within a shape, one group per value of that dimension (issue 14)."""

CONFIG = ("workload_key", "hardware_key", "strategy", "world_size")
KEYED = frozenset(CONFIG) | {"shape_key"}
"""Columns compared with `=` (never null on a ranked run, and indexed); the others null-safely."""
ENTRY_COLUMNS = tuple(c.name for c in Entry.__table__.columns)
CELL_ATTRIBUTES = ("model", "shape_key", *RECIPE_FILTERS)
"""What a config's cell carries besides its key and counts (the same for each of its runs)."""
CELL_FILTERS = frozenset({"model", "hardware_key", "strategy", "world_size", *RECIPE_FILTERS})
"""Filters the cells can answer; the others (source, branch, user) aggregate the filtered runs."""
SORT_WORK_MEM = "64MB"
RECIPE_CONFIG = ("shape_key", "hardware_key", "strategy", "world_size", *RECIPE_FILTERS)


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
            remove_entry(session, obj.id)
    for obj in session.new | session.dirty:
        if isinstance(obj, Run) and (obj in session.new or _touched(obj)):
            sync_entry(session, obj)


def _touched(run: Run) -> bool:
    state = inspect(run)
    return any(state.attrs[name].history.has_changes() for name in WATCHED)


def sync_entry(session: Session, run: Run) -> None:
    """Make the run's leaderboard row and its config's cell agree with the run (written, rewritten
    or removed), in the caller's transaction (the run row is already written).

    A run being inserted has no row yet (nothing to delete). A run that joins a config without
    leaving one (ingest) adds itself to that config's cell: runs + 1, best = max(best, its
    throughput), one upsert; a run that leaves or changes its row has its old config's cell
    recomputed from that config's rows.

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
        _refresh_cell(session, key, added=run)


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


def _refresh_cell(session: Session, key: tuple[Any, ...], *, added: Run | None = None) -> None:
    """Bring one config's cell up to date, under a lock on that config on Postgres so that two
    ingests of one config never both miss the other's run (an incremental add takes it too: a
    recompute running beside it would otherwise overwrite the add with a count that lacks it).

    `added`: the only change is this run joining the config (its entry is written) — on Postgres
    one upsert adds it (runs + 1, best and the attributes as the aggregate's max and min); else the
    cell is recomputed from its entries (an index range over every run of the config)."""
    conn = session.connection()
    postgres = conn.dialect.name == "postgresql"
    if postgres:
        conn.execute(text("SELECT pg_advisory_xact_lock(hashtext(:key))"), {"key": "cell:" + "|".join(map(str, key))})
    if added is not None and postgres and all(v is not None for v in key):
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        # (a null in the key never conflicts with the unique constraint: those cells are recomputed)
        upsert = pg_insert(Cell).values(
            **dict(zip(CONFIG, key, strict=True)),
            **{c: getattr(added, c) for c in CELL_ATTRIBUTES},
            runs=1,
            best_tokens_per_s=added.tokens_per_s,
        )
        conn.execute(
            upsert.on_conflict_do_update(
                index_elements=list(CONFIG),
                set_={
                    "runs": Cell.runs + 1,
                    "best_tokens_per_s": func.greatest(Cell.best_tokens_per_s, upsert.excluded.best_tokens_per_s),
                    # min() over the entries skips nulls, as least() does
                    **{c: func.least(getattr(Cell, c), getattr(upsert.excluded, c)) for c in CELL_ATTRIBUTES},
                },
            )
        )
        return
    match = [getattr(Entry, c) == v if v is not None else getattr(Entry, c).is_(None) for c, v in zip(CONFIG, key, strict=True)]
    agg = conn.execute(
        select(
            func.count().label("runs"),
            func.max(Entry.tokens_per_s).label("best_tokens_per_s"),
            *(func.min(getattr(Entry, c)).label(c) for c in CELL_ATTRIBUTES),
        ).where(*match)
    ).one()
    cell_match = [getattr(Cell, c) == v if v is not None else getattr(Cell, c).is_(None) for c, v in zip(CONFIG, key, strict=True)]
    conn.execute(delete(Cell).where(*cell_match))
    if agg.runs:
        conn.execute(insert(Cell).values(**dict(zip(CONFIG, key, strict=True)), **agg._mapping))


def rebuild(session: Session) -> int:
    """Refill both tables from `runs` (what migration 0010 backfills; for bulk loads that bypass
    ingest). Returns the entries written."""
    session.execute(delete(Cell))
    session.execute(delete(Entry))
    ranked = select(*(getattr(Run, c) for c in ENTRY_COLUMNS)).where(
        Run.status == "succeeded", Run.tokens_per_s.is_not(None), Run.workload_key.is_not(None)
    )
    session.execute(insert(Entry).from_select(list(ENTRY_COLUMNS), ranked))
    config = [getattr(Entry, c) for c in CONFIG]
    cells = select(
        *config,
        *(func.min(getattr(Entry, c)) for c in CELL_ATTRIBUTES),
        func.count(),
        func.max(Entry.tokens_per_s),
    ).group_by(*config)
    session.execute(insert(Cell).from_select([*CONFIG, *CELL_ATTRIBUTES, "runs", "best_tokens_per_s"], cells))
    return session.execute(select(func.count()).select_from(Entry)).scalar_one()


def _conditions(filters: dict[str, Any], table: Any = Entry) -> list[ColumnElement[bool]]:
    """The filters applied to ranked runs (the table holds only those) or to cells."""
    conds: list[ColumnElement[bool]] = []
    for name in FILTERS:
        if name not in filters:
            continue
        value = filters.get(name)
        if value is not None and value != "":
            conds.append(getattr(table, name) == value)
    return conds


def _match(a: Any, b: Any, columns: Sequence[str]) -> list[ColumnElement[bool]]:
    """Equality on `columns` between two tables; recipe dimensions may be null (CI uploads that no
    longer resolve): null matches null there (not indexable, so only on columns after the keys)."""
    return [getattr(a, c) == getattr(b, c) if c in KEYED else getattr(a, c).is_not_distinct_from(getattr(b, c)) for c in columns]


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
) -> tuple[list[dict[str, Any]], int]:
    """A page of leaderboard rows (each ranked within its group, see GROUPINGS) and the total."""
    conds = _conditions(filters)
    if group != "workload":
        conds.append(Entry.shape_key.is_not(None))
    if best_only:
        return _best_rows(session, filters=filters, conds=conds, sort=sort, descending=descending, limit=limit, offset=offset, group=group)
    return _every_run(session, filters=filters, conds=conds, sort=sort, descending=descending, limit=limit, offset=offset, group=group)


def _best_rows(
    session: Session,
    *,
    filters: dict[str, Any],
    conds: list[ColumnElement[bool]],
    sort: str | None,
    descending: bool,
    limit: int,
    offset: int,
    group: str,
) -> tuple[list[dict[str, Any]], int]:
    """The best run of each (strategy, world size[, recipe]) config, ranked within its group.

    Each config is aggregated once (its best throughput and how many runs it has — a hash
    aggregate over the narrow table); its best run is joined back, and only those few rows are
    ranked and sorted.
    """
    config = CONFIG if group == "workload" else RECIPE_CONFIG
    config_cols = [getattr(Entry, c) for c in config]
    if {name for name, value in filters.items() if value is not None and value != ""} <= CELL_FILTERS:
        # the maintained cells: a few hundred rows, not every run
        cell_cols = [getattr(Cell, c) for c in config]
        configs = (
            select(*cell_cols, func.max(Cell.best_tokens_per_s).label("best_tps"), cast(func.sum(Cell.runs), Integer).label("config_runs"))
            .where(*_conditions({k: v for k, v in filters.items() if k in CELL_FILTERS}, Cell))
            .where(*([] if group == "workload" else [Cell.shape_key.is_not(None)]))
            .group_by(*cell_cols)
            .subquery("configs")
        )
    else:
        configs = (
            select(*config_cols, func.max(Entry.tokens_per_s).label("best_tps"), func.count().label("config_runs"))
            .where(*conds)
            .group_by(*config_cols)
            .subquery("configs")
        )
    on = [getattr(Entry, c) == configs.c[c] if c in KEYED else getattr(Entry, c).is_not_distinct_from(configs.c[c]) for c in config]
    on.append(Entry.tokens_per_s == configs.c.best_tps)
    joined = (
        select(
            *(getattr(Entry, c) for c in ROW_COLUMNS),
            configs.c.config_runs,
            # two runs of one config with exactly the same throughput: keep one
            func.row_number().over(partition_by=config_cols, order_by=Entry.id).label("tie"),
        )
        .join(configs, and_(*on))
        .where(*conds)
    ).subquery("joined")
    parts = [joined.c[c] for c in partition(group)]
    scored = (
        select(
            joined,
            func.rank().over(partition_by=parts, order_by=joined.c.tokens_per_s.desc()).label("rank"),
            func.count().over(partition_by=parts).label("group_size"),
        )
        .where(joined.c.tie == 1)
        .subquery("scored")
    )
    order: list[ColumnElement] = []
    if sort in SORTABLE and sort is not None:
        column = scored.c[sort]
        order.append((column.desc() if descending else column.asc()).nulls_last())
    order += [scored.c.model, *(scored.c[c] for c in partition(group)), scored.c.rank, scored.c.id]
    page = select(scored, func.count().over().label("total")).order_by(*order).limit(limit).offset(offset)
    rows = [dict(r._mapping) for r in session.execute(page)]
    for row in rows:
        row.pop("tie", None)
    total = rows[0]["total"] if rows else session.execute(select(func.count()).select_from(scored)).scalar_one()
    for row in rows:
        row.pop("total", None)
    return rows, total


def _every_run(
    session: Session,
    *,
    filters: dict[str, Any],
    conds: list[ColumnElement[bool]],
    sort: str | None,
    descending: bool,
    limit: int,
    offset: int,
    group: str,
) -> tuple[list[dict[str, Any]], int]:
    """Every ranked run, a page at a time, without ranking them all.

    Within one group, rank order is throughput order, so "sort, model, group, rank, id" is the
    same order as "sort, model, group, tokens/s descending, id": the page's ids come from one
    sort of the narrow table's columns (no window over every run), and only the page's rows get
    their rank (one plus the faster runs of their group, an index range count) and their config's
    run count. Sorting by rank or by runs per config ranks or counts every run: a window over the
    group index, or a join with the per-config counts.
    """
    group_cols = partition(group)
    config = CONFIG if group == "workload" else RECIPE_CONFIG
    sort = sort if sort in SORTABLE else None
    tail = [Entry.model, *(getattr(Entry, c) for c in group_cols)]

    def keyed(column: Any) -> ColumnElement:
        return (column.desc() if descending else column.asc()).nulls_last()

    cellable = group == "workload" and {n for n, v in filters.items() if v is not None and v != ""} <= CELL_FILTERS
    planned: list[str] | None = None
    planned_ranks: dict[str, int] = {}
    if cellable and sort == "config_runs":
        planned = _by_config_runs(session, filters=filters, descending=descending, limit=limit, offset=offset)
    elif cellable and sort == "rank" and not descending:
        planned_ranks = _by_rank(session, filters=filters, limit=limit, offset=offset)
        planned = list(planned_ranks)
    if sort == "rank":
        ranks = (
            select(
                Entry.id,
                Entry.model,
                *(getattr(Entry, c) for c in group_cols),
                func.rank().over(partition_by=[getattr(Entry, c) for c in group_cols], order_by=Entry.tokens_per_s.desc()).label("rank"),
            )
            .where(*conds)
            .subquery("ranks")
        )
        ids_query = select(ranks.c.id).order_by(
            keyed(ranks.c.rank), ranks.c.model, *(ranks.c[c] for c in group_cols), ranks.c.rank, ranks.c.id
        )
    elif sort == "config_runs":
        counts = (
            select(*(getattr(Entry, c) for c in config), func.count().label("config_runs"))
            .where(*conds)
            .group_by(*(getattr(Entry, c) for c in config))
        ).subquery("counts")
        ids_query = (
            select(Entry.id)
            .join(counts, and_(*_match(Entry, counts.c, config)))
            .where(*conds)
            .order_by(keyed(counts.c.config_runs), *tail, Entry.tokens_per_s.desc(), Entry.id)
        )
    else:
        first = [keyed(getattr(Entry, sort))] if sort is not None else []
        ids_query = select(Entry.id).where(*conds).order_by(*first, *tail, Entry.tokens_per_s.desc(), Entry.id)
    with_work_mem(session)
    page_ids = planned if planned is not None else list(session.execute(ids_query.limit(limit).offset(offset)).scalars())
    if cellable:  # the cells' counts, not a count of every run
        total = session.execute(select(func.coalesce(func.sum(Cell.runs), 0)).where(*_conditions(filters, Cell))).scalar_one()
    else:
        total = session.execute(select(func.count()).select_from(Entry).where(*conds)).scalar_one()
    total = int(total)
    if not page_ids:
        return [], total
    other = aliased(Entry, name="other")
    other_conds = _conditions(filters, other)
    if group != "workload":
        other_conds.append(other.shape_key.is_not(None))
    rank = (
        select(func.count())
        .where(*other_conds, *_match(other, Entry, group_cols), other.tokens_per_s > Entry.tokens_per_s)
        .scalar_subquery()
    )
    known = planned_ranks if sort == "rank" and planned is not None else None
    query = select(*(getattr(Entry, c) for c in ROW_COLUMNS), *([] if known is not None else [(rank + 1).label("rank")])).where(
        Entry.id.in_(page_ids)
    )
    by_id = {r.id: dict(r._mapping) for r in session.execute(query)}
    rows = [by_id[i] for i in page_ids if i in by_id]
    if known is not None:
        for row in rows:
            row["rank"] = known[row["id"]]
    # runs per config and per group: from the cells where they answer the filters, else one grouped
    # count per distinct config or group on the page (not one per row)
    for label, columns in (("config_runs", config), ("group_size", group_cols)):
        keys = {tuple(row[c] for c in columns) for row in rows}
        source: Any = Cell if cellable else Entry
        which = [
            and_(
                *(
                    getattr(source, c) == v if c in KEYED else getattr(source, c).is_not_distinct_from(v)
                    for c, v in zip(columns, key, strict=True)
                )
            )
            for key in keys
        ]
        cols = [getattr(source, c) for c in columns]
        if cellable:
            tally = select(*cols, cast(func.sum(Cell.runs), Integer)).where(*_conditions(filters, Cell), or_(*which))
        else:
            tally = select(*cols, func.count()).where(*conds, or_(*which))
        tallies = {tuple(r[:-1]): r[-1] for r in session.execute(tally.group_by(*cols))}
        for row in rows:
            row[label] = tallies.get(tuple(row[c] for c in columns), 0)
    return rows, total


def _by_config_runs(session: Session, *, filters: dict[str, Any], descending: bool, limit: int, offset: int) -> list[str]:
    """A page of every run sorted by runs per config, planned from the cells: rows of one
    (runs, model, group) block are that block's configs' runs by throughput, and blocks come in
    the cells' order, so only the blocks the page overlaps are read."""
    runs = Cell.runs.desc() if descending else Cell.runs.asc()
    cells = session.execute(
        select(Cell.runs, Cell.model, *(getattr(Cell, c) for c in CONFIG))
        .where(*_conditions({k: v for k, v in filters.items() if k in CELL_FILTERS}, Cell))
        .order_by(runs, Cell.model, Cell.workload_key, Cell.hardware_key)
    ).all()
    blocks: list[tuple[int, list[tuple[Any, ...]]]] = []
    for cell in cells:
        if blocks and blocks[-1][1][0][:4] == tuple(cell)[:4]:  # same (runs, model, workload, hardware)
            blocks[-1] = (blocks[-1][0] + cell.runs, [*blocks[-1][1], tuple(cell)])
        else:
            blocks.append((cell.runs, [tuple(cell)]))
    ids: list[str] = []
    start = 0
    for size, members in blocks:
        end = start + size
        if end > offset and start < offset + limit:
            lo = max(0, offset - start)
            which = [and_(*(getattr(Entry, c) == m[2 + i] for i, c in enumerate(CONFIG))) for m in members]
            ids += session.execute(
                select(Entry.id)
                .where(or_(*which))
                .order_by(Entry.tokens_per_s.desc(), Entry.id)
                .offset(lo)
                .limit(offset + limit - start - lo)
            ).scalars()
        if end >= offset + limit:
            break
        start = end
    return ids


def _by_rank(session: Session, *, filters: dict[str, Any], limit: int, offset: int) -> dict[str, int]:
    """A page of every run sorted by rank (best first), planned from the group sizes in the cells.

    Rows of rank <= R number at least the sum over groups of min(R, group size), so the page lies
    in a band of ranks [ra, rb] a little wider than the page; each group's band is a throughput
    range found by an index look-up, and only the band's rows are ranked and sorted. A handful
    of statements, whatever the number of groups.
    """
    cell_filters = _conditions({k: v for k, v in filters.items() if k in CELL_FILTERS}, Cell)
    groups = (
        select(Cell.workload_key.label("wk"), Cell.hardware_key.label("hk"), cast(func.sum(Cell.runs), Integer).label("n"))
        .where(*cell_filters)
        .group_by(Cell.workload_key, Cell.hardware_key)
        .subquery("groups")
    )
    sizes = {(wk, hk): n for wk, hk, n in session.execute(select(groups))}
    if not sizes:
        return {}
    conds = _conditions(filters)

    def nth(k: int) -> Any:
        """Each group's k-th best throughput (1-based; null past its end), correlated to `groups`."""
        e = aliased(Entry, name=f"nth{k}")
        return (
            select(e.tokens_per_s)
            .where(*_conditions(filters, e), e.workload_key == groups.c.wk, e.hardware_key == groups.c.hk)
            .order_by(e.tokens_per_s.desc())
            .offset(k - 1)
            .limit(1)
            .correlate(groups)  # also from inside another subquery (ranked_at_most)
            .scalar_subquery()
        )

    def band_edges(ra: int, rb: int) -> dict[tuple[Any, ...], tuple[Any, Any, int]]:
        """Per group: the throughput of its (ra-1)-th and rb-th best runs, and how many of its runs
        rank above ra (ties included) — one statement over every group."""
        e = aliased(Entry, name="above")
        upper = nth(ra - 1) if ra > 1 else null()
        above = (
            select(func.count())
            .where(*_conditions(filters, e), e.workload_key == groups.c.wk, e.hardware_key == groups.c.hk, e.tokens_per_s >= nth(ra - 1))
            .correlate(groups)
            .scalar_subquery()
            if ra > 1
            else literal(0)
        )
        rows = session.execute(select(groups.c.wk, groups.c.hk, upper, nth(rb), above))
        return {(wk, hk): (hi, lo, sizes[(wk, hk)] if ra - 1 >= sizes[(wk, hk)] else n) for wk, hk, hi, lo, n in rows}

    def at_least(r: int) -> int:
        return sum(min(r, n) for n in sizes.values())

    biggest = max(sizes.values())
    rb = next((r for r in range(1, biggest + 1) if at_least(r) >= offset + limit), biggest)
    ra = max(1, next((r for r in range(rb, 0, -1) if at_least(r - 1) <= offset), 1))
    edges = band_edges(ra, rb)
    while sum(e[2] for e in edges.values()) > offset and ra > 1:  # ties put more runs above the band than the sizes promise
        ra -= 1
        edges = band_edges(ra, rb)
    before = sum(e[2] for e in edges.values())
    bands, above_band = [], []
    for group, n in sizes.items():
        if ra - 1 >= n:
            continue
        upper, lower, above = edges[group]
        here = and_(Entry.workload_key == group[0], Entry.hardware_key == group[1])
        band = [here]
        if ra > 1:
            band.append(Entry.tokens_per_s < upper)
        if rb < n:
            band.append(Entry.tokens_per_s >= lower)
        bands.append(and_(*band))
        above_band.append((here, above))
    if not bands:
        return {}
    # a band row's rank: its group's runs above the band, plus its rank within the band
    in_band = func.rank().over(partition_by=[Entry.workload_key, Entry.hardware_key], order_by=Entry.tokens_per_s.desc())
    band_rows = (
        select(Entry.id, Entry.model, Entry.workload_key, Entry.hardware_key, (case(*above_band, else_=0) + in_band).label("rank"))
        .where(*conds, or_(*bands))
        .subquery("band")
    )
    page = (
        select(band_rows.c.id, band_rows.c.rank)
        .order_by(band_rows.c.rank, band_rows.c.model, band_rows.c.workload_key, band_rows.c.hardware_key, band_rows.c.id)
        .offset(offset - before)
        .limit(limit)
    )
    return {run_id: int(rank) for run_id, rank in session.execute(page)}  # in page order


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
    combos = session.execute(select(*(getattr(Cell, name) for name in cell_columns)).distinct()).all()
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

    Counted per (group, world size) first — a hash aggregate of the narrow table — so the distinct
    world sizes are a count of a few hundred rows, not a sort of every run.
    """
    sizes = (
        select(
            Entry.workload_key,
            Entry.hardware_key,
            Entry.world_size,
            func.min(Entry.model).label("model"),
            func.count().label("runs"),
            func.min(Entry.id).label("sample_id"),
        )
        .group_by(Entry.workload_key, Entry.hardware_key, Entry.world_size)
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
    """Best tokens/s per (strategy, world size) within one group."""
    query = (
        select(Entry.strategy, Entry.world_size, func.max(Entry.tokens_per_s).label("tokens_per_s"), func.count().label("runs"))
        .where(Entry.workload_key == workload_key, Entry.hardware_key == hardware_key)
        .group_by(Entry.strategy, Entry.world_size)
        .order_by(Entry.strategy, Entry.world_size)
    )
    return [dict(r._mapping) for r in session.execute(query)]
