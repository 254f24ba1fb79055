"""Layouts across an emulated cluster: TP inside a node against TP across nodes, and four layouts
of 2 nodes × 2 ranks, at two link rates — measured step times beside the planner's prediction.

    sudo python benchmarks/emulated_layouts.py [--rates 1gbit 100mbit] [--steps 4]

Each rate gets its own `workers.netns.EmulatedCluster` (2 namespaces, tbf-shaped links). A job
runs as the workers would run it: one torchrun per node inside its namespace (`workers.launcher.launch`
with the node's `netns` and a c10d `NodeLaunch`), the records of both nodes merged by
`workers.aggregate.build_result`, whose `prediction.step_time_s` is the planner's estimate for the
run's hardware. "tp=2 inside" runs both ranks in node 0; "tp=2 across" one rank in each node.
Prints a Markdown table per rate and Spearman's ρ between predicted and measured step times of
the four 2 × 2 layouts; the load average beside them (this machine is shared).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from parallab.core.jobs import Limits, ResolvedJob, resolve_job  # noqa: E402
from parallab.core.rundir import RunDir  # noqa: E402
from parallab.core.spec import JobSpec  # noqa: E402
from workers.aggregate import build_result, read_node_records  # noqa: E402
from workers.launcher import NodeLaunch, launch  # noqa: E402
from workers.netns import ClusterSpec, EmulatedCluster, LinkShape, parse_rate  # noqa: E402

PAIR = [("tp=2 inside a node", "tp", 2, {}, 1), ("tp=2 across nodes", "tp", 2, {}, 2)]
FOUR = [
    ("ddp 4 (dp across)", "ddp", 4, {}, 2),
    ("fsdp 4 (dp_shard across)", "fsdp", 4, {}, 2),
    ("fsdp 2 × tp 2 (tp inside)", "hybrid", 4, {"tp": 2}, 2),
    ("tp 4 (tp across)", "tp", 4, {}, 2),
]


def job_of(strategy: str, world: int, options: dict[str, Any], nodes: int, steps: int) -> ResolvedJob:
    doc = {
        "workload": {"model": "tiny", "steps": steps, "warmup_steps": 1},
        "strategy": {"name": strategy, "world_size": world, "options": options},
        "placement": {"nodes": nodes} if nodes > 1 else None,
    }
    return resolve_job(JobSpec.model_validate(doc), Limits(max_world_size=16, max_steps=1000))


def run_across(cluster: EmulatedCluster, job: ResolvedJob, root: Path, port: int) -> dict[str, Any]:
    """Run `job` on the cluster's first `job.nodes` nodes; its result document as a dict."""
    nodes = cluster.nodes[: job.nodes]
    dirs = [RunDir(root / f"node{n.index}") for n in nodes]
    outcomes: list[Any] = [None] * len(nodes)

    def one(i: int) -> None:
        node = None
        if job.nodes > 1:
            node = NodeLaunch(job.nodes, i, f"{nodes[0].address}:{port}", root.name, join_timeout_s=300, local_addr=nodes[i].address)
        outcomes[i] = launch(job, dirs[i], timeout_s=900, trace_cap_bytes=16 << 20, node=node, netns=nodes[i].netns)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(nodes))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    failed = [o.reason for o in outcomes if not o.ok]
    if failed:
        raise RuntimeError(f"{job.strategy}: {failed}: {outcomes[0].log_tail[-2000:]}")
    records = sorted((r for d in dirs for r in read_node_records(d)), key=lambda r: r.rank)
    return build_result(job, records, hosts=[n.host for n in nodes]).model_dump(mode="json")


def row(label: str, doc: dict[str, Any]) -> dict[str, Any]:
    s, p = doc["summary"], doc["prediction"]
    return {
        "layout": label,
        "measured_ms": s["step_time_s"]["median"] * 1e3,
        "predicted_ms": (p.get("step_time_s") or float("nan")) * 1e3,
        "comm_fraction": s.get("comm_time_fraction"),
        "exposed_fraction": s.get("exposed_comm_fraction"),
        "wire_mb": sum((s.get("wire_bytes_per_step") or s.get("comm_bytes_per_step") or {}).values()) / 1e6,
        "crossing": ",".join(doc["hardware"].get("inter_node_dims", [])) or "-",
        "loss_diff": s.get("loss_max_rel_diff_vs_reference"),
    }


def spearman(a: list[float], b: list[float]) -> float:
    def ranks(xs: list[float]) -> list[int]:
        order = sorted(range(len(xs)), key=lambda i: xs[i])
        out = [0] * len(xs)
        for r, i in enumerate(order):
            out[i] = r
        return out

    ra, rb, n = ranks(a), ranks(b), len(a)
    return 1 - 6 * sum((x - y) ** 2 for x, y in zip(ra, rb, strict=True)) / (n * (n * n - 1))


def fmt(x: float | None, spec: str) -> str:
    return "—" if x is None or x != x else format(x, spec)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rates", nargs="+", default=["1gbit", "100mbit"])
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    os.environ.update(GLOO_SOCKET_IFNAME="eth0", OMP_NUM_THREADS="1")
    port = 29600
    for rate in args.rates:
        with EmulatedCluster(ClusterSpec(2, 2, LinkShape(parse_rate(rate)))) as cluster, tempfile.TemporaryDirectory() as tmp:
            rows = []
            for label, strategy, world, options, nodes in PAIR + FOUR:
                port += 1
                job = job_of(strategy, world, options, nodes, args.steps)
                rows.append(row(label, run_across(cluster, job, Path(tmp) / f"r{port}", port)))
            load = os.getloadavg()
        print(f"\n### {rate} links (load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f})\n")
        print(
            "| layout | crosses nodes | MB/step per rank | measured step (ms) | predicted (ms) "
            "| comm fraction | exposed comm | loss vs single |"
        )
        print("|---|---|---:|---:|---:|---:|---:|---:|")
        for r in rows:
            print(
                f"| {r['layout']} | {r['crossing']} | {r['wire_mb']:.2f} | {r['measured_ms']:.0f} | {fmt(r['predicted_ms'], '.0f')} | "
                f"{fmt(r['comm_fraction'], '.2f')} | {fmt(r['exposed_fraction'], '.2f')} | {fmt(r['loss_diff'], '.1e')} |"
            )
        four = rows[len(PAIR) :]
        if all(r["predicted_ms"] == r["predicted_ms"] for r in four):
            rho = spearman([r["predicted_ms"] for r in four], [r["measured_ms"] for r in four])
            print(f"\nSpearman ρ (predicted vs measured step time, 4 layouts of 2 × 2): {rho:+.2f}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
