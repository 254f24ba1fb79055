"""A page's ranks read from the cells' rank marks, against the plain query.

On Postgres, when the cells answer the filters, an every-run page's ranks come from its groups'
cells: each config's marks (`rank_marks`) bisected in Python, and only the runs between a run and
its config's next mark counted, all bands of the page in one statement (`_ranks_by_marks`). The
configs here hold far more runs than a cell keeps marks, so most ranks need a band; throughputs
come from a few values (ties at and between marks), and the checks' columns vary so the check
filters pick other cells. Every grouping × filter × sort is read whole, by offset and by cursor,
and each rank is checked against the plain count: one plus the competing runs of its group that
are faster. Dropping one band's count is caught.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from sqlalchemy import select

from backend.db import session_scope
from backend.models import Run
from backend.store import leaderboard as store
from backend.store.leaderboard import dialect

GROUPS = ("workload", "shape", "precision")
FILTERS: tuple[dict[str, Any], ...] = ({}, {"checks": "passed"}, {"verified": True}, {"strategy": "ddp", "checks": "passed"})
SORTS = (None, "mfu")
PAGE = 40


def crowded_lab(session, n: int = 640, seed: int = 43) -> None:
    """Runs in few configs (about 80 runs each, and 50 of them passed their checks: beyond the marks' 32), two shapes, two precisions,
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

    return {r.id: 1 + sum(1 for o in runs if key(o) == key(r) and o.tokens_per_s > r.tokens_per_s) for r in runs}


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


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)  # the marks are read on Postgres only
def test_ranks_from_the_marks_equal_the_plain_count_by_offset_and_by_cursor(settings, bands) -> None:
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
                    assert len(bands) > sent, case  # the marks' path ran, and most ranks needed a band
                    by_offset, by_cursor = pages(session, filters=filters, group=group, sort=sort, total=total)
                    assert [r["id"] for r in by_offset] == [r["id"] for r in whole], case
                    assert [r["id"] for r in by_cursor] == [r["id"] for r in whole], case
                    assert ranks_of(by_offset) == ranks_of(by_cursor) == expected, case


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_a_band_left_uncounted_is_caught(settings, monkeypatch) -> None:
    """Break the path on purpose: each page's last band dropped (its runs between the run and the
    mark go uncounted), some rank comes out better than the plain count."""
    real = dialect._array_text
    monkeypatch.setattr(dialect, "_array_text", lambda values: real(list(values)[:-1]))
    with session_scope(settings.sqlalchemy_url) as session:
        crowded_lab(session)
        session.commit()
        whole, _ = read(session, filters={}, group="workload", sort="mfu", limit=1000)
        assert ranks_of(whole) != plain_ranks(session, filters={}, group="workload")
