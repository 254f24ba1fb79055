"""The scaling page's groups and points, summed from the maintained cells, against the runs.

`/scaling` lists every (workload, hardware) group with its runs and world sizes and plots the best
throughput per (strategy, world size); both now come from the cells (a row per config), not a scan
of every ranked run. Checked against an aggregate of the runs themselves, after runs are added,
fail, and are deleted — on SQLite and Postgres.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from sqlalchemy import select

from backend.db import session_scope
from backend.models import Run
from backend.store import leaderboard as store
from backend.store import runs as run_store
from tests.backend.test_leaderboard_planner import lab_runs


def from_runs(session) -> tuple[dict[tuple[Any, ...], tuple[int, int]], dict[tuple[Any, ...], dict[tuple[Any, ...], tuple[float, int]]]]:
    """Each group's (runs, world sizes) and each group's {(strategy, world size): (best, runs)}, from the ranked runs."""
    ranked = [r for r in session.execute(select(Run)).scalars() if store.eligible(r)]
    groups: dict[tuple[Any, ...], list[Run]] = defaultdict(list)
    for r in ranked:
        groups[(r.workload_key, r.hardware_key)].append(r)
    sizes = {key: (len(runs), len({r.world_size for r in runs})) for key, runs in groups.items()}
    points = {}
    for key, runs in groups.items():
        cells: dict[tuple[Any, ...], list[float]] = defaultdict(list)
        for r in runs:
            cells[(r.strategy, r.world_size)].append(r.tokens_per_s)
        points[key] = {c: (max(v), len(v)) for c, v in cells.items()}
    return sizes, points


def check(session) -> None:
    sizes, points = from_runs(session)
    groups = store.workload_groups(session)
    assert {(g["workload_key"], g["hardware_key"]): (g["runs"], g["world_sizes"]) for g in groups} == sizes
    order = [(-g["world_sizes"], -g["runs"], g["workload_key"]) for g in groups]
    assert order == sorted(order)
    for g in groups:
        sample = session.get(Run, g["sample_id"])
        assert (sample.workload_key, sample.hardware_key) == (g["workload_key"], g["hardware_key"])
        found = store.scaling_points(session, workload_key=g["workload_key"], hardware_key=g["hardware_key"])
        key = (g["workload_key"], g["hardware_key"])
        assert {(p["strategy"], p["world_size"]): (p["tokens_per_s"], p["runs"]) for p in found} == points[key]
        assert [(p["strategy"], p["world_size"]) for p in found] == sorted(points[key])


def test_scaling_from_cells_matches_the_runs(settings) -> None:
    with session_scope(settings.sqlalchemy_url) as session:
        lab_runs(session)
        session.commit()
        check(session)
        runs = list(session.execute(select(Run).order_by(Run.name)).scalars())
        for run in runs[::4]:
            run_store.set_status(session, run, "failed", error="diverged")
        deleted = {run.id for run in runs[1::5]}
        for run_id in deleted:
            run_store.delete_run(session, run_id)
        for run in runs[2::7]:
            if run.id in deleted:
                continue
            run.tokens_per_s = 5000.0  # a rewritten result: its writer maintains the board explicitly
            store.follow_run(session, run, was_ranked=store.eligible(run))
        session.commit()
        check(session)
