"""A hang across two hosts of one pool: two `parallab worker` processes pose as two hosts (separate
homes, one CPU rank each, c10d rendezvous over loopback), on Redis and Postgres as a lab runs
them. Rank 1 calls barrier where rank 0 calls all_reduce (the harness's test-only knob
`PARALLAB_TEST_FAULT`, in both workers' environments, inherited by their ranks). Which host runs
rank 1 is the rendezvous's choice: torchrun's c10d rendezvous numbers the nodes in the order they
join, so node 1's host runs rank 0 in some runs.

Each node's rank dumps its flight recorder into its own host's run directory; node 1 hands its
dumps on through the ledger, and node 0 analyses every rank's dump together: the run's error
leads with the sentence naming both ranks' calls, and the dumps of both nodes are kept with it.

Then rank 1 never reaches the all_reduce rank 0 calls (`absent:1`, a second pair of workers, as
the fault is in their environment): rank 0's collective timeout fails its node, the other node
stops on it (its rank dumps on SIGTERM), node 1 hands its dump on whichever rank it ran, and the
analysis names rank 1 as never arrived, with its last sequence there.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

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

POOL = "hangduo"
COLLECTIVE_TIMEOUT_S = 10
MAX_JOB_S = 300
SPEC = {
    "name": "hang across nodes",
    "workload": {"model": "tiny", "steps": 2, "warmup_steps": 1},
    "strategy": {"name": "ddp", "world_size": 2},
    "placement": {"pool": POOL, "nodes": 2},
}


@pytest.fixture(scope="module")
def two_hosts(
    request: pytest.FixtureRequest, postgres_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[TestClient, dict[str, Path]]]:
    """Two workers as two hosts of one pool, every rank they launch with the fault `request.param`."""
    root = tmp_path_factory.mktemp("hang-two-hosts")
    with private_redis(root) as redis:
        base = Settings(
            home=root / "api",
            database_url=postgres_url,
            broker_url=redis.url,
            worker_devices=1,
            max_job_seconds=MAX_JOB_S,
            heartbeat_s=1.0,
            worker_ttl_s=6.0,
            reservation_timeout_s=90.0,
        )
        kind = request.param.split(":")[0]  # hosts named apart per fault: none mistaken for the last pair's
        homes = {f"{kind}-a": root / "a", f"{kind}-b": root / "b"}
        env = {FAULT_ENV: request.param, "PARALLAB_COLLECTIVE_TIMEOUT_S": str(COLLECTIVE_TIMEOUT_S)}
        procs = [
            start_worker(host_settings(base, home, host), root / f"{host}.log", pool=POOL, extra_env=env) for host, home in homes.items()
        ]
        try:
            with api_client(base) as client:
                wait_until(lambda: set(homes) <= set(live_hosts(client)), "both workers to register", timeout=60)
                yield client, homes
        finally:
            for proc in procs:
                stop_worker(proc)


def failed_run(client: TestClient) -> dict[str, Any]:
    """SPEC submitted and ended: failed, by the collective timeout rather than the wall-clock limit."""
    submitted = client.post("/api/v1/runs", json=SPEC)
    assert submitted.status_code == 202, submitted.text
    run = wait_for_run(client, submitted.json()["id"], {"succeeded", "failed", "cancelled"}, timeout=400)
    assert run["status"] == "failed", run
    took = (datetime.fromisoformat(run["finished_at"]) - datetime.fromisoformat(run["started_at"])).total_seconds()
    assert took < MAX_JOB_S / 2, f"took {took:.0f} s: ended by the wall-clock limit, not the collective timeout"
    return run


@pytest.mark.timeout(600)
@pytest.mark.parametrize("two_hosts", ["mismatch:1"], indirect=True)
def test_a_hang_across_two_nodes_is_analysed_from_both_nodes_dumps_and_they_stay_with_the_run(two_hosts) -> None:
    client, homes = two_hosts
    run = failed_run(client)
    run_id = run["id"]

    # Each host's run directory holds only its own rank's dump, whichever rank the rendezvous gave
    # it: the analysis needed both.
    leader = run["host"]
    other = next(host for host in homes if host != leader)
    here = {host: sorted(p.name for p in (home / "runs" / run_id).glob("flight_rank*.json")) for host, home in homes.items()}
    assert sorted(here.values()) == [["flight_rank0.json"], ["flight_rank1.json"]], here

    first = run["error"].splitlines()[0]
    assert first.startswith("hang: ranks disagree at collective "), run["error"][:800]
    assert first.endswith(" of the world group (ranks 0, 1): rank 0 called all_reduce(Float[8]); rank 1 called barrier"), first
    # node 1 is named with its host, failed by its own timeout or stopped by node 0's (a race)
    assert f"node 1 (host {other}) failed: " in run["error"] or f"node 1 (host {other}) stopped: " in run["error"], run["error"][:1500]

    kept = client.get(f"/api/v1/runs/{run_id}/flight-recorder")
    assert kept.status_code == 200
    body = kept.json()
    report = body["report"]
    assert report["sentence"] == first
    assert report["dumps"] == {"0": "ok", "1": "ok"} and report["problems"] == []
    assert report["calls"] == {"0": "all_reduce(Float[8])", "1": "barrier"}
    assert sorted(body["dumps"]) == ["0", "1"]
    for rank, dump in body["dumps"].items():
        assert dump is not None, f"rank {rank}'s dump was not kept"
        assert dump["run"] == run_id and dump["rank"] == int(rank) and dump["torch"]["entries"]
    page = client.get(f"/runs/{run_id}").text
    assert "2 of 2 ranks dumped theirs" in page
    wait_until(lambda: all(w["run_id"] is None for w in live_hosts(client).values()), "both hosts to be free", timeout=60)
    wait_until(lambda: not rank_processes(run_id), "every rank of the failed job to be gone", timeout=30)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("two_hosts", ["absent:1"], indirect=True)
def test_a_rank_on_the_other_node_that_never_reaches_the_collective_is_named_as_missing(two_hosts) -> None:
    client, _ = two_hosts
    run = failed_run(client)
    run_id = run["id"]

    seen: list[dict[str, Any]] = []

    def report() -> dict[str, Any]:
        kept = client.get(f"/api/v1/runs/{run_id}/flight-recorder")
        assert kept.status_code == 200, kept.text
        seen.append(kept.json()["report"])
        return seen[-1]

    # node 1's dump may come after the run ended (merged and analysed again then) or just before
    # node 0 wrote the end (merged by it): kept either way
    try:
        wait_until(lambda: report()["dumps"] == {"0": "ok", "1": "ok"}, "node 1's dump to reach the run", timeout=60)
    except AssertionError as exc:
        error = str(client.get(f"/api/v1/runs/{run_id}").json().get("error"))[:600]
        raise AssertionError(f"{exc}: the last report's dumps {seen[-1]['dumps']}; the run's error: {error}") from exc
    final = report()
    assert final["never_arrived"] == [1], final
    assert final["calls"] == {"0": "all_reduce(Float[8])"}, final
    assert final["last_sequence"] == {"1": final["sequence"] - 1}, final
    where = f"collective {final['sequence']} of the world group (ranks 0, 1)"
    assert final["sentence"].startswith(f"hang: rank 1 never arrived at {where}"), final
    first = run["error"].splitlines()[0]
    assert first.startswith("hang: ") and "rank 1" in first, run["error"][:800]
    wait_until(lambda: all(w["run_id"] is None for w in live_hosts(client).values()), "both hosts to be free", timeout=60)
    wait_until(lambda: not rank_processes(run_id), "every rank of the failed job to be gone", timeout=30)
