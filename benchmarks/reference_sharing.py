"""The reference run (issue 12): a workload's first run on a host, with its fp32 reference computed
in the job against the same run with the reference from the lab database.

    python benchmarks/reference_sharing.py [--models small] [--rounds 3] [--steps 20] [--json] [--write]

Each round uses a workload no earlier round saw (a new seed) and three fresh runs of it, each a
DDP job on 2 gloo ranks through the worker's own path (`workers.execute.execute_run`: claim,
launch, torchrun ranks, ingest into a scratch Postgres database):
- `computed`: host A, empty cache, empty database: rank 0 trains the `single` reference after the
  job's own steps, and the worker stores it in the database;
- `lab database`: host B (another home, so another, empty file cache), same database: the worker
  copies the curve into B's cache before launching; the ranks train no reference;
- `host cache`: host A again: the curve is in its file cache (what every run after the first on a
  host paid before issue 12).
Wall time is `execute_run`'s, from claim to stored result. The figure is the median over rounds of
each round's `computed` / `lab database` wall time, with the rounds' range. Each run's result
records where its reference came from (`loss.reference_source`); the script checks it.
`--json` prints one line: {"ratio_computed_over_lab_database": …, "models": {…}}.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
PG_ADMIN_URL = os.environ.get("PARALLAB_TEST_PG_ADMIN_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
VARIANTS = ("computed", "lab database", "host cache")
WORLD = 2


def scratch_database() -> tuple[str, Any]:
    from sqlalchemy import create_engine, text

    from backend.migrate import upgrade

    name = f"parallab_refbench_{uuid.uuid4().hex[:8]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    upgrade(url)
    return url, admin


def drop_database(url: str, admin: Any) -> None:
    from sqlalchemy import text

    from backend.db import get_engine

    get_engine(url).dispose()
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{url.rsplit("/", 1)[1]}" WITH (FORCE)'))
    admin.dispose()


def timed_run(settings: Any, spec: dict[str, Any]) -> tuple[float, str]:
    """One run through execute_run as this host's worker: (wall seconds, the recorded reference source)."""
    from backend.db import session_scope
    from backend.services import workers as fleet
    from backend.services.runs import create_run
    from backend.store import runs as store
    from parallab.core.spec import JobSpec
    from workers import fleet as worker_fleet
    from workers.execute import execute_run

    me = worker_fleet.describe(settings, pool=settings.worker.pool)
    with session_scope(settings.sqlalchemy_url) as session:
        fleet.register(session=session, info=me)
        run_id = create_run(session=session, spec=JobSpec.model_validate(spec), settings=settings, source="api").id
    start = time.perf_counter()
    status = execute_run(run_id, settings, worker=me)
    wall = time.perf_counter() - start
    with session_scope(settings.sqlalchemy_url) as session:
        run = store.get_run(session, run_id)
        assert status == "succeeded" and run is not None and run.result is not None, (status, run and run.error)
        source = run.result.document["loss"]["reference_source"]
    return wall, source


def measure(model: str, steps: int, rounds: int, url: str, root: Path) -> dict[str, Any]:
    from backend.config import Settings

    pool = f"refbench-{uuid.uuid4().hex[:6]}"
    host = {
        name: Settings(
            home=root / f"{model}-{name}", database_url=url, pool=pool, default_pool=pool, worker_host=name, max_world_size=WORLD
        )
        for name in ("a", "b")
    }
    walls: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for r in range(rounds):
        spec = {
            "workload": {"model": model, "steps": steps, "warmup_steps": 2, "lr": 1e-3, "seed": 1000 + r},
            "strategy": {"name": "ddp", "world_size": WORLD},
            "trace": False,
        }
        for variant, on in zip(VARIANTS, ("a", "b", "a"), strict=True):
            wall, source = timed_run(host[on], spec)
            assert source == variant, f"round {r}: expected the reference from {variant!r}, the run says {source!r}"
            walls[variant].append(wall)
            print(f"{model} round {r}: {variant:<12} {wall:6.1f} s", file=sys.stderr, flush=True)
    ratios = [c / d for c, d in zip(walls["computed"], walls["lab database"], strict=True)]
    return {
        "wall_s": {v: statistics.median(w) for v, w in walls.items()},
        "ratio_computed_over_lab_database": statistics.median(ratios),
        "ratio_range": [min(ratios), max(ratios)],
        "ratio_lab_database_over_host_cache": statistics.median(
            d / h for d, h in zip(walls["lab database"], walls["host cache"], strict=True)
        ),
    }


def report(results: dict[str, dict[str, Any]], steps: int, rounds: int) -> str:
    lines = [
        f"Measured by `flock /tmp/parallab-heavy.lock python benchmarks/reference_sharing.py --write` on {os.cpu_count()} CPU cores "
        f"({platform.machine()}), DDP on {WORLD} gloo ranks, fp32, untraced, {steps} timed steps after 2 warm-up steps, {rounds} rounds, "
        f"each on a workload no earlier round saw (load average at the end: {os.getloadavg()[0]:.1f}). Wall time: `execute_run`, "
        "claim to stored result, Postgres.",
        "",
        "| model | computed (s) | lab database (s) | host cache (s) | computed / lab database (range) | lab database / host cache |",
        "|---|---|---|---|---|---|",
    ]
    for model, r in results.items():
        w = r["wall_s"]
        lo, hi = r["ratio_range"]
        lines.append(
            f"| {model} | {w['computed']:.1f} | {w['lab database']:.1f} | {w['host cache']:.1f} | "
            f"{r['ratio_computed_over_lab_database']:.2f} ({lo:.2f}–{hi:.2f}) | {r['ratio_lab_database_over_host_cache']:.2f} |"
        )
    lines += [
        "",
        "`computed`: the workload's first run in the lab (empty host cache, empty database): rank 0 trains the fp32 `single` "
        "reference after the job's steps, and the worker stores it in `reference_curves`. `lab database`: the first run of the "
        "same workload on another host (its own, empty cache): the worker copies the curve from the database into the host's "
        "cache before launching, and no reference is trained. `host cache`: a later run on the first host. Each run's result "
        "says which it was (`loss.reference_source`), and the script checks it. Before issue 12 every host's first run of a "
        "workload paid the `computed` time; now only the lab's first does.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["small"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    parser.add_argument("--write", action="store_true", help="write the table into BENCHMARKS.md")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // WORLD)))
    url, admin = scratch_database()
    try:
        with tempfile.TemporaryDirectory(prefix="parallab-refbench-") as root:
            results = {model: measure(model, args.steps, args.rounds, url, Path(root)) for model in args.models}
    finally:
        drop_database(url, admin)
    if args.json:
        worst = min(r["ratio_computed_over_lab_database"] for r in results.values())
        print(json.dumps({"ratio_computed_over_lab_database": worst, "models": results}))
    else:
        print(report(results, args.steps, args.rounds))
    if args.write:
        from benchmarks.report import write_section

        write_section("The reference run: computed once per lab", report(results, args.steps, args.rounds))


if __name__ == "__main__":
    main()
