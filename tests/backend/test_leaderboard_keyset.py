"""Every run sorted by a column, paged by cursor (keyset) against the plain offset query.

A deep page read by offset counts off every row before it; read after a cursor (the last row's
place in the board's whole order) it starts where the last page ended. On a lab with ties in the
sort column and in throughput, nulls in the sort column and in the grouping, and two sources,
every grouping × sort column × direction is read whole by offset and page by page by cursor,
under one of the filters, rotating so each grouping and each sort column is read under every
filter (`filtered`): the same rows, in the same order, with the same ranks and counts — on SQLite
and Postgres.
"""

from __future__ import annotations

import random
import re
from datetime import UTC, datetime, timedelta
from html import unescape
from typing import Any

import pytest
from sqlalchemy import select

from backend.db import session_scope
from backend.models import Run
from backend.store import leaderboard as store
from backend.store.leaderboard import query
from tests.backend.test_leaderboard_planner import lab_runs

GROUPS = ("workload", "shape", "precision")
SORTS = (None, "mfu", "tokens_per_s", "created_at", "precision", "branch")
FILTERS: tuple[dict[str, Any], ...] = ({}, {"source": "ci"}, {"strategy": "ddp"})
PAGE = 7


def with_metrics(session) -> None:
    """MFU from four values and a null (ties and nulls in the sort column), creation times from three."""
    rng = random.Random(5)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    for run in session.execute(select(Run).order_by(Run.name)).scalars():
        run.mfu = rng.choice([0.1, 0.2, 0.35, 0.5, None])
        run.created_at = start + timedelta(minutes=rng.choice([0, 1, 2]))
    session.flush()


def filtered(filters: dict[str, Any], *axes: int) -> bool:
    """Whether a case (its place on the other axes) is read under `filters`: one filter a case, the
    next one for the next sort, direction or grouping (the cursor's predicate and the board's order
    are the same code under every filter; the filters only change which runs compete)."""
    return FILTERS.index(filters) == sum(axes) % len(FILTERS)


def rows_of(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [(r["id"], r["rank"], r["config_runs"], r["group_size"]) for r in rows]


def by_cursor(session, *, filters: dict[str, Any], group: str, sort: str | None, descending: bool) -> list[dict[str, Any]]:
    """The whole board, a page at a time, each after the last row of the one before."""
    out: list[dict[str, Any]] = []
    after = None
    while True:
        page, _ = store.leaderboard_rows(
            session, filters=filters, best_only=False, sort=sort, descending=descending, limit=PAGE, offset=0, group=group, after=after
        )
        out += page
        if len(page) < PAGE:
            return out
        after = store.page_key(page[-1], sort, group)


def test_cursor_pages_match_the_offset_query(settings) -> None:
    with session_scope(settings.sqlalchemy_url) as session:
        lab_runs(session)
        with_metrics(session)
        session.commit()
        for group in GROUPS:
            for sort in SORTS:
                for descending in (False, True):
                    for filters in FILTERS:
                        if not filtered(filters, GROUPS.index(group), SORTS.index(sort), descending):
                            continue
                        case = (group, sort, descending, filters)
                        whole, total = store.leaderboard_rows(
                            session, filters=filters, best_only=False, sort=sort, descending=descending, limit=500, offset=0, group=group
                        )
                        assert total == len(whole) > 3 * PAGE, case
                        assert rows_of(by_cursor(session, filters=filters, group=group, sort=sort, descending=descending)) == rows_of(
                            whole
                        ), case


@pytest.mark.parametrize("sort", ["mfu", "created_at"])  # a float, and a time through the cursor's text
def test_the_api_pages_by_next_cursor_and_refuses_a_cursor_of_another_order(settings, client, sort: str) -> None:
    with session_scope(settings.sqlalchemy_url) as session:
        lab_runs(session)
        with_metrics(session)
        session.commit()
    base = f"/api/v1/leaderboard?runs=all&sort={sort}&dir=desc&group=shape"
    whole = client.get(f"{base}&limit=500").json()
    assert whole["next_cursor"] is None
    ids, url, offset = [], f"{base}&limit={PAGE}", 0
    while True:
        body = client.get(url).json()
        ids += [(r["id"], r["rank"]) for r in body["items"]]
        if body["next_cursor"] is None:
            break
        offset += PAGE
        url = f"{base}&limit={PAGE}&offset={offset}&cursor={body['next_cursor']}"
    assert ids == [(r["id"], r["rank"]) for r in whole["items"]]
    cursor = client.get(f"{base}&limit={PAGE}").json()["next_cursor"]
    other_order, garbled, best_per_config = base.replace("dir=desc", "dir=asc"), f"{base}&cursor=x{cursor}", "/api/v1/leaderboard?"
    for bad in (f"{other_order}&cursor={cursor}", garbled, f"{best_per_config}cursor={cursor}"):
        r = client.get(bad)
        assert r.status_code == 422, (bad, r.text)
        assert r.json()["detail"][0]["loc"] == ["query", "cursor"]


def test_the_page_links_its_next_page_by_cursor(settings, client) -> None:
    with session_scope(settings.sqlalchemy_url) as session:
        lab_runs(session)
        with_metrics(session)
        session.commit()
    html = client.get(f"/leaderboard?runs=all&sort=mfu&limit={PAGE}").text
    (link,) = re.findall(r'href="/leaderboard\?([^"]*cursor=[^"]*)"', html)
    second = client.get("/api/v1/leaderboard?" + unescape(link)).json()
    by_offset = client.get(f"/api/v1/leaderboard?runs=all&sort=mfu&limit={PAGE}&offset={PAGE}").json()
    assert [r["id"] for r in second["items"]] == [r["id"] for r in by_offset["items"]]
    assert second["offset"] == PAGE  # the link states where the page stands


def test_deep_grouped_pages_from_the_sort_index_match_the_plain_query(settings, monkeypatch) -> None:
    """Every run under a shape or recipe grouping, sorted by a measured column: a deep page is found
    in the sort index's own order first (`_deep_grouped_page`; here from offset 1 on). Each page at
    every fourth offset equals the plain query's rows there — ties and nulls in the sort column
    (MFU from five values, creation times from three), ties in throughput, two models, a null
    precision group — rows, ranks and counts. Each grouping × sort × direction is read under one
    filter, rotating as in the cursor's test."""
    monkeypatch.setattr(query, "DEEP_FROM_INDEX", 1)
    read = []
    real = query._deep_grouped_page
    monkeypatch.setattr(query, "_deep_grouped_page", lambda *args: read.append(1) or real(*args))
    with session_scope(settings.sqlalchemy_url) as session:
        lab_runs(session)
        with_metrics(session)
        session.commit()
        pages = 0
        for g, group in enumerate(("shape", "precision")):
            for s, sort in enumerate(("mfu", "tokens_per_s", "created_at")):
                for descending in (False, True):
                    for filters in FILTERS:
                        if not filtered(filters, g, s, descending):
                            continue
                        case = (group, sort, descending, filters)
                        board = {"filters": filters, "best_only": False, "sort": sort, "descending": descending, "group": group}
                        whole, total = store.leaderboard_rows(session, **board, limit=500, offset=0)  # offset 0: the plain query
                        assert total == len(whole) > 3 * PAGE, case
                        for offset in range(1, total + 1, 4):
                            page, _ = store.leaderboard_rows(session, **board, limit=PAGE, offset=offset)
                            pages += 1
                            assert rows_of(page) == rows_of(whole[offset : offset + PAGE]), (*case, offset)
    assert len(read) == pages > 100  # the index's path read every deep page
