"""Server time of one CI upload, in this process: where `POST /api/v1/results` spends it.

    flock /tmp/parallab-heavy.lock python benchmarks/ingest_server_time.py [--kind small] [--uploads 1500] [--profile]

Against a scratch Postgres database, one thread uploads `--uploads` documents of one kind
(`benchmarks/ingest.py`'s, all on one config and one CI series, as its clients' are) one after
another through what the route runs: the token's look-up, `parse_documents`, `upload_results`,
the commit and the answer's model. Prints ms per upload for every 250 (whether the time grows with
the runs already stored), ms per stage, and each SQL statement's count and time per upload;
`--profile` adds cProfile's top functions. No HTTP, no event loop: the figures are the upload
thread's own work and its database round trips.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import json
import os
import pstats
import sys
import time
from pathlib import Path

from sqlalchemy import event

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from backend.api.routes.results import upload_read  # noqa: E402
from backend.db import get_engine, get_sessionmaker, session_scope  # noqa: E402
from backend.services.tokens import create_token, token_principal  # noqa: E402
from backend.services.uploads import parse_documents, upload_results  # noqa: E402
from benchmarks.ingest import KINDS, documents  # noqa: E402
from benchmarks.load import scratch_database  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default=os.environ.get("PARALLAB_TEST_PG_ADMIN_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"))
    parser.add_argument("--kind", choices=list(KINDS), default="small")
    parser.add_argument("--uploads", type=int, default=1500)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    bodies = [json.dumps(d).encode() for d in documents(args.kind, 10)]
    with scratch_database(args.url) as url:
        with session_scope(url) as session:
            token = create_token(session=session, name="server-time", scopes=["upload"])
        engine = get_engine(url)
        counts: collections.Counter[str] = collections.Counter()
        times: collections.Counter[str] = collections.Counter()

        @event.listens_for(engine, "before_cursor_execute")
        def _before(conn, cursor, statement, parameters, context, executemany) -> None:  # type: ignore[no-untyped-def]
            conn.info["statement_start"] = time.perf_counter()

        @event.listens_for(engine, "after_cursor_execute")
        def _after(conn, cursor, statement, parameters, context, executemany) -> None:  # type: ignore[no-untyped-def]
            what = " ".join(statement.split())[:100]
            counts[what] += 1
            times[what] += time.perf_counter() - conn.info["statement_start"]

        sessions = get_sessionmaker(url)
        stages: collections.Counter[str] = collections.Counter()

        def upload(i: int) -> None:
            mark = [time.perf_counter()]

            def done(stage: str) -> None:
                now = time.perf_counter()
                stages[stage] += now - mark[0]
                mark[0] = now

            session = sessions()
            try:
                principal = token_principal(session=session, token=token)
                done("auth")
                docs, batch = parse_documents(bodies[i % len(bodies)])
                done("parse")
                uploaded = upload_results(session=session, documents=docs, batch=batch, idempotency_key=f"k{i}", principal=principal)
                done("store, join, judge")
                session.commit()
                done("commit")
                [upload_read(u) for u in uploaded][0].model_dump_json()
                done("answer")
            finally:
                session.close()

        for i in range(20):  # warm the caches (compiled statements, prepared statements)
            upload(i)
        stages.clear()
        counts.clear()
        times.clear()
        profile = cProfile.Profile() if args.profile else None
        if profile:
            profile.enable()
        began = chunk = time.perf_counter()
        for i in range(args.uploads):
            upload(20 + i)
            if (i + 1) % 250 == 0:
                now = time.perf_counter()
                print(f"uploads {i - 248}-{i + 1}: {(now - chunk) / 250 * 1000:.2f} ms each", flush=True)
                chunk = now
        wall = time.perf_counter() - began
        if profile:
            profile.disable()
            pstats.Stats(profile).sort_stats("cumulative").print_stats(40)
        n = args.uploads
        print(f"{args.kind}: {n} uploads, {wall / n * 1000:.2f} ms each, {sum(counts.values()) / n:.1f} statements each")
        for stage, seconds in stages.items():
            print(f"  {stage:20s} {seconds / n * 1000:6.2f} ms")
        for what, count in counts.most_common():
            print(f"  {count / n:5.2f} × {times[what] / n * 1000:6.2f} ms  {what}")
        print(f"  SQL in all: {sum(times.values()) / n * 1000:.2f} ms")


if __name__ == "__main__":
    main()
