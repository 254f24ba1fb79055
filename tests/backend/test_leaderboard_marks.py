"""A page's ranks read from the cells' rank marks, against the plain query.

On Postgres, when the cells answer the filters, an every-run page's ranks come from its groups'
cells: each config's marks (`rank_marks`) bisected in Python, and only the runs between a run and
its config's next mark counted, all bands of the page in one statement (`_ranks_by_marks`). The
configs here hold about 40 runs: read with 8 marks a cell most ranks need a band; with 32 (a mark
every 1.25 runs) some marks follow the one below them (no run between: those ranks need none) and
some do not; with the cells' own 256 every mark does, and no band is counted. Throughputs come
from a few values (ties at and between marks), and the checks' columns vary so the check filters
pick other cells. Every grouping × filter × sort is read whole and each rank checked against the
plain count: one plus the competing runs of its group that are faster; each grouping and sort,
and every filter, is also read page by page, by offset and by cursor (`PAGED`). Dropping one
band's count is caught.
"""

from __future__ import annotations

import random
from bisect import bisect_right
from typing import Any

import pytest
from sqlalchemy import select

from backend.db import get_sessionmaker, session_scope
from backend.migrate import downgrade, upgrade
from backend.models import LeaderboardCell as Cell
from backend.models import Run
from backend.store import leaderboard as store
from backend.store.leaderboard import dialect, maintain

GROUPS = ("workload", "shape", "precision")
FILTERS: tuple[dict[str, Any], ...] = ({}, {"checks": "passed"}, {"verified": True}, {"strategy": "ddp", "checks": "passed"})
SORTS = (None, "mfu")
PAGE = 40
CELL_MARKS = maintain.RANK_MARKS
"""The marks a cell keeps (the tests below patch the module's figure)."""
FEW_MARKS, SOME_MARKS = 8, 32
"""Against about 40 runs a config: a mark every 5 runs (most ranks need a band), every 1.25 runs
(some marks adjacent, some not)."""
LAB_RUNS = 320
"""Eight configs (four workloads × two strategies) of about 40 runs each, and every filter's board
still longer than two pages."""


def crowded_lab(session, n: int = LAB_RUNS, seed: int = 43) -> None:
    """Runs in few configs (about 40 runs each, about 27 of them passed their checks), two shapes, two precisions,
    throughputs from 25 values (ties), some runs failing a check or uploaded with stated checks."""
    rng = random.Random(seed)
    for i in range(n):
        shape = rng.choice(["sa", "sb"])
        precision = rng.choice(["fp32", "bf16"])
        session.add(
            Run(
                name=f"r{i}",
                status="succeeded",
                source=rng.choice(["ci", "form"]),
                spec={},
                strategy=rng.choice(["ddp", "fsdp"]),
                world_size=2,
                model="alpha",
                shape_key=shape,
                workload_key=f"{shape}{precision}",
                hardware_key="gpu",
                precision=precision,
                activation_checkpointing="none",
                grad_accumulation_steps=1,
                micro_batch_size=1,
                tokens_per_s=float(rng.choice(range(100, 2600, 100))),
                mfu=rng.choice([0.1, 0.2, 0.3, None]),
                checks_failed=rng.choice([None, None, "loss"]),
                checks_stated=rng.choice([None, "gradient_check"]),
            )
        )
    session.flush()
    store.rebuild(session)


def plain_ranks(session, *, filters: dict[str, Any], group: str) -> dict[str, int]:
    """Each competing run's rank straight from `runs`: one plus the faster runs of its group."""
    runs = [
        r
        for r in session.execute(select(Run)).scalars()
        if all(getattr(r, k) == v for k, v in filters.items() if k in store.FILTERS)
        and (filters.get("checks") != "passed" or r.checks_failed is None)
        and (not filters.get("verified") or r.checks_stated is None)
    ]
    parts = store.partition(group)

    def key(run: Run) -> tuple[Any, ...]:
        return tuple(getattr(run, c) for c in parts)

    speeds: dict[tuple[Any, ...], list[float]] = {}
    for r in runs:
        speeds.setdefault(key(r), []).append(r.tokens_per_s)
    for group_speeds in speeds.values():
        group_speeds.sort()
    # the runs of r's group faster than r: those past the last one at r's throughput
    return {r.id: 1 + len(speeds[key(r)]) - bisect_right(speeds[key(r)], r.tokens_per_s) for r in runs}


def read(session, *, filters: dict[str, Any], group: str, sort: str | None, offset: int = 0, limit: int = PAGE, after=None):
    return store.leaderboard_rows(
        session, filters=filters, best_only=False, sort=sort, descending=True, limit=limit, offset=offset, group=group, after=after
    )


def pages(session, *, filters: dict[str, Any], group: str, sort: str | None, total: int) -> tuple[list[dict], list[dict]]:
    """The board page by page, by offset and after a cursor."""
    by_offset = [
        row for offset in range(0, total, PAGE) for row in read(session, filters=filters, group=group, sort=sort, offset=offset)[0]
    ]
    by_cursor: list[dict[str, Any]] = []
    after = None
    while True:
        page, _ = read(session, filters=filters, group=group, sort=sort, after=after)
        by_cursor += page
        if len(page) < PAGE:
            return by_offset, by_cursor
        after = store.page_key(page[-1], sort, group)


