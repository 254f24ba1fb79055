"""Layouts across an emulated cluster: TP inside a node against TP across nodes, and four layouts
of 2 nodes × 2 ranks, at two link rates — measured step times beside the planner's prediction.

    sudo python benchmarks/emulated_layouts.py [--rates 1gbit 200mbit] [--steps 6] [--write-band]

Each rate gets its own `workers.netns.EmulatedCluster` (2 namespaces, tbf-shaped links), whose
link is first measured (`workers.linkprobe`, gloo send/recv across and inside a node: β, the
wire's floor and α, the per-step cost the planner charges each collective's ring) into the
pool topology `parallab lab emulate` would record. A job runs as the workers would run it: one
torchrun per node inside its namespace (`workers.launcher.launch` with the node's `netns` and a
c10d `NodeLaunch`), the records of both nodes merged by `workers.aggregate.build_result` with that
topology, so `prediction.step_time_s` is the planner's estimate with the dimensions that cross
nodes timed on the measured link. "tp inside" and "tp across" are fsdp 2 × tp 2 placed
`inner-first` (each tp pair in one node, FSDP across) and `across` (each tp pair split over the
nodes, FSDP inside). Per layout: the measured step (median) and the prediction; per mesh dimension, the
measured communication (the matched collectives' transfer time once every member arrived, per
step) beside the predicted; and Spearman's ρ between predicted and measured step times of the four
2 × 2 layouts; the load average beside them (this machine is shared).

The pool is calibrated first (`workers.emulated_calibration`: the project's `calibrate` job in
node 0's namespace, once with 2 ranks and once with 4 — CPU ranks share the host's cores, so each
job is predicted with the profile measured at its own size), so the estimate's compute is what
the host measured, not the catalogue CPU's. `--write-band` stores each row's step-time error by
kind as the calibrated CPU pool's band (`parallab/core/profiles/bands_cpu.json`, read by
`parallab.core.accuracy`): run it at link rates other than the ones the band is then judged on,
so the band rests on held-out runs. Judged runs print the band each prediction carries and
whether the measured step lies inside it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from parallab.core.accuracy import CPU_BANDS_FILE, kind_of  # noqa: E402
from parallab.core.hardware import HardwareProfile  # noqa: E402
from parallab.core.jobs import Limits, ResolvedJob, resolve_job  # noqa: E402
from parallab.core.pools import LinkFigures, PoolTopology  # noqa: E402
from parallab.core.rundir import RunDir  # noqa: E402
from parallab.core.spec import JobSpec  # noqa: E402
from workers.aggregate import build_result, read_node_records  # noqa: E402
from workers.emulated_calibration import LAST_SPEED, calibrate_node  # noqa: E402
from workers.launcher import NodeLaunch, launch  # noqa: E402
from workers.linkprobe import link_figures, probe  # noqa: E402
from workers.netns import ClusterSpec, EmulatedCluster, LinkShape, parse_rate  # noqa: E402

Layout = tuple[str, str, int, dict[str, Any], int, str]
"""(label, strategy, world size, options, nodes, placement order)."""

FOUR: list[Layout] = [
    ("fsdp 2 × tp 2, tp inside a node (FSDP across)", "hybrid", 4, {"tp": 2}, 2, "inner-first"),
    ("fsdp 2 × tp 2, tp across nodes (FSDP inside)", "hybrid", 4, {"tp": 2}, 2, "across"),
    ("ddp 4 (dp across)", "ddp", 4, {}, 2, "inner-first"),
    ("fsdp 4 (dp_shard across)", "fsdp", 4, {}, 2, "inner-first"),
]
"""The four layouts of 2 nodes × 2 ranks; the first two are the same layout with tp inside a node
and across nodes (`placement.order`)."""


def job_of(strategy: str, world: int, options: dict[str, Any], nodes: int, steps: int, order: str = "inner-first") -> ResolvedJob:
    doc = {
        "workload": {"model": "tiny", "steps": steps, "warmup_steps": 1},
        "strategy": {"name": strategy, "world_size": world, "options": options},
        "placement": {"nodes": nodes, "order": order} if nodes > 1 else None,
    }
    return resolve_job(JobSpec.model_validate(doc), Limits(max_world_size=16, max_steps=1000))


def topology_of(cluster: EmulatedCluster) -> PoolTopology:
    """The pool topology of `cluster`: declared link, and both paths as gloo measures them."""
    a, b = cluster.nodes[0], cluster.nodes[1]
    inter = probe(cluster.exec_args(a), cluster.exec_args(b), f"{a.address}:29431", megabytes=16)
    intra = probe(cluster.exec_args(a), cluster.exec_args(a), f"{a.address}:29432", megabytes=16)
    return PoolTopology(
        source="emulated",
        nodes=cluster.spec.nodes,
        ranks_per_node=cluster.spec.ranks_per_node,
        inter_node=LinkFigures(bandwidth_bps=cluster.spec.link.rate_bps, latency_s=cluster.spec.link.latency_s),
        measured_inter_node=link_figures(inter),
        measured_intra_node=link_figures(intra),
    )


def run_across(
    cluster: EmulatedCluster, job: ResolvedJob, root: Path, port: int, topology: PoolTopology, profile: HardwareProfile | None
) -> dict[str, Any]:
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
    return build_result(job, records, hosts=[n.host for n in nodes], topology=topology, profile=profile).model_dump(mode="json")


def measured_by_dim(doc: dict[str, Any]) -> dict[str, float]:
    """Seconds per step each mesh dimension's collectives spent moving data once all members had
    arrived (the matching's transfer time, averaged over the dimension's groups)."""
    matched = doc.get("collectives_matched") or {}
    steps = max(int(matched.get("steps") or 0), 1)
    total: dict[str, float] = {}
    groups: dict[str, int] = {}
    for g in matched.get("groups", []):
        dim = g.get("dim") or "?"
        total[dim] = total.get(dim, 0.0) + g["transfer_s"]
        groups[dim] = groups.get(dim, 0) + 1
    return {dim: total[dim] / groups[dim] / steps for dim in total}


def matched_calls(doc: dict[str, Any]) -> float | None:
    """Collectives matched per step in the profiled window, over every group (`GroupMatch.matched`)."""
    matched = doc.get("collectives_matched") or {}
    steps = max(int(matched.get("steps") or 0), 1)
    groups = matched.get("groups") or []
    if not groups:
        return None
    return sum(int(g.get("matched") or 0) for g in groups) / steps


def row(label: str, rate: str, kind: str, doc: dict[str, Any]) -> dict[str, Any]:
    s, p = doc["summary"], doc["prediction"]
    estimate = p.get("step_time_estimate") or {}
    return {
        "host_ops_per_s": (doc.get("host_speed") or {}).get("ops_per_s"),
        "matched_calls_per_step": matched_calls(doc),
        "layout": label,
        "rate": rate,
        "kind": kind,
        "band": p.get("band"),
        "measured_ms": s["step_time_s"]["median"] * 1e3,
        "predicted_ms": (p.get("step_time_s") or float("nan")) * 1e3,
        "comm_fraction": s.get("comm_time_fraction"),
        "exposed_fraction": s.get("exposed_comm_fraction"),
        "wire_mb": sum((s.get("wire_bytes_per_step") or s.get("comm_bytes_per_step") or {}).values()) / 1e6,
        "crossing": ",".join(doc["hardware"].get("inter_node_dims", [])) or "-",
        "loss_diff": s.get("loss_max_rel_diff_vs_reference"),
        "measured_dims": measured_by_dim(doc),
        "predicted_dims": estimate.get("comm_by_dim", {}),
        "predicted_exposed_dims": estimate.get("exposed_by_dim", {}),
        "predicted_exposed_ms": estimate.get("exposed_comm_s", float("nan")) * 1e3,
        "predicted_compute_ms": estimate.get("compute_s", float("nan")) * 1e3,
    }


def band_cell(r: dict[str, Any]) -> str:
    """'±31 % (n=4): in' — the band the prediction carried and whether the measured step lies in it."""
    band = r["band"]
    if not band:
        return "none stated"
    error = r["predicted_ms"] / r["measured_ms"] - 1
    inside = abs(error) <= band["step_time_share"]
    return f"±{band['step_time_share']:.0%} (n={band['n']}): {'in' if inside else '**out**'}"


def write_band(rows: list[dict[str, Any]], load: tuple[float, float, float], path: Path = CPU_BANDS_FILE) -> None:
    """Each row's step-time error (predicted over measured, less one) by kind: the calibrated CPU
    pool's band, replacing the file's (these rows are its held-out runs)."""
    today = datetime.date.today().isoformat()
    bands: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        name = f"{r['layout']} at {r['rate']}, emulated 2 × 2 CPU pool, {today}"
        bands.setdefault(r["kind"], []).append({"name": name, "step_time_error": round(r["predicted_ms"] / r["measured_ms"] - 1, 4)})
    rates = sorted({r["rate"] for r in rows})
    doc = {
        "source": f"benchmarks/emulated_layouts.py --rates {' '.join(rates)} --write-band (load average {load[0]:.1f})",
        "bands": bands,
    }
    path.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")


def dims_cell(measured: dict[str, float], predicted: dict[str, float], exposed: dict[str, float] | None = None) -> str:
    """'tp 41 / 26 (26)' per dimension: measured / predicted ms per step (predicted exposed)."""
    names = sorted(set(measured) | set(predicted))
    nan = float("nan")
    return ", ".join(
        f"{d} {fmt(measured.get(d, nan) * 1e3, '.0f')} / {fmt(predicted.get(d, nan) * 1e3, '.0f')}"
        + (f" ({fmt(exposed.get(d, nan) * 1e3, '.0f')})" if exposed is not None else "")
        for d in names
    )


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


def calibrate(cluster: EmulatedCluster, root: Path) -> dict[int, HardwareProfile]:
    """The pool's profile at 4 ranks (every layout here runs 4), measured in node 0 (link-independent: once a run)."""
    return {w: calibrate_node(cluster.nodes[0].netns, w, root / f"calibrate{w}") for w in (4,)}


