"""A 2 nodes × 2 ranks DDP job across an emulated cluster: each node a network namespace behind a
shaped link, each with its own worker of one pool (its ranks run inside its namespace, gloo binds
the node's link). The job matches `single` — loss, gradient check, bytes as predicted — its result
names the dimension that crossed nodes, and the gradients' bytes crossed the shaped link. Then a
partition: node 1's link taken down mid-run fails the job, with a reason, within the collective
timeout, and leaves no rank behind; and the same for a link that starts losing most of its
packets mid-run (TCP's retransmissions back off past the timeout)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

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
    wait_for_training,
    wait_until,
)
from workers.netns import EmulatedCluster, link_bytes

pytestmark = pytest.mark.slow

POOL = "emu"
STEPS = 3
COLLECTIVE_TIMEOUT_S = 20
"""A rank cut off fails in this time: the tiny model's collectives take well under a second even on
a loaded 2-core host, so 20 s fails a partition fast without failing a healthy run."""
LOSS_PCT = 80.0
"""Loss that stalls a collective past the timeout: seven losses in a row (p = 0.8⁷ ≈ 0.2 per
segment) back TCP's retransmission timer off to 25 s."""
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
                env = {**cluster.worker_env(node), "PARALLAB_COLLECTIVE_TIMEOUT_S": str(COLLECTIVE_TIMEOUT_S)}
                settings = host_settings(base, root / node.host, node.host).model_copy(update={"worker_address": node.address})
                procs.append(start_worker(settings, root / f"{node.host}.log", pool=POOL, extra_env=env))
            with api_client(base) as client:
                wait_until(lambda: {"node0", "node1"} <= set(live_hosts(client)), "both nodes' workers to register", timeout=90)
                yield client, cluster
        finally:
            for proc in procs:
                stop_worker(proc)


