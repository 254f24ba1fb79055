"""A 2 nodes × 2 ranks DDP job across an emulated cluster: each node a network namespace behind a
shaped link, each with its own worker of one pool (its ranks run inside its namespace, gloo binds
the node's link). The job matches `single` — loss, gradient check, bytes as predicted — its result
names the dimension that crossed nodes, and the gradients' bytes crossed the shaped link."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from backend.config import Settings
from tests.e2e.emulated import emulated_cluster
from tests.e2e.fleet import (
    FAST_LEASES,
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
from workers.netns import EmulatedCluster, link_bytes

pytestmark = pytest.mark.slow

POOL = "emu"
STEPS = 3
DDP = {
    "name": "2x2 ddp emulated",
    "workload": {"model": "tiny", "steps": STEPS, "warmup_steps": 1},
    "strategy": {"name": "ddp", "world_size": 4},
    "placement": {"pool": POOL, "nodes": 2},
}


@pytest.fixture(scope="module")
def emulated_pool(postgres_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, EmulatedCluster]]:
    root = tmp_path_factory.mktemp("emulated")
    with private_redis(root) as redis, emulated_cluster(nodes=2, ranks_per_node=2, rate="500mbit") as cluster:
        base = Settings(home=root / "api", database_url=postgres_url, broker_url=redis.url, worker_devices=2, **FAST_LEASES)
        procs = []
        try:
            for node in cluster.nodes:
                settings = host_settings(base, root / node.host, node.host).model_copy(update={"worker_address": node.address})
                procs.append(start_worker(settings, root / f"{node.host}.log", pool=POOL, extra_env=cluster.worker_env(node)))
            with api_client(base) as client:
                wait_until(lambda: {"node0", "node1"} <= set(live_hosts(client)), "both nodes' workers to register", timeout=90)
                yield client, cluster
        finally:
            for proc in procs:
                stop_worker(proc)


@pytest.mark.timeout(900)
def test_ddp_across_two_emulated_nodes_matches_single_and_its_gradients_cross_the_link(emulated_pool) -> None:
    client, cluster = emulated_pool
    before = [link_bytes(node) for node in cluster.nodes]
    answer = client.post("/api/v1/runs", json=DDP)
    assert answer.status_code == 202, answer.text
    run = wait_for_run(client, answer.json()["id"], {"succeeded", "failed", "cancelled"}, timeout=800)
    after = [link_bytes(node) for node in cluster.nodes]
    assert run["status"] == "succeeded", run["error"]
    result = run["result"]
    summary, hardware = result["summary"], result["hardware"]
    assert summary["loss_max_rel_diff_vs_reference"] <= 1e-4
    assert summary["gradient_check"]["passed"], summary["gradient_check"]
    assert summary["comm_bytes_per_step"] == result["prediction"]["comm_bytes_per_step"], "DDP's bytes as on one host"
    assert sorted(hardware["hosts"]) == ["node0", "node1"] and hardware["nodes"] == 2
    assert hardware["inter_node_dims"] == ["dp"], "DDP's one dimension spans both nodes"
    # Every step's gradients cross the link: at least one gradient's worth each way per step.
    grads = summary["comm_bytes_per_step"]["all_reduce"]
    crossed = sum(a["tx"] - b["tx"] for a, b in zip(after, before, strict=True))
    assert crossed >= 2 * grads * STEPS, (crossed, grads)
    wait_until(lambda: not rank_processes(run["id"]), "every rank to be gone", timeout=30)
