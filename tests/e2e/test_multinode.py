"""Multi-node jobs on this machine (issue 13): two workers pose as two hosts of one pool — separate
homes, 2 CPU ranks each, c10d rendezvous over loopback — on Redis and Postgres as a lab runs them.

Tiny jobs of 3 steps: a 2-node DDP job and a 2-node hybrid job (TP inside the node, FSDP across)
are queued together, so they compete for the same two hosts: both succeed, one after the other,
with the loss of `single`. Then one node's rank is killed: the whole job fails and both hosts
are freed, with no process left.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from backend.config import Settings
from backend.services.ingest import hardware_key
from tests.e2e.fleet import (
    FAST_LEASES,
    api_client,
    host_settings,
    live_hosts,
    private_redis,
    rank_processes,
    ranks_of,
    start_worker,
    stop_worker,
    wait_for_run,
    wait_for_training,
    wait_until,
)

pytestmark = pytest.mark.slow

POOL = "duo"
WORKLOAD = {"model": "tiny", "steps": 3, "warmup_steps": 1}
# Untraced: nothing here reads a trace, comm bytes or the critical path, and a 4-rank job's profiled
# window on two cores would outlast its timed steps (the form's hybrid job is untraced too: its
# trace box is left unticked).
DDP = {
    "name": "2x2 ddp",
    "workload": WORKLOAD,
    "strategy": {"name": "ddp", "world_size": 4},
    "placement": {"pool": POOL, "nodes": 2},
    "trace": False,
}


@pytest.fixture(scope="module")
def two_hosts(postgres_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, dict[str, Path]]]:
    root = tmp_path_factory.mktemp("two-hosts")
    with private_redis(root) as redis:
        base = Settings(home=root / "api", database_url=postgres_url, broker_url=redis.url, worker_devices=2, **FAST_LEASES)
        homes = {"host-a": root / "a", "host-b": root / "b"}
        procs = [start_worker(host_settings(base, home, host), root / f"{host}.log", pool=POOL) for host, home in homes.items()]
        try:
            with api_client(base) as client:
                wait_until(lambda: set(homes) <= set(live_hosts(client)), "both workers to register", timeout=60)
                yield client, homes
        finally:
            for proc in procs:
                stop_worker(proc)


def at(value: str) -> datetime:
    return datetime.fromisoformat(value)


def test_the_workers_page_and_endpoint_show_both_hosts_of_the_pool(two_hosts) -> None:
    client, homes = two_hosts
    listed = client.get("/api/v1/workers").json()
    pool = next(p for p in listed["pools"] if p["name"] == POOL)
    assert pool["alive"] == 2 and pool["devices_per_host"] == 2 and pool["queue"].endswith(f".{POOL}")
    assert {w["host"] for w in listed["items"] if w["pool"] == POOL and w["alive"]} == set(homes)
    assert all(w["devices"] == 2 and w["interconnect"] == "cpu" for w in listed["items"])
    page = client.get("/workers")
    assert page.status_code == 200
    assert all(host in page.text for host in homes) and page.text.count("alive</span>") >= 2


@pytest.mark.timeout(1200)  # two 4-rank jobs back to back on 2 cores: past the suite's 600 s under load
def test_two_competing_two_node_jobs_both_succeed_one_after_the_other_with_the_loss_of_single(two_hosts) -> None:
    client, homes = two_hosts
    ddp = client.post("/api/v1/runs", json=DDP)
    assert ddp.status_code == 202, ddp.text
    # The hybrid job from the form, as a user would: TP inside each node, FSDP across the two.
    form = client.get("/runs/new")
    token = re.search(r'name="csrf_token" value="([^"]+)"', form.text).group(1)  # type: ignore[union-attr]
    assert f'value="{POOL}"' in form.text, "the form offers the pool that exists"
    fields = {"csrf_token": token, "model": "tiny", "strategy": "hybrid", "world_size": "4", "steps": "3", "warmup_steps": "1"}
    submitted = client.post("/runs/new", data={**fields, "opt.hybrid.tp": "2", "pool": POOL, "nodes": "2"}, follow_redirects=False)
    assert submitted.status_code == 303, submitted.text[-2000:]
    hybrid_id = submitted.headers["location"].rsplit("/", 1)[-1]

    # The two jobs run one after the other, and either may go first: the wait covers both runs
    # (each ~1-2 min of 4 ranks on a 2-core machine, more under load).
    runs = {
        name: wait_for_run(client, run_id, {"succeeded", "failed", "cancelled"}, timeout=900)
        for name, run_id in (("ddp", ddp.json()["id"]), ("hybrid", hybrid_id))
    }
    for name, run in runs.items():
        assert run["status"] == "succeeded", f"{name}: {run['error']}"
        result = run["result"]
        assert [r["rank"] for r in result["ranks"]] == [0, 1, 2, 3]
        assert result["summary"]["loss_max_rel_diff_vs_reference"] <= 1e-4, name
        hardware = result["hardware"]
        assert hardware["nodes"] == 2 and hardware["devices_per_host"] == 2 and hardware["interconnect"] == "cpu"
        assert sorted(hardware["hosts"]) == sorted(homes)
        assert hardware_key(hardware).endswith(" [2x2]"), "the leaderboard groups 2x2 apart from 1x4"
        assert run["pool"] == POOL
    assert runs["hybrid"]["result"]["strategy"]["options"]["tp"] == 2
    first, second = sorted(runs.values(), key=lambda r: r["started_at"])
    assert at(first["finished_at"]) <= at(second["started_at"]), "two 2-node jobs on two hosts ran one after the other"
    wait_until(lambda: all(w["run_id"] is None for w in live_hosts(client).values()), "both hosts to be free", timeout=30)
    assert not any(rank_processes(run["id"]) for run in runs.values())


def test_killing_one_nodes_rank_fails_the_whole_job_and_frees_both_hosts(two_hosts) -> None:
    client, homes = two_hosts
    long = {**DDP, "name": "2x2 long", "workload": {**WORKLOAD, "steps": 5000}}
    run_id = client.post("/api/v1/runs", json=long).json()["id"]
    wait_for_training(client, run_id)
    running = client.get(f"/api/v1/runs/{run_id}").json()
    other = next(host for host in homes if host != running["host"])  # kill a rank of node 1, not the leader's
    victims = wait_until(lambda: ranks_of(run_id, homes[other]), f"the ranks of run {run_id} on {other}", timeout=30)
    victims[0].kill()  # type: ignore[index]
    run = wait_for_run(client, run_id, {"failed", "succeeded", "cancelled"}, timeout=120)
    assert run["status"] == "failed"
    assert f"host {other}" in run["error"], run["error"]
    assert run["result"] is None
    wait_until(lambda: all(w["run_id"] is None for w in live_hosts(client).values()), "both hosts to be free", timeout=60)
    wait_until(lambda: not rank_processes(run_id), "every rank of the failed job to be gone", timeout=30)
