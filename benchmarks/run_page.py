"""A run page and a run's API view when its document holds 80,000 timeline events (issue #12).

    flock /tmp/parallab-heavy.lock python benchmarks/run_page.py [--json] [--events-per-rank 10000] [--repeat 5]

Stores one traced fsdp run on 8 ranks with `--events-per-rank` timeline events each (80,000) in a
scratch Postgres database, through the ingest path, and requests, in-process (FastAPI's test
client, so the figures are the server's time and bytes, no network): the run page, the API view
(by default, and with `?include=timeline`), the downsampled timeline and the page's timeline
figure. Prints bytes and the median time of `--repeat` requests each (after one warm-up);
writes BENCHMARKS.md's section "Run page with 80,000 timeline events" unless `--no-write`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.load import scratch_database  # noqa: E402
from benchmarks.report import write_section  # noqa: E402

HEADING = "Run page with 80,000 timeline events"


def traced_document(events_per_rank: int) -> Any:
    """fsdp × 8 with a long timeline: on every rank, compute and collectives, back to back."""
    from parallab.core.result import ResultDocument
    from tests.ui.factories import make_document

    doc = make_document(strategy="fsdp", world_size=8, steps=200).model_dump(mode="json")
    rng = random.Random(0)
    ops = ["forward", "backward", "all_gather", "reduce_scatter"]
    timeline = []
    for r in range(8):
        t = 0.0
        for i in range(events_per_rank):
            dur = 5 + 50 * rng.random()
            timeline.append({"rank": r, "op": ops[i % 4], "start_us": t, "dur_us": dur, "bytes": 65_536 if i % 4 >= 2 else None})
            t += dur * (1.05 + rng.random())
    return ResultDocument.model_validate({**doc, "timeline": timeline})


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from fastapi.testclient import TestClient

    from backend.api.app import create_app
    from backend.config import Settings, get_settings
    from backend.db import session_scope
    from tests.ui.factories import store_run

    document = traced_document(args.events_per_rank)
    with tempfile.TemporaryDirectory() as home, scratch_database(args.url) as url:
        settings = Settings(home=Path(home), database_url=url, secret_key=secrets.token_urlsafe(32), host="127.0.0.1")
        app = create_app()
        app.dependency_overrides[get_settings] = lambda: settings
        with session_scope(url) as session:
            run_id = store_run(session, document).id
        paths = {
            "run page `/runs/{id}`": f"/runs/{run_id}",
            "API `GET /api/v1/runs/{id}`": f"/api/v1/runs/{run_id}",
            "API `GET /api/v1/runs/{id}?include=timeline`": f"/api/v1/runs/{run_id}?include=timeline",
            "API `GET /api/v1/runs/{id}/timeline` (downsampled)": f"/api/v1/runs/{run_id}/timeline",
            "page's timeline figure `/runs/{id}/timeline.json`": f"/runs/{run_id}/timeline.json",
        }
        cases = {}
        with TestClient(app) as client:
            for name, path in paths.items():
                first = client.get(path)
                if first.status_code != 200:
                    cases[name] = {"status": first.status_code}
                    continue
                times = []
                for _ in range(args.repeat):
                    start = time.perf_counter()
                    client.get(path)
                    times.append(time.perf_counter() - start)
                cases[name] = {"status": 200, "bytes": len(first.content), "p50_ms": statistics.median(times) * 1000}
    return {"events": len(document.timeline), "cases": cases}


def report(result: dict[str, Any], command: str, before: dict[str, Any] | None = None) -> str:
    rows = "\n".join(
        f"| {name} | {c['bytes']:,} | {c['p50_ms']:.0f} ms |" if c["status"] == 200 else f"| {name} | (answered {c['status']}) | |"
        for name, c in result["cases"].items()
    )
    cpu = platform.processor() or platform.machine()
    if before:
        was = "; ".join(
            f"{name}: {c['bytes']:,} bytes, {c['p50_ms']:.0f} ms" for name, c in before["cases"].items() if c.get("status") == 200
        )
        before_text = (
            f"Before (this script with `--repeat 3` on commit f39484e, which had no timeline endpoints; same machine, same day): {was}.\n"
        )
    else:
        before_text = ""
    before = before_text
    return f"""
Measured by `{command}` on this machine ({os.cpu_count()} CPU cores, {cpu}, Python {platform.python_version()}),
in-process on Postgres: one traced run whose document holds {result["events"]:,} timeline events (8 ranks).

| request | bytes | median |
|---|---|---|
{rows}

The page leaves the timeline out (the database removes it from the document before it is sent) and its chart
fetches `/runs/{{id}}/timeline.json` after the page: per rank × op lane, events closer than one pixel's worth of
the step (span / 1,000) merge into one bar that keeps its count, busy time and bytes; where that still leaves more
than 5,000 bars, the narrowest gaps close first. Full detail: the rank's Perfetto trace.
{before}"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default=os.environ.get("PARALLAB_TEST_PG_ADMIN_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"))
    parser.add_argument("--events-per-rank", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--before", default=None, help="The --json output of this script run on an older commit, to quote.")
    parser.add_argument("--json", action="store_true", help="Print one JSON line.")
    parser.add_argument("--no-write", action="store_true", help="Leave BENCHMARKS.md alone.")
    args = parser.parse_args()
    result = measure(args)
    command = f"python benchmarks/run_page.py --events-per-rank {args.events_per_rank} --repeat {args.repeat}"
    before = json.loads(Path(args.before).read_text()) if args.before else None
    print(json.dumps(result) if args.json else report(result, command, before))
    if not args.no_write:
        write_section(HEADING, report(result, command, before))


if __name__ == "__main__":
    main()
