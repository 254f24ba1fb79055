"""The every-run board's planned sorts (issue 12) against a recompute in Python.

Sorting every run by rank or by runs per config has no index: `_by_rank` and `_by_config_runs`
plan each page from the group and config sizes (from the cells, or counted over the filtered
runs when a filter is not a cell's); on Postgres a rank page reads only the group ends it can
reach. On a lab with ties, null recipe fields, several groups per
grouping and both sources, every grouping × sort × direction × filter is checked whole and page
by page against a recompute from the rows themselves: ranks, runs per config, group sizes, the
order and the total. A planner that reads one rank too few is caught.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest
from sqlalchemy import select

from backend.db import session_scope
from backend.models import Run
from backend.store import leaderboard as store
from backend.store.leaderboard import dialect

GROUPS = ("workload", "shape", "precision")
FILTERS: tuple[dict[str, Any], ...] = ({}, {"strategy": "ddp"}, {"source": "ci"}, {"branch": "main"})
PAGE = 9


def lab_runs(session, n: int = 90, seed: int = 12) -> None:
    """Ranked runs over 3 shapes × 2 hardware × recipes, throughputs from a few values (ties)."""
    rng = random.Random(seed)
    for i in range(n):
        shape = rng.choice(["sa", "sb", "sc"])
        precision = rng.choice(["fp32", "bf16", None])
        micro = rng.choice([1, 2])
        session.add(
            Run(
                name=f"r{i}",
                status="succeeded",
                source=rng.choice(["ci", "form"]),
                spec={},
                strategy=rng.choice(["ddp", "fsdp"]),
                world_size=rng.choice([2, 4]),
                model={"sa": "alpha", "sb": "beta", "sc": "beta"}[shape],
                shape_key=shape,
                workload_key=f"{shape}{precision}{micro}",
                hardware_key=rng.choice(["cpu", "gpu"]),
                precision=precision,
                activation_checkpointing="none",
                grad_accumulation_steps=1,
                micro_batch_size=micro,
                branch=rng.choice(["main", "dev", None]),
                tokens_per_s=float(rng.choice(range(100, 1600, 100))),
            )
        )
    session.flush()
    store.rebuild(session)  # a bulk load: the leaderboard refilled from the runs


def recompute(session, *, filters: dict[str, Any], group: str, sort: str, descending: bool) -> list[dict[str, Any]]:
    """The whole board straight from `runs`, in the board's order."""
    runs = [
        r
        for r in session.execute(select(Run)).scalars()
        if all(getattr(r, k) == v for k, v in filters.items()) and (group == "workload" or r.shape_key is not None)
    ]
    parts = store.partition(group)
    config = store.CONFIG if group == "workload" else store.RECIPE_CONFIG
    configs = Counter(tuple(getattr(r, c) for c in config) for r in runs)
    sizes = Counter(tuple(getattr(r, c) for c in parts) for r in runs)
    rows = []
    for r in runs:
        key = tuple(getattr(r, c) for c in parts)
        faster = sum(1 for o in runs if tuple(getattr(o, c) for c in parts) == key and o.tokens_per_s > r.tokens_per_s)
        rows.append(
            {
                "id": r.id,
                "rank": faster + 1,
                "config_runs": configs[tuple(getattr(r, c) for c in config)],
                "group_size": sizes[key],
                "model": r.model,
                "group": key,
                "tokens_per_s": r.tokens_per_s,
            }
        )
    sign = -1 if descending else 1
    nulls_last = lambda values: tuple((v is None, v or "") for v in values)  # noqa: E731  (Postgres' ASC: nulls last)
    return sorted(rows, key=lambda r: (sign * r[sort], r["model"], nulls_last(r["group"]), -r["tokens_per_s"], r["id"]))


def read(session, *, filters: dict[str, Any], group: str, sort: str, descending: bool, limit: int, offset: int):
    return store.leaderboard_rows(
        session, filters=filters, best_only=False, sort=sort, descending=descending, limit=limit, offset=offset, group=group
    )


def as_expected(rows: list[dict[str, Any]]) -> list[tuple[str, int, int, int]]:
    return [(r["id"], r["rank"], r["config_runs"], r["group_size"]) for r in rows]


@pytest.mark.parametrize("group", GROUPS)
def test_planned_sorts_match_a_recompute_whole_and_paged(settings, group: str) -> None:
    with session_scope(settings.sqlalchemy_url) as session:
        lab_runs(session)
        session.commit()
        for filters in FILTERS:
            for sort in ("rank", "config_runs"):
                for descending in (False, True):
                    case = (group, filters, sort, descending)
                    expected = as_expected(recompute(session, filters=filters, group=group, sort=sort, descending=descending))
                    assert len(expected) > 2 * PAGE, case
                    whole, total = read(session, filters=filters, group=group, sort=sort, descending=descending, limit=500, offset=0)
                    assert total == len(expected), case
                    assert as_expected(whole) == expected, case
                    paged = [
                        row
                        for offset in range(0, len(expected) + PAGE, PAGE)
                        for row in read(session, filters=filters, group=group, sort=sort, descending=descending, limit=PAGE, offset=offset)[
                            0
                        ]
                    ]
                    assert as_expected(paged) == expected, case


def whole_board_by_pages(session, *, descending: bool) -> list[tuple[str, int, int, int]]:
    return [
        row
        for offset in range(0, 200, PAGE)
        for row in as_expected(
            read(session, filters={}, group="workload", sort="rank", descending=descending, limit=PAGE, offset=offset)[0]
        )
    ]


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)  # SQLite ranks every run in one window: nothing to plan
def test_the_check_catches_a_planner_that_reads_one_rank_too_few(settings, monkeypatch) -> None:
    """Break the plan on purpose. Best first, a band one rank too narrow misses runs on the deep
    pages, and the recompute says so. Worst first, the statement counts what it read and widens a
    band that fell short (a too-narrow band heals); told it never falls short, it is caught too."""
    real_band, real_rows = store.rank_band, store.rank_band_rows
    with session_scope(settings.sqlalchemy_url) as session:
        lab_runs(session)
        session.commit()
        best_first = as_expected(recompute(session, filters={}, group="workload", sort="rank", descending=False))
        worst_first = as_expected(recompute(session, filters={}, group="workload", sort="rank", descending=True))
        assert whole_board_by_pages(session, descending=False) == best_first
        assert whole_board_by_pages(session, descending=True) == worst_first

        def narrow(sizes: dict[Any, int], **kw: Any) -> tuple[int, int]:
            ra, rb = real_band(sizes, **kw)
            return (ra + 1, rb) if kw["descending"] else (ra, rb - 1)

        monkeypatch.setattr(dialect, "rank_band", narrow)
        assert whole_board_by_pages(session, descending=False) != best_first
        assert whole_board_by_pages(session, descending=True) == worst_first  # widened until complete
        monkeypatch.setattr(dialect, "rank_band_rows", lambda *a, **kw: (real_rows(*a, **kw)[0], 10**9))  # "enough before it"
        assert whole_board_by_pages(session, descending=True) != worst_first