def print_table(rate: str, rows: list[dict[str, Any]], topology: PoolTopology, load: tuple[float, float, float]) -> None:
    inter, intra = topology.measured_inter_node, topology.measured_intra_node
    assert inter is not None and intra is not None
    print(f"\n### {rate} links (load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f})\n")
    print(
        f"link measured: {inter.bandwidth_bps / 1e6:.0f} Mbit/s across ({inter.latency_s * 1e3:.2f} ms one way, "
        f"α {inter.step_s * 1e3:.2f} ms a step), {intra.bandwidth_bps / 1e9:.1f} Gbit/s inside a node "
        f"({intra.latency_s * 1e3:.2f} ms, α {intra.step_s * 1e3:.2f} ms)\n"
    )
    print(
        "| layout | crosses nodes | MB/step per rank | measured step (ms) | predicted (ms) | error | band | predicted compute (ms) "
        "| exposed comm, measured / predicted (ms) | comm per dim, measured / predicted (predicted exposed) (ms) | loss vs single |"
    )
    print("|---|---|---:|---:|---:|---:|---|---:|---:|---|---:|")
    for r in rows:
        exposed = (r["exposed_fraction"] or float("nan")) * r["measured_ms"]
        print(
            f"| {r['layout']} | {r['crossing']} | {r['wire_mb']:.2f} | {r['measured_ms']:.0f} | {fmt(r['predicted_ms'], '.0f')} | "
            f"{r['predicted_ms'] / r['measured_ms'] - 1:+.0%} | {band_cell(r)} | "
            f"{fmt(r['predicted_compute_ms'], '.0f')} | {fmt(exposed, '.0f')} / {fmt(r['predicted_exposed_ms'], '.0f')} | "
            f"{dims_cell(r['measured_dims'], r['predicted_dims'], r['predicted_exposed_dims'])} | {fmt(r['loss_diff'], '.1e')} |"
        )
    four = rows
    if all(r["predicted_ms"] == r["predicted_ms"] for r in four):
        rho = spearman([r["predicted_ms"] for r in four], [r["measured_ms"] for r in four])
        print(f"\nSpearman ρ (predicted vs measured step time, 4 layouts of 2 × 2): {rho:+.2f}")
    print("\nHost speed (the fixed CPU probe, `parallab.core.hostspeed`) at calibration and beside each run's steps:\n")
    print("| layout | load | probe beside the steps (ops/s) | calibration's / run's | collectives matched per step |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        ratio = (r.get("calibration_ops_per_s") or float("nan")) / (r.get("host_ops_per_s") or float("nan"))
        print(
            f"| {r['layout']} | {r.get('load', float('nan')):.1f} | {fmt(r.get('host_ops_per_s'), '.3g')} | {fmt(ratio, '.2f')} | "
            f"{fmt(r.get('matched_calls_per_step'), '.0f')} |"
        )
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rates", nargs="+", default=["1gbit", "200mbit"])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--no-calibrate", action="store_true", help="predict with the catalogue CPU, as an uncalibrated pool")
    parser.add_argument("--write-band", action="store_true", help="store these rows as the calibrated CPU pool's band")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    os.environ.update(GLOO_SOCKET_IFNAME="eth0", OMP_NUM_THREADS="1")
    port = 29600
    profiles: dict[int, HardwareProfile] = {}
    every: list[dict[str, Any]] = []
    load = os.getloadavg()
    for rate in args.rates:
        with EmulatedCluster(ClusterSpec(2, 2, LinkShape(parse_rate(rate)))) as cluster, tempfile.TemporaryDirectory() as tmp:
            if not args.no_calibrate and not profiles:
                profiles = calibrate(cluster, Path(tmp))
                for w, p in profiles.items():
                    speed = LAST_SPEED.get(cluster.nodes[0].netns)
                    print(
                        f"calibrated at {w} ranks (load {os.getloadavg()[0]:.1f}, host probe "
                        f"{speed.ops_per_s if speed else float('nan'):.3g} ops/s): "
                        f"op {p.op_overhead_s}, dtensor op {p.dtensor_op_overhead_s}",
                        file=sys.stderr,
                    )
            topology = topology_of(cluster)
            rows = []
            for label, strategy, world, options, nodes, order in FOUR:
                port += 1
                job = job_of(strategy, world, options, nodes, args.steps, order)
                doc = run_across(cluster, job, Path(tmp) / f"r{port}", port, topology, profiles.get(world))
                speed = LAST_SPEED.get(cluster.nodes[0].netns)
                extra = {
                    "load": os.getloadavg()[0],
                    "calibration_ops_per_s": speed.ops_per_s if speed else None,
                    "alpha_ms": {
                        path: fig.step_s * 1e3
                        for path, fig in (("across", topology.measured_inter_node), ("inside", topology.measured_intra_node))
                        if fig
                    },
                }
                rows.append(row(label, rate, kind_of(job), doc) | extra)
                print(f"{label} at {rate}: {json.dumps(rows[-1], ensure_ascii=False)}", file=sys.stderr)
            load = os.getloadavg()
        print_table(rate, rows, topology, load)
        every += rows
    if args.json:
        args.json.write_text(json.dumps(every, indent=2, ensure_ascii=False))
    if args.write_band:
        write_band(every, load)
        print(f"\nwrote {CPU_BANDS_FILE.name}: {len(every)} runs", file=sys.stderr)


if __name__ == "__main__":
    main()
