"""p50 and p95 server time of every page and read API at lab scale: 100,000 or 1,000,000 runs in Postgres.

    python benchmarks/queries.py [--runs 100000] [--json] [--explain] [--repeat 3] [--rounds 20] [--inline] [--url postgresql+psycopg://postgres@127.0.0.1:5432/test]

Populates a scratch database with benchmarks/ui_queries.py's runs (`generate()`: finished runs
with a result document each, its heavy parts stored apart as ingest stores them) in bulk — COPY,
20,000 runs a statement, each distinct JSON value serialized once — then fills the leaderboard's
maintained tables the way migration 0010 backfills them; reports the populate time and the
database's bytes per run (and per run in each table). `--inline` stores each document whole in
run_results, as before migration 0018, to measure what the split saves. Each request is timed
in-process through the ASGI app (routing, queries, figures, templates; no network). The cases run
round-robin, `--rounds` rounds after one warm-up round, so load on the machine spreads over every
case alike; the load average is read before populating, before timing and after. Before timing the
database is vacuumed, analysed and checkpointed (`settle`). `--repeat N` times
N fresh runs (each a new app and connection pool on the same database, its own warm-up) and
reports each case's worst p95 of the N: a goal met once on a shared machine is not met.

`--json` prints one line: {"runs": N, "populate_s": …, "bytes_per_run": {…}, "load": […],
"cases": {"<case>": {"p50_ms": …, "p95_ms": …}, …}}. Otherwise a table is printed and written to
BENCHMARKS.md under its own heading, one per --runs (not with --no-write). `--explain` writes
`EXPLAIN (ANALYZE, BUFFERS)` of every SQL statement each leaderboard and scaling case runs to
benchmarks/explain/<case>.txt. The scratch database (`--db`) is dropped at the end (`--keep`
leaves it, and a later `--keep` run with the same --runs reuses it).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import platform
import random
import re
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from sqlalchemy import event, text

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from backend.config import Settings, get_settings  # noqa: E402
from backend.db import get_engine, get_sessionmaker  # noqa: E402
from backend.migrate import upgrade  # noqa: E402
from backend.store import result_parts  # noqa: E402
from benchmarks.report import write_section  # noqa: E402
from benchmarks.ui_queries import generate, recreate, scratch  # noqa: E402

EXPLAIN_DIR = REPO / "benchmarks" / "explain"
TARGET_MS = {100_000: 100.0, 1_000_000: 200.0}
"""p95 target per scale, the worst of `--repeat` runs."""
FIRST_PAGES = (
    "runs list API (first page of 50)",
    "leaderboard API: best per config, first page",
    "runs API: one run",
    "compare API (2 runs)",
)
"""The first pages: under 200 ms p95 at every scale."""
COPY_CHUNK = 20_000
TABLES = ("runs", "run_results", "run_result_parts", "leaderboard_entries", "leaderboard_cells", "leaderboard_counts")
SCRATCH_DB = "parallab_bench_queries"
DEEP_OFFSET = 49_950
# Every column the every-run leaderboard is sorted by in the UI, with the direction its header asks first.
SORTS = {
    "rank": "asc",
    "mfu": "desc",
    "tokens_per_s": "desc",
    "step_time_median_s": "asc",
    "peak_allocated_bytes_max": "asc",
    "exposed_comm_fraction": "asc",
    "comm_time_fraction": "asc",
    "loss_max_rel_diff": "asc",
    "config_runs": "desc",
    "created_at": "desc",
    "strategy": "asc",
    "precision": "asc",
    "source": "asc",
    "branch": "asc",
}


def planned(sort: str, direction: str) -> str:
    """A planned sort's name in a case: rank best-first by default, worst-first said."""
    return f"{sort} worst-first" if sort == "rank" and direction == "desc" else sort


