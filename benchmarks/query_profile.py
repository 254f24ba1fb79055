"""Where a request of benchmarks/queries.py spends its time: Python CPU and SQL, per case.

    python benchmarks/query_profile.py [--db parallab_bench_queries] [--only TEXT] [--rounds 9] [--json] [--cprofile CASE]

Reads a scratch database that `benchmarks/queries.py --runs N --keep` populated (the same `--db`)
and times its cases in-process through the ASGI app, as that benchmark does, but splits each
request: CPU seconds of this process (`time.process_time`: Python, the driver, the templates —
the database server is another process), SQL wall time (each statement from the driver's send to
its last row fetched, summed) and statements per request. Medians of `--rounds` after a warm-up
round. On a shared machine the CPU figure is the one that keeps its meaning under load (the wall
clock counts the other processes' turns); `--cprofile CASE` prints the cumulative profile of the
first case whose name contains CASE.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from sqlalchemy import event, text

SORT = __import__("os").environ.get("PROFILE_SORT", "cumulative")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from backend.config import Settings, get_settings  # noqa: E402
from backend.db import get_engine, get_sessionmaker  # noqa: E402
from benchmarks.queries import SCRATCH_DB, cases, cursor_cases  # noqa: E402
from benchmarks.ui_queries import scratch  # noqa: E402


def main() -> None:
    warnings.filterwarnings("ignore")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    parser.add_argument("--db", default=SCRATCH_DB)
    parser.add_argument("--only", default="", help="profile only the cases whose name contains this (or one of these, split by |)")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    parser.add_argument("--statements", action="store_true", help="print each statement's median time per case")
    parser.add_argument("--cprofile", default="", help="print the cumulative profile of this case")
    args = parser.parse_args()

    from fastapi.testclient import TestClient

    from backend.api.app import create_app

    _, url = scratch(args.url, args.db)
    with get_sessionmaker(url)() as s:
        ids = [r[0] for r in s.execute(text("SELECT id FROM runs ORDER BY created_at"))]
    engine = get_engine(url)
    sql: list[float] = []
    texts: list[str] = []
    started: dict[int, float] = {}

    @event.listens_for(engine, "before_cursor_execute")
    def _before(conn, cursor, statement, parameters, context, executemany):  # noqa: ANN001
        started[id(cursor)] = time.perf_counter()

    @event.listens_for(engine, "after_cursor_execute")
    def _after(conn, cursor, statement, parameters, context, executemany):  # noqa: ANN001
        sql.append(time.perf_counter() - started.pop(id(cursor), time.perf_counter()))
        texts.append(" ".join(statement.split())[:90])

    settings = Settings(database_url=url, home=REPO / ".parallab-bench", secret_key="bench")
    app = create_app()
    app.dependency_overrides[get_settings] = lambda: settings
    out: dict[str, dict[str, Any]] = {}
    with TestClient(app) as client:
        todo = [(name, path) for name, path in cases(ids) if any(part in name for part in args.only.split("|"))]
        todo += cursor_cases(client, todo)
        for name, path in todo:
            assert client.get(path).status_code == 200, name
        samples: dict[str, list[tuple[float, float, float, int]]] = {name: [] for name, _ in todo}
        each: dict[str, list[list[float]]] = {name: [] for name, _ in todo}
        said: dict[str, list[str]] = {}
        for _ in range(args.rounds):
            for name, path in todo:
                sql.clear()
                texts.clear()
                w0, c0 = time.perf_counter(), time.process_time()
                client.get(path)
                c1, w1 = time.process_time(), time.perf_counter()
                samples[name].append(((w1 - w0) * 1e3, (c1 - c0) * 1e3, sum(sql) * 1e3, len(sql)))
                each[name].append([t * 1e3 for t in sql])
                said[name] = list(texts)
        for name, got in samples.items():
            out[name] = {
                "wall_ms": round(statistics.median(g[0] for g in got), 1),
                "cpu_ms": round(statistics.median(g[1] for g in got), 1),
                "sql_ms": round(statistics.median(g[2] for g in got), 1),
                "statements": got[0][3],
            }
        if args.statements:
            for name, times in each.items():
                print(f"-- {name}: each statement's median ms")
                for i, statement in enumerate(said[name]):
                    print(f"   {statistics.median(t[i] for t in times if len(t) > i):7.2f}  {statement}")
        if args.cprofile:
            name, path = next((n, p) for n, p in todo if args.cprofile in n)
            print(f"-- cProfile of 5 requests (the API route's work, called in this thread): {name}")
            profiled(url, path)
    engine.dispose()
    if args.json:
        print(json.dumps(out))
        return
    print(f"| case | wall ms | CPU ms | SQL ms | statements |  (medians of {args.rounds})")
    for name, r in out.items():
        print(f"| {name} | {r['wall_ms']} | {r['cpu_ms']} | {r['sql_ms']} | {r['statements']} |")
    print(
        f"median over cases: CPU {statistics.median(r['cpu_ms'] for r in out.values()):.1f} ms, "
        f"SQL {statistics.median(r['sql_ms'] for r in out.values()):.1f} ms"
    )


def profiled(url: str, path: str) -> None:
    """cProfile of a leaderboard API request's own work (query parameters, the board, the JSON),
    called in this thread: the ASGI app runs a route in a worker thread, which cProfile does not see."""
    from urllib.parse import parse_qsl, urlsplit

    from fastapi.encoders import jsonable_encoder

    from backend.api.queries import LeaderboardParams, leaderboard_page, leaderboard_query
    from backend.api.routes.analysis import leaderboard

    query = dict(parse_qsl(urlsplit(path).query))
    profile = cProfile.Profile()
    for i in range(6):
        with get_sessionmaker(url)() as session:
            if i:
                profile.enable()
            board = leaderboard_page(session, leaderboard_query(LeaderboardParams(**query), session))
            json.dumps(jsonable_encoder(leaderboard(board)))
            profile.disable()
    pstats.Stats(profile).sort_stats(SORT).print_stats(40)


if __name__ == "__main__":
    main()