def run_across_the_link(client: TestClient, cluster: EmulatedCluster, spec: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """Submit `spec` to the emulated pool and wait for it to succeed; the run and the bytes its nodes
    sent over their links meanwhile."""
    before = [link_bytes(node) for node in cluster.nodes]
    answer = client.post("/api/v1/runs", json=spec)
    assert answer.status_code == 202, answer.text
    run = wait_for_run(client, answer.json()["id"], {"succeeded", "failed", "cancelled"}, timeout=800)
    after = [link_bytes(node) for node in cluster.nodes]
    assert run["status"] == "succeeded", run["error"]
    return run, sum(a["tx"] - b["tx"] for a, b in zip(after, before, strict=True))


@pytest.mark.timeout(900)
def test_ddp_across_two_emulated_nodes_matches_single_and_its_gradients_cross_the_link(emulated_pool) -> None:
    run, crossed = run_across_the_link(*emulated_pool, DDP)
    result = run["result"]
    summary, hardware = result["summary"], result["hardware"]
    assert summary["loss_max_rel_diff_vs_reference"] <= 1e-4
    assert summary["gradient_check"]["passed"], summary["gradient_check"]
    assert summary["comm_bytes_per_step"] == result["prediction"]["comm_bytes_per_step"], "DDP's bytes as on one host"
    assert sorted(hardware["hosts"]) == ["node0", "node1"] and hardware["nodes"] == 2
    assert hardware["inter_node_dims"] == ["dp_replicate"], "DDP's one dimension spans both nodes"
    # Every step's gradients cross the link: at least one gradient's worth each way per step.
    grads = summary["comm_bytes_per_step"]["all_reduce"]
    assert crossed >= 2 * grads * STEPS, (crossed, grads)
    wait_until(lambda: not rank_processes(run["id"]), "every rank to be gone", timeout=30)


TP_ACROSS = {
    "name": "2x2 fsdp x tp, tp across",
    "workload": {"model": "tiny", "steps": STEPS, "warmup_steps": 1},
    "strategy": {"name": "hybrid", "world_size": 4, "options": {"tp": 2}},
    "placement": {"pool": POOL, "nodes": 2, "order": "across"},
}


@pytest.mark.timeout(900)
def test_placement_across_runs_tp_over_the_link_and_the_run_records_it(emulated_pool) -> None:
    """fsdp 2 × tp 2 with `order: across`: each tp pair runs one rank per node (the hosts' record
    files say which mesh ranks each ran), the run names tp as the dimension that crossed, the
    prediction times tp on the link, tp's all-reduces cross it, and the loss still matches `single`."""
    run, crossed = run_across_the_link(*emulated_pool, TP_ACROSS)
    result = run["result"]
    summary, hardware = result["summary"], result["hardware"]
    assert hardware["placement_order"] == "across" and hardware["inter_node_dims"] == ["tp"]
    # Inner-first would run mesh ranks 0, 1 (one tp pair) on one host; across splits every pair.
    assert sorted(hardware["mesh_ranks_by_node"]) == [[0, 2], [1, 3]], hardware["mesh_ranks_by_node"]
    assert result["prediction"]["step_time_estimate"]["inter_node_dims"] == ["tp"]
    assert summary["loss_max_rel_diff_vs_reference"] <= 1e-4
    assert summary["gradient_check"]["passed"], summary["gradient_check"]
    # tp's activation all-reduces (the step's all_reduce bytes) cross the link every step.
    assert crossed >= summary["comm_bytes_per_step"]["all_reduce"] * STEPS, (crossed, summary["comm_bytes_per_step"])
    wait_until(lambda: not rank_processes(run["id"]), "every rank to be gone", timeout=30)


@pytest.mark.timeout(900)
def test_a_partitioned_node_fails_the_job_within_the_collective_timeout_leaving_no_rank(emulated_pool) -> None:
    client, cluster = emulated_pool
    long = {**DDP, "name": "2x2 partitioned", "workload": {**DDP["workload"], "steps": 5000}}
    run_id = client.post("/api/v1/runs", json=long).json()["id"]
    wait_for_training(client, run_id, timeout=300)
    cut = time.monotonic()
    cluster.set_link(cluster.nodes[1], up=False)
    try:
        run = wait_for_run(client, run_id, {"failed", "succeeded", "cancelled"}, timeout=COLLECTIVE_TIMEOUT_S + 240)
    finally:
        cluster.set_link(cluster.nodes[1], up=True)
    took = time.monotonic() - cut
    print(f"partition: run {run['status']} {took:.0f} s after the cut: {run['error']}")
    assert run["status"] == "failed" and run["result"] is None
    assert "host node" in run["error"], run["error"]
    assert took < COLLECTIVE_TIMEOUT_S + 180, took
    wait_until(lambda: not rank_processes(run_id), "every rank of the partitioned job to be gone", timeout=60)
    wait_until(lambda: all(w["run_id"] is None for w in live_hosts(client).values()), "both nodes to be free", timeout=60)


@pytest.mark.timeout(900)
def test_a_link_losing_most_packets_fails_the_job_within_the_collective_timeout_leaving_no_rank(emulated_pool) -> None:
    client, cluster = emulated_pool
    long = {**DDP, "name": "2x2 lossy", "workload": {**DDP["workload"], "steps": 5000}}
    run_id = client.post("/api/v1/runs", json=long).json()["id"]
    wait_for_training(client, run_id, timeout=300)
    start = time.monotonic()
    cluster.set_loss(cluster.nodes[1], LOSS_PCT)
    try:
        run = wait_for_run(client, run_id, {"failed", "succeeded", "cancelled"}, timeout=COLLECTIVE_TIMEOUT_S + 240)
        dropped = cluster.dropped(cluster.nodes[1])
    finally:
        cluster.set_loss(cluster.nodes[1], 0)
    took = time.monotonic() - start
    print(f"loss {LOSS_PCT:g} %: run {run['status']} {took:.0f} s after the loss began ({dropped} packets dropped): {run['error']}")
    assert dropped > 0, "the rule dropped packets on the link"
    assert run["status"] == "failed" and run["result"] is None
    assert "host node" in run["error"], run["error"]
    assert took < COLLECTIVE_TIMEOUT_S + 180, took
    wait_until(lambda: not rank_processes(run_id), "every rank of the lossy job to be gone", timeout=60)
    wait_until(lambda: all(w["run_id"] is None for w in live_hosts(client).values()), "both nodes to be free", timeout=60)