def cases(ids: list[str]) -> list[tuple[str, str]]:
    """(name, path) of every timed request."""
    rng = random.Random(1)
    ten = rng.sample(ids, 10)
    one = rng.choice(ids)
    two = ten[:2]
    out = []
    for sort, direction in SORTS.items():
        for label, offset in (("page 20", 950), (f"offset {DEEP_OFFSET:,}", DEEP_OFFSET)):
            out.append(
                (
                    f"leaderboard API: every run by {sort}, {label}",
                    f"/api/v1/leaderboard?runs=all&sort={sort}&dir={direction}&limit=50&offset={offset}",
                )
            )
    for label, offset in (("page 20", 950), (f"offset {DEEP_OFFSET:,}", DEEP_OFFSET)):
        out.append(
            (
                f"leaderboard API: every run by rank worst-first, {label}",
                f"/api/v1/leaderboard?runs=all&sort=rank&dir=desc&limit=50&offset={offset}",
            )
        )
        for group in ("shape", "precision"):
            out.append(
                (
                    f"leaderboard API: every run, group={group}, by mfu, {label}",
                    f"/api/v1/leaderboard?runs=all&group={group}&sort=mfu&dir=desc&limit=50&offset={offset}",
                )
            )
    for group in ("shape", "precision"):
        out.append((f"leaderboard API: best per config, group={group}, by mfu", f"/api/v1/leaderboard?group={group}&sort=mfu&dir=desc"))
    for group in ("shape", "precision"):  # the planned sorts under the recipe groupings
        for sort, direction in (("rank", "asc"), ("rank", "desc"), ("config_runs", "desc")):
            out.append(
                (
                    f"leaderboard API: every run, group={group}, by {planned(sort, direction)}, page 20",
                    f"/api/v1/leaderboard?runs=all&group={group}&sort={sort}&dir={direction}&limit=50&offset=950",
                )
            )
    for name, value in (("source", "source=ci"), ("branch", "branch=main")):
        for sort, direction in (("rank", "asc"), ("rank", "desc"), ("config_runs", "desc")):
            out.append(
                (
                    f"leaderboard API: every run, {name} filter, by {planned(sort, direction)}, page 20",
                    f"/api/v1/leaderboard?runs=all&{value}&sort={sort}&dir={direction}&limit=50&offset=950",
                )
            )
    out += [
        ("leaderboard API: every run, default order, page 20", "/api/v1/leaderboard?runs=all&limit=50&offset=950"),
        ("leaderboard API: best per config, first page", "/api/v1/leaderboard"),
        ("leaderboard API: best per config, group=shape", "/api/v1/leaderboard?group=shape"),
        ("leaderboard API: best per config, group=precision", "/api/v1/leaderboard?group=precision"),
        ("leaderboard API: best per config, checks passed, verified only", "/api/v1/leaderboard?checks=passed&verified=true"),
        ("page /leaderboard (best per config, checks passed, verified only)", "/leaderboard?checks=passed&verified=true"),
        (
            "leaderboard API: every run, filtered (fsdp, H100, branch main), by mfu",
            "/api/v1/leaderboard?runs=all&strategy=fsdp&hardware=cuda:NVIDIA%20H100%2080GB%20HBM3&branch=main&sort=mfu",
        ),
        ("page /leaderboard", "/leaderboard"),
        ("page /leaderboard (every run, by mfu, page 20)", "/leaderboard?runs=all&sort=mfu&offset=950"),
        ("page /scaling", "/scaling"),
        ("page /runs/{id}", f"/runs/{one}"),
        ("page /compare (10 runs)", "/compare?ids=" + ",".join(ten)),
        ("compare API (10 runs)", "/api/v1/compare?ids=" + ",".join(ten)),
        ("compare API (2 runs)", "/api/v1/compare?ids=" + ",".join(two)),
        ("page /compare (2 runs)", "/compare?ids=" + ",".join(two)),
        ("runs list API (first page of 50)", "/api/v1/runs?limit=50"),
        ("runs API: one run", f"/api/v1/runs/{one}"),
        ("page / (recent runs)", "/"),
    ]
    return out


