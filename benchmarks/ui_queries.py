"""Time the leaderboard, scaling and compare queries (and their pages) with 10,000 runs in Postgres.

    python benchmarks/ui_queries.py [--url postgresql+psycopg://postgres@127.0.0.1:5432/test] [--runs 10000]

Creates a scratch database (`parallab_bench`) next to the given one, migrates it with Alembic,
bulk-inserts the runs (one batched insert per table) with a result document each, times the
service calls (median of several, after a warm-up) and the full pages through the app, prints a
table and writes it to BENCHMARKS.md under "UI queries with 10,000 runs" (its own section only).
The scratch database is dropped at the end.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import time
import uuid
import warnings
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, insert, text
from sqlalchemy.engine import make_url

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from backend.config import Settings, get_settings  # noqa: E402
from backend.db import get_sessionmaker  # noqa: E402
from backend.migrate import upgrade  # noqa: E402
from backend.models import Run, RunResult, RunResultPart  # noqa: E402
from backend.services import compare as compare_service  # noqa: E402
from backend.services import leaderboard as leaderboard_service  # noqa: E402
from backend.services.ingest import hardware_key, shape_key, workload_key  # noqa: E402
from backend.services.recipes import recipe_columns  # noqa: E402
from backend.store import leaderboard as leaderboard_store  # noqa: E402
from backend.store import result_parts  # noqa: E402
from backend.store import runs as runs_store  # noqa: E402
from benchmarks.report import write_section  # noqa: E402
from parallab.core.flags import failed_checks  # noqa: E402
from tests.ui.factories import make_document  # noqa: E402

HEADING = "UI queries with 10,000 runs"
SCRATCH_DB = "parallab_bench"
STRATEGIES = [
    ("single", (1,)),
    ("ddp", (2, 4, 8)),
    ("fsdp", (2, 4, 8)),
    ("tp", (2, 4)),
    ("pp", (2, 4)),
    ("ring", (2, 4)),
    ("hybrid", (4, 8)),
    ("moe", (2, 4)),
]
HARDWARE = [
    {"device": "cpu"},
    {"device": "cuda", "device_name": "NVIDIA H100 80GB HBM3"},
    {"device": "cuda", "device_name": "NVIDIA A100-SXM4-80GB"},
]


def scratch(url: str, name: str = SCRATCH_DB) -> tuple[str, str]:
    """(admin URL, scratch URL) for a scratch database `name` beside `url`."""
    admin = make_url(url)
    return admin.render_as_string(hide_password=False), admin.set(database=name).render_as_string(hide_password=False)


def recreate(admin_url: str, drop_only: bool = False, name: str = SCRATCH_DB) -> None:
    engine = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        if not drop_only:
            conn.execute(text(f"CREATE DATABASE {name}"))
    engine.dispose()


def generate(n: int, *, inline: bool = False) -> Iterator[tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]]:
    """n finished runs, one at a time: (runs row, run_results row, run_result_parts rows), the
    document stored as ingest stores it (its heavy parts apart, compressed) — or, `inline`, whole
    in run_results as before migration 0018 (to measure what the split saves). Deterministic (seed 0)."""
    rng = random.Random(0)
    templates = {}
    for strategy, sizes in STRATEGIES:
        for size in sizes:
            doc = make_document(strategy=strategy, world_size=size, tokens_per_s=1.0, steps=10).model_dump(mode="json")
            light, parts = (doc, {}) if inline else result_parts.split(doc)
            templates[(strategy, size)] = (doc, light, parts)  # heavy parts packed once per template
    models = [("tiny", None), ("tiny", 128), ("small", None), ("small", 256), ("small", 512)]
    precisions = ["fp32", "fp32", "bf16"]
    recipes: dict[tuple[str, int, str, int | None, str], dict] = {}
    shared: dict[tuple[str, int, str, int | None, str], tuple[dict[str, Any], dict[str, Any]]] = {}
    documents: dict[tuple[tuple[str, int, str, int | None, str], int], dict[str, Any]] = {}
    start = datetime(2026, 1, 1, tzinfo=timezone.utc)
    for i in range(n):
        strategy, sizes = rng.choice(STRATEGIES)
        size = rng.choice(sizes)
        model, seq = rng.choice(models)
        hw = rng.choice(HARDWARE)
        doc, light, parts = templates[(strategy, size)]
        workload = {**doc["workload"], "model": model}
        if seq:
            workload["seq_len"] = seq
        precision = rng.choice(precisions)
        workload["precision"] = precision
        recipe_key = (strategy, size, model, seq, precision)
        if recipe_key not in recipes:
            recipes[recipe_key] = recipe_columns(workload, doc["strategy"])
            shared[recipe_key] = (workload, {"workload": workload, "strategy": doc["strategy"], "trace": False})
        # one workload, spec and document object per distinct value (a bulk writer serializes each once)
        workload, spec = shared[recipe_key]
        hw_index = HARDWARE.index(hw)
        if (recipe_key, hw_index) not in documents:
            documents[(recipe_key, hw_index)] = {**light, "workload": workload, "hardware": hw}
        tps = rng.uniform(5e3, 5e5) * size**0.85
        run_id = uuid.uuid4().hex
        run = {
            "id": run_id,
            "name": f"bench {i}",
            "status": "succeeded",
            "source": rng.choice(["form", "api", "ci", "ci"]),
            "spec": spec,
            "created_at": start + timedelta(minutes=i),
            "finished_at": start + timedelta(minutes=i + 1),
            "cancel_requested": False,
            "strategy": strategy,
            "world_size": size,
            "model": model,
            "workload_key": workload_key(workload),
            "shape_key": shape_key(workload),
            **recipes[recipe_key],
            "hardware_key": hardware_key(hw),
            "branch": rng.choice(["main", "main", "perf/overlap", None]),
            "commit": f"{rng.getrandbits(40):010x}",
            "tokens_per_s": tps,
            "step_time_median_s": 8 * 64 / tps,
            "mfu": rng.uniform(0.2, 0.5) if hw["device"] == "cuda" else None,
            "peak_allocated_bytes_max": rng.randint(1 << 26, 1 << 34),
            "comm_time_fraction": rng.uniform(0, 0.4),
            "exposed_comm_fraction": rng.uniform(0, 0.2) if size > 1 else None,
            "loss_max_rel_diff": rng.uniform(0, 1e-3),
        }
        # the checks' columns as ingest derives them (no draw of their own: the runs stay as they were)
        run["checks_failed"] = ",".join(failed_checks({"loss_max_rel_diff_vs_reference": run["loss_max_rel_diff"]}, precision)) or None
        run["checks_stated"] = "gradient_check" if run["source"] == "ci" else None
        result = {"run_id": run_id, "schema_version": 1, "document": documents[(recipe_key, hw_index)], "created_at": run["finished_at"]}
        yield run, result, runs_store.part_rows(run_id, parts)


def populate(url: str, n: int) -> list[str]:
    """Insert n finished runs (summary columns + result documents) in batched inserts; return their ids."""
    ids: list[str] = []
    sm = get_sessionmaker(url)
    with sm() as s:
        batch: list[tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]] = []
        for row in generate(n):
            batch.append(row)
            if len(batch) == 2000:
                _insert(s, batch)
                ids += [run["id"] for run, _, _ in batch]
                batch = []
        if batch:
            _insert(s, batch)
            ids += [run["id"] for run, _, _ in batch]
        # raw inserts bypass ingest: fill the leaderboard's maintained table the way the migration backfills it
        leaderboard_store.rebuild(s)
        s.commit()
        s.execute(text("ANALYZE"))
        s.commit()
    return ids


def _insert(session: Any, batch: list[tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]]) -> None:
    session.execute(insert(Run), [run for run, _, _ in batch])
    session.execute(insert(RunResult), [result for _, result, _ in batch])
    session.execute(insert(RunResultPart), [part for _, _, parts in batch for part in parts])


def timed(fn, repeat: int) -> float:
    fn()  # warm-up: plans cached, pool connected
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e3


def main() -> None:
    warnings.filterwarnings("ignore")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--no-write", action="store_true", help="print only; leave BENCHMARKS.md alone")
    args = parser.parse_args()

    admin_url, url = scratch(args.url)
    recreate(admin_url)
    try:
        upgrade(url)
        t0 = time.perf_counter()
        ids = populate(url, args.runs)
        insert_s = time.perf_counter() - t0
        sm = get_sessionmaker(url)
        rng = random.Random(1)
        two, ten = rng.sample(ids, 2), rng.sample(ids, 10)
        LQ = leaderboard_service.LeaderboardQuery

        def service(call):
            def run():
                with sm() as s:
                    return call(s)

            return run

        cases = [
            (
                "leaderboard: best per strategy, first page of 50",
                service(lambda s: leaderboard_service.get_leaderboard(session=s, query=LQ())),
            ),
            (
                "leaderboard: every run, sorted by MFU, page 20",
                service(
                    lambda s: leaderboard_service.get_leaderboard(session=s, query=LQ(best_only=False, sort="mfu", limit=50, offset=950))
                ),
            ),
            (
                "leaderboard: filtered (fsdp, H100, branch main)",
                service(
                    lambda s: leaderboard_service.get_leaderboard(
                        session=s, query=LQ(strategy="fsdp", hardware_key="cuda:NVIDIA H100 80GB HBM3", branch="main")
                    )
                ),
            ),
            ("leaderboard: filter menus (distinct values)", service(lambda s: leaderboard_service.filter_options(session=s))),
            ("scaling: groups + points of one workload", service(lambda s: leaderboard_service.get_scaling(session=s))),
            ("compare: 2 runs (documents + metric table)", service(lambda s: compare_service.compare(session=s, run_ids=two))),
            ("compare: 10 runs", service(lambda s: compare_service.compare(session=s, run_ids=ten))),
        ]
        # Whole pages through the app (routing, queries, figures, templates), in-process.
        from fastapi.testclient import TestClient

        from backend.api.app import create_app

        settings = Settings(database_url=url, home=REPO / ".parallab-bench", secret_key="bench")
        app = create_app()
        app.dependency_overrides[get_settings] = lambda: settings
        client = TestClient(app)

        def page(path):
            def run():
                r = client.get(path)
                assert r.status_code == 200, (path, r.status_code)

            return run

        cases += [
            ("page /leaderboard", page("/leaderboard")),
            ("page /leaderboard.csv (page of 50)", page("/leaderboard.csv")),
            ("page /compare (2 runs, 5 charts)", page("/compare?ids=" + ",".join(two))),
            ("page /scaling", page("/scaling")),
            ("page / (100 most recent runs)", page("/")),
        ]
        results = [(name, timed(fn, args.repeat)) for name, fn in cases]
        load = os.getloadavg()[0]
        with sm() as s:
            plan = "\n".join(
                r[0]
                for r in s.execute(
                    text(
                        "EXPLAIN ANALYZE SELECT id FROM runs WHERE status='succeeded' AND tokens_per_s IS NOT NULL "
                        "ORDER BY workload_key, hardware_key, tokens_per_s DESC LIMIT 50"
                    )
                )
            )
    finally:
        from backend.db import get_engine

        get_engine(url).dispose()
        recreate(admin_url, drop_only=True)

    lines = [
        f"`python benchmarks/ui_queries.py` — {args.runs:,} finished runs (each with a result document) in Postgres "
        f"({platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; load average {load:.1f} while measuring), "
        f"bulk-inserted in {insert_s:.1f} s. Median of {args.repeat} after a warm-up, "
        "server side (service calls in-process; pages through the ASGI app without a network). Target: under 200 ms.",
        "",
        "| query | median |",
        "|---|---:|",
        *[f"| {name} | {ms:.1f} ms |" for name, ms in results],
        "",
        "The leaderboard reads only the summary columns of `runs` (one query: a hash aggregate per strategy config, "
        "joined back and ranked per group; then the specs of the",
        "few runs that label the groups on the page); compare loads only the documents of the runs asked for.",
        "",
    ]
    report = "\n".join(lines)
    print(report)
    if plan:
        print("\n-- plan of the leaderboard's index path --\n" + plan)
    if not args.no_write:
        write_section(HEADING, report)


if __name__ == "__main__":
    main()
