"""A hung run through the whole job path (API, Redis, a `parallab worker` process, torchrun, the
harness), on Postgres: rank 1 calls barrier where rank 0 calls all_reduce (the harness's test-only
knob `PARALLAB_TEST_FAULT`, set in the worker's environment, which its ranks inherit).

The run ends `failed` within its collective timeout (far inside its wall-clock limit); its API
error and its page lead with the sentence that names the sequence, both calls and the ranks; its
ranks' flight-recorder dumps are kept with it (`GET /runs/{id}/flight-recorder`).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

import pytest
from fastapi.testclient import TestClient

from backend.config import Settings
from tests.e2e.fleet import (
    api_client,
    host_settings,
    live_hosts,
    private_redis,
    rank_processes,
    start_worker,
    stop_worker,
    wait_for_run,
    wait_until,
)
from workers.harness.faults import FAULT_ENV

pytestmark = pytest.mark.slow

HOST = "hangs"
COLLECTIVE_TIMEOUT_S = 3
"""Above the gap between the 2 ranks reaching one collective (at most 0.5 s on 2 shared cores at load
average 17, tests/workers/test_hangs.py), which the run waits out once."""
MAX_JOB_S = 300
SPEC = {"name": "hangs", "workload": {"model": "tiny", "steps": 2, "warmup_steps": 1}, "strategy": {"name": "ddp", "world_size": 2}}


@pytest.fixture(scope="module")
def lab(postgres_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    root = tmp_path_factory.mktemp("hangs")
    with private_redis(root) as redis:
        base = Settings(home=root / "api", database_url=postgres_url, broker_url=redis.url, max_job_seconds=MAX_JOB_S)
        settings = host_settings(base, root / "worker", HOST)
        env = {FAULT_ENV: "mismatch:1", "PARALLAB_COLLECTIVE_TIMEOUT_S": str(COLLECTIVE_TIMEOUT_S)}
        worker = start_worker(settings, root / "worker.log", extra_env=env)
        client = api_client(settings)
        try:
            with client:
                wait_until(lambda: HOST in live_hosts(client), "the worker to register", timeout=60)
                yield client
        finally:
            stop_worker(worker)


def test_a_mismatched_collective_fails_the_run_naming_it_in_its_error_and_page_with_the_dumps_kept(lab: TestClient) -> None:
    run_id = lab.post("/api/v1/runs", json=SPEC).json()["id"]
    run = wait_for_run(lab, run_id, {"succeeded", "failed", "cancelled"}, timeout=240)
    assert run["status"] == "failed", run
    took = (datetime.fromisoformat(run["finished_at"]) - datetime.fromisoformat(run["started_at"])).total_seconds()
    assert took < MAX_JOB_S / 2, f"took {took:.0f} s: ended by the wall-clock limit, not the collective timeout"
    first = run["error"].splitlines()[0]
    assert first.startswith("hang: ranks disagree at collective "), run["error"][:600]
    assert first.endswith(" of the world group (ranks 0, 1): rank 0 called all_reduce(Float[8]); rank 1 called barrier"), first
    assert "timed out after" not in run["error"]

    kept = lab.get(f"/api/v1/runs/{run_id}/flight-recorder")
    assert kept.status_code == 200
    body = kept.json()
    assert body["report"]["sentence"] == first and body["report"]["never_arrived"] == []
    assert sorted(body["dumps"]) == ["0", "1"]
    for rank, dump in body["dumps"].items():
        assert dump["run"] == run_id and dump["rank"] == int(rank) and dump["torch"]["entries"]

    page = lab.get(f"/runs/{run_id}").text
    error_at = page.index('id="run-error"')
    assert page.index(first, error_at) < page.index("training process failed", error_at)  # the sentence leads the error
    assert f'href="/api/v1/runs/{run_id}/flight-recorder"' in page and "2 of 2 ranks dumped theirs" in page
    assert not rank_processes(run_id)


def test_a_run_that_kept_no_dumps_says_so(lab: TestClient) -> None:
    missing = lab.get("/api/v1/runs/" + "0" * 32 + "/flight-recorder")
    assert missing.status_code == 404