def percentile(samples: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def populated(url: str, n: int) -> list[str] | None:
    """The run ids of a kept scratch database that already holds n runs, else None."""
    try:
        with get_sessionmaker(url)() as s:
            ids = [r[0] for r in s.execute(text("SELECT id FROM runs ORDER BY created_at"))]
    except Exception:  # noqa: BLE001 - no database, no schema: populate afresh
        return None
    return ids if len(ids) == n else None


def copy_populate(url: str, n: int, *, inline: bool = False) -> list[str]:
    """n runs in bulk: COPY of each table, COPY_CHUNK runs at a time (each distinct spec and document
    serialized once: the generator shares them), then the leaderboard's tables rebuilt. Their ids."""
    texts: dict[int, str] = {}

    def value(v: Any) -> Any:
        if not isinstance(v, dict):
            return v
        if id(v) not in texts:
            texts[id(v)] = json.dumps(v, separators=(",", ":"))
        return texts[id(v)]

    ids: list[str] = []
    engine = get_engine(url)
    indexes = _drop_indexes(engine, ("runs", "run_results", "leaderboard_entries"))  # built once at the end, not row by row
    raw = engine.raw_connection()
    try:
        cursor = raw.cursor()
        rows = generate(n, inline=inline)
        while True:
            chunk = list(itertools.islice(rows, COPY_CHUNK))
            if not chunk:
                break
            for table, records in (
                ("runs", [run for run, _, _ in chunk]),
                ("run_results", [result for _, result, _ in chunk]),
                ("run_result_parts", [part for _, _, parts in chunk for part in parts]),
            ):
                if not records:
                    continue
                columns = list(records[0])
                with cursor.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:  # type: ignore[attr-defined]
                    for record in records:
                        copy.write_row([value(record[c]) for c in columns])
            raw.commit()
            ids += [run["id"] for run, _, _ in chunk]
    finally:
        raw.close()
    with get_sessionmaker(url)() as s:
        from backend.store import leaderboard as leaderboard_store

        leaderboard_store.rebuild(s)
        s.commit()
    with engine.begin() as conn:
        for definition in indexes:
            conn.execute(text(definition))
    return ids


def settle(url: str) -> None:
    """Bring the populated database to the state a lab's is in between its writes before timing:
    VACUUM ANALYZE (what autovacuum keeps it at), then CHECKPOINT — the bulk load and the vacuum
    leave the whole database dirty, and its write-back (the checkpointer's and the kernel's) would
    otherwise run through the first timing run, slowing it against the next ones."""
    with get_engine(url).connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE"))
        conn.execute(text("CHECKPOINT"))


def _drop_indexes(engine: Any, tables: tuple[str, ...]) -> list[str]:
    """Drop the tables' plain indexes (not those behind a primary key or unique constraint); their definitions."""
    with engine.begin() as conn:
        rows = conn.execute(
            text(
                "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema() AND tablename = ANY(:tables) "
                "AND indexname NOT IN (SELECT conname FROM pg_constraint)"
            ),
            {"tables": list(tables)},
        ).all()
        for name, _ in rows:
            conn.execute(text(f'DROP INDEX "{name}"'))
    return [definition for _, definition in rows]


def sizes(url: str, n: int) -> dict[str, float]:
    """Bytes per run: the whole database, and each table with its indexes and TOAST."""
    with get_engine(url).connect() as conn:
        out = {"database": conn.execute(text("SELECT pg_database_size(current_database())")).scalar_one() / n}
        for table in TABLES:
            out[table] = conn.execute(text(f"SELECT pg_total_relation_size('{table}')")).scalar_one() / n
    return {k: round(v) for k, v in out.items()}


def document_bytes(url: str) -> list[str]:
    """Bytes one document takes in Postgres before the split (whole in run_results, TOAST-compressed)
    and after (the light row + its zlib-compressed parts), for an untraced and a traced run."""
    from tests.ui.factories import make_document, with_timeline

    untraced = make_document(strategy="ddp", world_size=8, steps=100)
    examples = {"untraced, 100 steps, ddp × 8": untraced, "traced, 100 steps, ddp × 8, 80,000 timeline events": with_timeline(untraced)}
    lines = []
    with get_engine(url).connect() as conn:
        conn.execute(text("CREATE TEMP TABLE sized (d jsonb)"))

        def stored(value: dict[str, Any]) -> int:
            conn.execute(text("TRUNCATE sized"))
            conn.execute(text("INSERT INTO sized VALUES (CAST(:d AS jsonb))"), {"d": json.dumps(value)})
            return int(conn.execute(text("SELECT pg_column_size(d) FROM sized")).scalar_one())

        for label, document in examples.items():
            whole = document.model_dump(mode="json")
            light, parts = result_parts.split(whole)
            packed = sum(len(data) for _, data in parts.values())
            before, row = stored(whole), stored(light)
            after = row + packed
            lines.append(
                f"| {label} | {len(json.dumps(whole)):,} | {before:,} | {row:,} | {packed:,} | {after:,} ({after / before - 1:+.0%}) |"
            )
    return lines


def explain(client: Any, url: str, name: str, path: str) -> None:
    """EXPLAIN (ANALYZE, BUFFERS) of each SELECT the request runs, in order, into benchmarks/explain/."""
    engine = get_engine(url)
    statements: list[tuple[str, Any]] = []

    def capture(conn, cursor, statement, parameters, context, executemany):  # noqa: ANN001 - SQLAlchemy's hook signature
        if statement.lstrip().upper().startswith(("SELECT", "WITH")):
            statements.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", capture)
    try:
        assert client.get(path).status_code == 200
    finally:
        event.remove(engine, "before_cursor_execute", capture)
    out = [f"-- {name}\n-- GET {path}\n"]
    with engine.connect() as conn:
        for statement, parameters in statements:
            plan = conn.exec_driver_sql("EXPLAIN (ANALYZE, BUFFERS) " + statement, parameters).scalars().all()
            out += [statement.strip(), f"-- parameters: {parameters!r}", *plan, ""]
        conn.rollback()
    EXPLAIN_DIR.mkdir(exist_ok=True)
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    (EXPLAIN_DIR / f"{slug}.txt").write_text("\n".join(out) + "\n")


def main() -> None:
    warnings.filterwarnings("ignore")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--db", default=SCRATCH_DB, help="the scratch database's name")
    parser.add_argument("--repeat", type=int, default=1, help="fresh timing runs; each case reports its worst p95 of them")
    parser.add_argument("--rounds", type=int, default=20, help="rounds of every case in each run, after a warm-up round")
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    parser.add_argument("--explain", action="store_true", help="write EXPLAIN ANALYZE of each leaderboard/scaling case")
    parser.add_argument("--only", default="", help="time only the cases whose name contains this")
    parser.add_argument("--inline", action="store_true", help="store documents whole (the layout before migration 0018)")
    parser.add_argument("--sizes-only", action="store_true", help="populate and report sizes; time nothing")
    parser.add_argument("--from-json", type=Path, help="render (and write) the report of a saved --json run; time nothing")
    parser.add_argument("--document-bytes", action="store_true", help="only print one document's bytes before and after the split")
    parser.add_argument("--keep", action="store_true", help="keep the scratch database (and reuse one with --runs runs)")
    parser.add_argument("--no-write", action="store_true", help="print only; leave BENCHMARKS.md alone")
    args = parser.parse_args()

    if args.document_bytes:
        print("| document | JSON text | before: whole jsonb row | after: light row | after: compressed parts | after: total |")
        print("|---|---:|---:|---:|---:|---:|")
        print("\n".join(document_bytes(args.url)))
        return
    if args.from_json:
        saved = json.loads(args.from_json.read_text())
        args.runs = saved["runs"]
        # the saved run's own repeat count (each case keeps one p95 a run), not this command's default
        args.repeat = max((len(case.get("p95_runs_ms", [])) for case in saved["cases"].values()), default=args.repeat)
        report = render(args, saved["cases"], populate_s=saved["populate_s"], per_run=saved["bytes_per_run"], loads=saved["load"])
        print(report)
        if not args.no_write:
            write_section(f"Pages and APIs at {args.runs:,} runs", report)
        return
    admin_url, url = scratch(args.url, args.db)
    ids = populated(url, args.runs) if args.keep else None
    populate_s = None
    loads = [os.getloadavg()[0]]
    if ids is None:
        recreate(admin_url, name=args.db)
    runs: list[dict[str, list[float]]] = []
    try:
        upgrade(url)
        if ids is None:
            t0 = time.perf_counter()
            ids = copy_populate(url, args.runs, inline=args.inline)
            settle(url)
            populate_s = time.perf_counter() - t0
        else:
            settle(url)
        per_run = sizes(url, args.runs)
        loads.append(os.getloadavg()[0])
        for _ in range(0 if args.sizes_only else args.repeat):
            runs.append(time_cases(url, ids, args))
            get_engine(url).dispose()  # the next run connects afresh
            loads.append(os.getloadavg()[0])
    finally:
        get_engine(url).dispose()
        if not args.keep:
            recreate(admin_url, drop_only=True, name=args.db)

    results = worst_of(runs)
    if args.json:
        summary = {"runs": args.runs, "populate_s": populate_s, "bytes_per_run": per_run, "load": loads, "cases": results}
        print(json.dumps(summary))
        return
    report = render(args, results, populate_s=populate_s, per_run=per_run, loads=loads)
    print(report)
    if not args.no_write and not args.only and not args.sizes_only and not args.inline:
        write_section(f"Pages and APIs at {args.runs:,} runs", report)


def worst_of(runs: list[dict[str, list[float]]]) -> dict[str, dict[str, Any]]:
    """Each case's p50 and p95 in the run where its p95 was worst, and every run's p95."""
    out: dict[str, dict[str, Any]] = {}
    for name in runs[0] if runs else {}:
        each = [(round(percentile(run[name], 0.95), 1), round(percentile(run[name], 0.5), 1)) for run in runs]
        p95, p50 = max(each)
        out[name] = {"p50_ms": p50, "p95_ms": p95, "p95_runs_ms": [p for p, _ in each]}
    return out


def cursor_cases(client: Any, todo: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The deep every-run pages sorted by a column again, each read after a cursor at the same depth
    (the `next_cursor` of the row before it) instead of at an offset."""
    out = []
    for name, path in todo:
        deep = f"offset={DEEP_OFFSET}"
        if deep not in path or "sort=rank" in path or "sort=config_runs" in path:
            continue
        before = path.replace("limit=50", "limit=1").replace(deep, f"offset={DEEP_OFFSET - 1}")
        cursor = client.get(before).json()["next_cursor"]
        out.append((name.replace(f"offset {DEEP_OFFSET:,}", f"cursor at {DEEP_OFFSET:,}"), f"{path}&cursor={cursor}"))
    return out


def time_cases(url: str, ids: list[str], args: argparse.Namespace) -> dict[str, list[float]]:
    """Each case's server times (ms), `args.rounds` rounds round-robin after a warm-up round."""
    from fastapi.testclient import TestClient

    from backend.api.app import create_app

    settings = Settings(database_url=url, home=REPO / ".parallab-bench", secret_key="bench")
    app = create_app()
    app.dependency_overrides[get_settings] = lambda: settings
    # started as uvicorn starts it (its lifespan: the GIL slice, start-up objects frozen for the collector)
    with TestClient(app) as client:
        todo = [(name, path) for name, path in cases(ids) if args.only in name]
        todo += cursor_cases(client, todo)
        for name, path in todo:  # warm-up: plans cached, pool connected; and every case answers 200
            r = client.get(path)
            assert r.status_code == 200, (name, r.status_code, r.text[:300])
        samples: dict[str, list[float]] = {name: [] for name, _ in todo}
        for _ in range(args.rounds):
            for name, path in todo:
                t0 = time.perf_counter()
                client.get(path)
                samples[name].append((time.perf_counter() - t0) * 1e3)
        if args.explain:
            for name, path in todo:
                if "leaderboard" in name or "scaling" in name:
                    explain(client, url, name, path)
    return samples


def render(
    args: argparse.Namespace,
    results: dict[str, dict[str, float]],
    *,
    populate_s: float | None,
    per_run: dict[str, float],
    loads: list[float],
) -> str:
    """The BENCHMARKS.md section: how it was measured, sizes, and every case against its target."""
    target = TARGET_MS.get(args.runs, 200.0)
    over = [name for name, r in results.items() if r["p95_ms"] >= target]
    slow_first = [name for name in FIRST_PAGES if name in results and results[name]["p95_ms"] >= 200.0]
    worst = max(results.items(), key=lambda kv: kv[1]["p95_ms"]) if results else None
    lines = [
        f"`python benchmarks/queries.py --runs {args.runs} --repeat {args.repeat} --rounds {args.rounds}` — "
        f"{args.runs:,} finished runs, each with a result document "
        "(its heavy parts stored apart, compressed, as ingest stores them), in Postgres, populated in bulk (COPY)"
        + (f" in {populate_s:.0f} s (VACUUM ANALYZE included)" if populate_s is not None else " by an earlier `--keep` run and reused")
        + f" ({platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; "
        f"load average {loads[0]:.1f} before populating, {loads[1]:.1f} before timing, "
        + ", ".join(f"{v:.1f}" for v in loads[2:])
        + " after each run). "
        f"Server time in-process through the ASGI app, {args.rounds} rounds round-robin after a warm-up round, in each of "
        f"{args.repeat} fresh run(s) (`--repeat {args.repeat}`: a new app and connection pool each, on the same database); p95 is the "
        f"nearest-rank 95th percentile, the worst of the runs. Target: every case under {target:.0f} ms p95, the first pages "
        "under 200 ms. "
        "`--explain` writes each leaderboard and scaling query's `EXPLAIN (ANALYZE, BUFFERS)` to benchmarks/explain/.",
        "",
        "Bytes per run: " + ", ".join(f"{name} {value:,.0f}" for name, value in per_run.items()) + ".",
        "",
        "| case | p50 | p95, worst of the runs | p95 of each run |",
        "|---|---:|---:|---:|",
        *[
            f"| {name} | {r['p50_ms']:.1f} ms | {r['p95_ms']:.1f} ms | " + ", ".join(f"{v:.1f}" for v in r.get("p95_runs_ms", [])) + " |"
            for name, r in results.items()
        ],
        "",
        (
            f"Every case is under the target (worst p95: {worst[0]}, {worst[1]['p95_ms']:.1f} ms)."
            if not over and worst
            else f"{len(over)} of {len(results)} cases over the target: {', '.join(over)}."
            if len(over) <= 10
            else f"{len(over)} of {len(results)} cases over the target."
        ),
        *([f"First pages over 200 ms: {', '.join(slow_first)}."] if slow_first else []),
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