def paged(group: str, filters: dict[str, Any], sort: str | None) -> bool:
    """Whether a case is also read page by page: both sorts of each grouping, under filters that
    rotate so every filter is paged (the pages' path is the same for every case; the whole read
    checks every case's ranks)."""
    return FILTERS.index(filters) == (2 * GROUPS.index(group) + SORTS.index(sort)) % len(FILTERS)


PAGED = [(g, f, s) for g in GROUPS for f in FILTERS for s in SORTS if paged(g, f, s)]


def ranks_of(rows: list[dict[str, Any]]) -> dict[str, int]:
    return {r["id"]: r["rank"] for r in rows}


@pytest.fixture
def bands(monkeypatch) -> list[str]:
    """The band arrays each page sent (proof that the marks' path ran and needed bands)."""
    sent: list[str] = []
    real = dialect._array_text

    def spy(values):
        text = real(values)
        sent.append(text)
        return text

    monkeypatch.setattr(dialect, "_array_text", spy)
    return sent


def test_the_paged_cases_take_every_grouping_filter_and_sort() -> None:
    assert {g for g, _, _ in PAGED} == set(GROUPS)
    assert all(any(f == p for _, p, _ in PAGED) for f in FILTERS)
    assert {s for _, _, s in PAGED} == set(SORTS)


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)  # the marks are read on Postgres only
@pytest.mark.parametrize("marks", [FEW_MARKS, SOME_MARKS, CELL_MARKS])
def test_ranks_from_the_marks_equal_the_plain_count_by_offset_and_by_cursor(settings, bands, marks, monkeypatch) -> None:
    monkeypatch.setattr(maintain, "RANK_MARKS", marks)
    with session_scope(settings.sqlalchemy_url) as session:
        crowded_lab(session)
        session.commit()
        for group in GROUPS:
            for filters in FILTERS:
                expected = plain_ranks(session, filters=filters, group=group)
                for sort in SORTS:
                    case = (group, filters, sort)
                    sent = len(bands)
                    whole, total = read(session, filters=filters, group=group, sort=sort, limit=1000)
                    assert total == len(whole) == len(expected) > 2 * PAGE, case
                    assert ranks_of(whole) == expected, case
                    if marks == FEW_MARKS:
                        assert len(bands) > sent, case  # the marks' path ran, and most ranks needed a band
                    if marks == CELL_MARKS:
                        assert len(bands) == sent, case  # a mark at every run: no band read
                    if not paged(group, filters, sort):
                        continue
                    by_offset, by_cursor = pages(session, filters=filters, group=group, sort=sort, total=total)
                    assert [r["id"] for r in by_offset] == [r["id"] for r in whole], case
                    assert [r["id"] for r in by_cursor] == [r["id"] for r in whole], case
                    assert ranks_of(by_offset) == ranks_of(by_cursor) == expected, case


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_marks_without_positions_are_read_by_their_bands(settings, bands) -> None:
    """Marks written before they kept their positions ([throughput, runs faster]) give the same
    ranks: every rank that is not at a mark counts its band."""
    with session_scope(settings.sqlalchemy_url) as session:
        crowded_lab(session)
        for cell in session.execute(select(Cell)).scalars():
            cell.marks = [m[:2] for m in cell.marks]
        session.commit()
        for group in GROUPS:
            whole, _ = read(session, filters={}, group=group, sort="mfu", limit=1000)
            assert ranks_of(whole) == plain_ranks(session, filters={}, group=group), group
        assert bands


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_a_band_left_uncounted_is_caught(settings, monkeypatch) -> None:
    """Break the path on purpose: each page's last band dropped (its runs between the run and the
    mark go uncounted), some rank comes out better than the plain count."""
    monkeypatch.setattr(maintain, "RANK_MARKS", FEW_MARKS)
    real = dialect._array_text
    monkeypatch.setattr(dialect, "_array_text", lambda values: real(list(values)[:-1]))
    with session_scope(settings.sqlalchemy_url) as session:
        crowded_lab(session)
        session.commit()
        whole, _ = read(session, filters={}, group="workload", sort="mfu", limit=1000)
        assert ranks_of(whole) != plain_ranks(session, filters={}, group="workload")


def test_migration_0030_writes_the_marks_ingest_writes(scratch_url: str) -> None:
    """Cells written at the head, the database taken down to 0029 (positions dropped: the marks
    that revision reads) and up again: 0030 writes each cell's marks as the maintained path did."""
    upgrade(scratch_url)
    with get_sessionmaker(scratch_url)() as session:
        crowded_lab(session, n=300)
        session.commit()
        maintained = marks_of(session)
    assert all(len(m) == 3 for marks in maintained.values() for m in marks)
    downgrade(scratch_url, "0029")
    with get_sessionmaker(scratch_url)() as session:
        assert marks_of(session) == {key: [m[:2] for m in marks] for key, marks in maintained.items()}
    upgrade(scratch_url)
    with get_sessionmaker(scratch_url)() as session:
        assert marks_of(session) == maintained


def marks_of(session) -> dict[tuple[Any, ...], list[list[float]]]:
    """Every cell's marks by its config and subset."""
    return {(*(getattr(c, k) for k in store.CONFIG), c.subset): c.marks for c in session.execute(select(Cell)).scalars()}
