"""How long `GET /api/v1/plan?mode=rank` takes at its defaults, at the largest lists it accepts
(4 precisions × 4 recomputation modes × 8 accumulation counts, as a sweep allows), and to refuse
the audit's 1,000 repeated values — in-process (TestClient) on a scratch SQLite database.

    PYTHONPATH=. python benchmarks/plan_bounds.py
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from fastapi.testclient import TestClient

from backend.api.app import create_app
from backend.config import Settings, get_settings
from backend.migrate import upgrade

CLUSTER = {"mode": "rank", "model": "llama-8b", "device": "h100", "nodes": 2, "gpus_per_node": 8}
CASES = {
    "defaults": {},
    "largest accepted": {
        "precisions": ["fp32", "bf16", "fp16", "fp8"],
        "checkpointing": ["none", "selective", "alternate", "full"],
        "accumulation": [str(i) for i in range(1, 9)],
    },
    "1,000 repeats (refused)": {"accumulation": ["1"] * 1000, "checkpointing": ["full"] * 1000},
}


def main() -> None:
    home = Path(tempfile.mkdtemp(prefix="plan-bounds-"))
    settings = Settings(home=home, database_url=f"sqlite:///{home / 'p.db'}")
    upgrade(settings.sqlalchemy_url)
    app = create_app()
    app.dependency_overrides[get_settings] = lambda: settings
    client = TestClient(app)
    print("| query | status | time | configurations planned |\n|---|---|---|---|")
    for name, extra in CASES.items():
        started = time.perf_counter()
        response = client.get("/api/v1/plan", params={**CLUSTER, **extra})
        elapsed = time.perf_counter() - started
        body = response.json()
        planned = body["fitting"] + len(body["rejected"]) if response.status_code == 200 else "—"
        print(f"| {name} | {response.status_code} | {elapsed * 1e3:,.0f} ms | {planned} |")


if __name__ == "__main__":
    main()
