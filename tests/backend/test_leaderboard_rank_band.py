"""Every run sorted by rank, best first, deep: the skipped head of each group against the plain query.

A page of the board sorted by rank reads, from each group, the runs whose rank can fall in the
page's band of ranks. Best first, the runs ranked better than the band are skipped by the index
scan (an OFFSET, nothing ranked or kept for them), all but one: the first run read stands for
them (a run slower than it has every skipped run faster; one as fast ranks better than the
band). On a lab whose groups hold about 160 runs with throughputs from 25 values (ties across
the skip), every grouping × filter is read page by page at offsets through the whole board and
checked against the plain query: each run's rank one plus the faster runs of its group, in the
board's order (rank, model, group, id). Skipping one run more, with no run to stand for the
skipped ones, is caught.

Worst first, a band in the upper half of its groups is read the same way, from the fast end
(`_top_is_nearer`), and the runs before it (ranked worse) are the rest of the board: checked
page by page against the plain query in that order too, and a count off by one is caught.
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select

from backend.db import session_scope
from backend.models import Run
from backend.store import leaderboard as store
from backend.store.leaderboard import dialect
from tests.backend.test_leaderboard_marks import FILTERS, GROUPS, crowded_lab, plain_ranks

PAGE = 45
LAB_RUNS = 640
"""Groups of about 160 runs (workload grouping), every filter's board over four pages."""


def plain_board(session, *, filters: dict[str, Any], group: str, descending: bool = False) -> list[tuple[str, int]]:
    """(id, rank) of every competing run in the board's order when sorted by rank, best first
    (`descending`: worst first; the order after the rank the same)."""
    ranks = plain_ranks(session, filters=filters, group=group)
    runs = {r.id: r for r in session.execute(select(Run).where(Run.id.in_(list(ranks)))).scalars()}
    parts = store.partition(group)
    sign = -1 if descending else 1

    def order(run_id: str) -> tuple[Any, ...]:
        run = runs[run_id]
        return (sign * ranks[run_id], run.model, *((getattr(run, c) is None, getattr(run, c) or "") for c in parts), run_id)

    return [(run_id, ranks[run_id]) for run_id in sorted(ranks, key=order)]


def paged(session, *, filters: dict[str, Any], group: str, total: int, descending: bool = False) -> list[tuple[str, int]]:
    rows = []
    for offset in range(0, total, PAGE):
        page, counted = store.leaderboard_rows(
            session, filters=filters, best_only=False, sort="rank", descending=descending, limit=PAGE, offset=offset, group=group
        )
        assert counted == total
        rows += [(r["id"], r["rank"]) for r in page]
    return rows


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)  # SQLite ranks every run in one window
def test_deep_rank_pages_skip_the_head_and_equal_the_plain_query(settings, monkeypatch) -> None:
    skips: list[int] = []
    real = dialect._skipped
    monkeypatch.setattr(dialect, "_skipped", lambda ra, take: skips.append(real(ra, take)) or skips[-1])
    with session_scope(settings.sqlalchemy_url) as session:
        crowded_lab(session, n=LAB_RUNS)
        session.commit()
        for group in GROUPS:
            for filters in FILTERS:
                expected = plain_board(session, filters=filters, group=group)
                assert len(expected) > 4 * PAGE
                assert paged(session, filters=filters, group=group, total=len(expected)) == expected, (group, filters)
    assert max(skips) > PAGE  # the deep pages skipped the heads of their groups


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_skipping_without_a_run_to_stand_for_the_head_is_caught(settings, monkeypatch) -> None:
    """Skip one run more (position ra - 1 read first): a run that ties a skipped one is ranked ra,
    in the band, when it ranks better, and the runs counted before the band are too few."""
    monkeypatch.setattr(dialect, "_skipped", lambda ra, take: max(0, min(ra - 1, take)))
    with session_scope(settings.sqlalchemy_url) as session:
        crowded_lab(session, n=LAB_RUNS)
        session.commit()
        expected = plain_board(session, filters={}, group="workload")
        assert paged(session, filters={}, group="workload", total=len(expected)) != expected


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_worst_first_pages_read_from_the_top_equal_the_plain_query(settings, monkeypatch) -> None:
    ends: list[bool] = []
    real = dialect._top_is_nearer
    monkeypatch.setattr(dialect, "_top_is_nearer", lambda sizes, band: ends.append(real(sizes, band)) or ends[-1])
    with session_scope(settings.sqlalchemy_url) as session:
        crowded_lab(session, n=LAB_RUNS)
        session.commit()
        for group in GROUPS:
            for filters in FILTERS:
                expected = plain_board(session, filters=filters, group=group, descending=True)
                assert len(expected) > 4 * PAGE
                got = paged(session, filters=filters, group=group, total=len(expected), descending=True)
                assert got == expected, (group, filters)
    assert True in ends and False in ends  # both ends read: the shallow pages from the bottom, the deep from the top


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_worst_first_from_the_top_counting_one_run_too_many_before_is_caught(settings, monkeypatch) -> None:
    """Count the band's runs before it one too many (read from the top): the page starts one run late."""
    real = dialect._best_first_band

    def miscounted(*args: Any, **kwargs: Any) -> tuple[list[tuple[str, int]], int]:
        found, better = real(*args, **kwargs)
        return found, better - 1 if kwargs.get("descending") else better

    monkeypatch.setattr(dialect, "_best_first_band", miscounted)
    with session_scope(settings.sqlalchemy_url) as session:
        crowded_lab(session, n=LAB_RUNS)
        session.commit()
        expected = plain_board(session, filters={}, group="workload", descending=True)
        assert paged(session, filters={}, group="workload", total=len(expected), descending=True) != expected
