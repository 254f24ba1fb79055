"""The audit's ranks × 5,000 upload against the server: refused before anything is recomputed.

    PYTHONPATH=. python benchmarks/upload_trust.py [--repeats 5]

A 2-rank CI document (`tests/backend/ci_documents.py`) with its ranks repeated to 10,000 entries
(3.9 MB), posted through the app (FastAPI's TestClient, SQLite under a temp home) `--repeats`
times. Prints the status, the body size, the median time per request and the answer's first
message. Before the ranks were held to `strategy.world_size` each request stored 10,000 rank rows.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fastapi.testclient import TestClient  # noqa: E402

from backend.api.app import create_app  # noqa: E402
from backend.config import Settings, get_settings  # noqa: E402
from backend.db import session_scope  # noqa: E402
from backend.migrate import upgrade  # noqa: E402
from backend.services.tokens import create_token  # noqa: E402
from tests.backend.ci_documents import document  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp())
    settings = Settings(home=home, database_url=f"sqlite:///{home / 'bench.db'}", upload_per_minute=1e6, upload_burst=10**6)
    settings.ensure_home()
    upgrade(settings.sqlalchemy_url)
    app = create_app()
    app.dependency_overrides[get_settings] = lambda: settings
    with session_scope(settings.sqlalchemy_url) as session:
        token = create_token(session=session, name="bench", scopes=["upload"])
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    doc = document(branch=None)
    body = json.dumps({**doc, "ranks": [r for _ in range(5_000) for r in doc["ranks"]]}).encode()
    with TestClient(app) as client:
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            response = client.post("/api/v1/results", content=body, headers=headers)
            times.append(time.perf_counter() - start)
    answer = response.json()
    said = (answer.get("detail") or [{"msg": f"stored as run {answer.get('id')}"}])[0]["msg"]
    print(f"ranks x5000: {response.status_code}, {len(body) / 1e6:.1f} MB, median {statistics.median(times) * 1e3:.0f} ms: {said}")


if __name__ == "__main__":
    main()
