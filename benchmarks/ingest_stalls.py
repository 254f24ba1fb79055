"""Where a wide upload's time goes, and what holds the GIL against the event loop (issue #12).

    flock /tmp/parallab-heavy.lock python benchmarks/ingest_stalls.py [--uploads 10]

In this process, on a scratch Postgres database, wide documents (benchmarks/ingest.py's) go
through the upload's own steps one after another: parse (`parse_documents`), the idempotency
hash alone (also inside the store step), store (`upload_results` and commit), answer
(`upload_read` and its JSON). The garbage collector's passes are timed meanwhile (each is one
GIL hold), with the start-up objects unfrozen as before, then frozen as the API now does; after
each half, one full collection (`gc.collect()`) is timed.
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from backend.api.routes.results import upload_read  # noqa: E402
from backend.db import get_sessionmaker  # noqa: E402
from backend.services.auth import Principal  # noqa: E402
from backend.services.ingest import document_sha256  # noqa: E402
from backend.services.uploads import parse_documents, upload_results  # noqa: E402
from benchmarks.ingest import documents  # noqa: E402
from benchmarks.load import scratch_database  # noqa: E402

PRINCIPAL = Principal(via="token", scopes=frozenset({"upload"}))
STEPS = ("parse", "idempotency_hash", "store_and_commit", "answer")


def upload(url: str, body: bytes, key: str) -> dict[str, float]:
    """One upload's steps, seconds each."""
    session = get_sessionmaker(url)()
    try:
        t0 = time.perf_counter()
        docs, batch = parse_documents(body)
        t1 = time.perf_counter()
        document_sha256(docs[0])
        t2 = time.perf_counter()
        stored = upload_results(session=session, documents=docs, batch=batch, idempotency_key=key, principal=PRINCIPAL)
        session.commit()
        t3 = time.perf_counter()
        upload_read(stored[0]).model_dump_json()
        t4 = time.perf_counter()
    finally:
        session.close()
    return dict(zip(STEPS, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default=os.environ.get("PARALLAB_TEST_PG_ADMIN_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"))
    parser.add_argument("--uploads", type=int, default=10)
    args = parser.parse_args()
    bodies = [json.dumps(d).encode() for d in documents("wide", 2 * args.uploads + 1)]
    passes: list[tuple[int, float]] = []
    started: list[float] = []

    def timed(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started.append(time.perf_counter())
        else:
            passes.append((info["generation"], time.perf_counter() - started.pop()))

    result: dict[str, Any] = {}
    with scratch_database(args.url) as url:
        upload(url, bodies[0], "warm-up")
        gc.callbacks.append(timed)
        for frozen in (False, True):
            if frozen:
                gc.freeze()
            passes.clear()
            offset = 1 + (args.uploads if frozen else 0)
            steps = [upload(url, bodies[offset + i], f"{frozen}-{i}") for i in range(args.uploads)]
            collect = time.perf_counter()
            gc.collect()
            collect = time.perf_counter() - collect
            result["frozen" if frozen else "unfrozen"] = {
                "full_collection_ms": round(collect * 1000, 2),
                "step_ms_median": {s: round(statistics.median(x[s] for x in steps) * 1000, 2) for s in STEPS},
                "gc_passes": {
                    f"gen{g}": {"count": len(ms), "max_ms": round(max(ms, default=0.0) * 1000, 2)}
                    for g in (0, 1, 2)
                    for ms in [[d for gen, d in passes if gen == g]]
                },
            }
        gc.callbacks.remove(timed)
        gc.unfreeze()
    print(json.dumps({"uploads": args.uploads, **result}))


if __name__ == "__main__":
    main()
