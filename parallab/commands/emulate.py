"""`parallab lab emulate`: a cluster in a box — N nodes as network namespaces, one worker each.

The nodes and their shaped links come from `workers.netns.EmulatedCluster`; this command adds what
makes them a pool: the link is measured (gloo send/recv between two nodes, and between two ranks
of one node), the pool's topology — declared and measured — is written to its settings where a
planner reads it, the pool is calibrated (the `calibrate` job with every emulated rank at once
inside node 0: the nodes share this host's cores, so that is what each rank of a job filling the
pool gets) so its plans and its runs' predictions use measured compute rather than the catalogue
CPU's, and one `parallab worker --pool NAME` per node registers as its own host, its ranks running
inside its node's namespace. It holds until Ctrl-C (or SIGTERM), then stops the
workers and removes every namespace and link; a crash does the same on its way out.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from types import FrameType
from typing import Annotated, Any

import typer
from rich.console import Console

from parallab.commands.jobspec import fail

lab_app = typer.Typer(help="Lab set-ups on this machine (an emulated multi-node cluster).", no_args_is_help=True)
console = Console(stderr=True)


def spec_from_flags(nodes: int, ranks_per_node: int, inter_node: str, latency: str, jitter: str, loss: float) -> Any:
    """The cluster the flags describe; exits 2 naming each flag at fault."""
    from workers.netns import BadShape, ClusterSpec, LinkShape, parse_rate, parse_time

    try:
        link = LinkShape(
            parse_rate(inter_node),
            parse_time(latency, flag="--latency"),
            parse_time(jitter, flag="--jitter"),
            loss,
        )
    except BadShape as exc:
        fail(f"parallab lab emulate: {exc}")
    spec = ClusterSpec(nodes, ranks_per_node, link)
    problems = spec.problems()
    if problems:
        fail(*(f"parallab lab emulate: {p}" for p in problems))
    return spec


def measure(cluster: Any) -> tuple[Any, Any]:
    """(inter-node, intra-node) figures — β, the wire's latency and α — measured with gloo between
    node 0 and node 1, and twice in node 0."""
    from workers.linkprobe import link_figures, probe

    a, b = cluster.nodes[0], cluster.nodes[1]
    inter = probe(cluster.exec_args(a), cluster.exec_args(b), f"{a.address}:29431")
    intra = probe(cluster.exec_args(a), cluster.exec_args(a), f"{a.address}:29432")
    return link_figures(inter), link_figures(intra)


def record(pool: str, cluster: Any, measured: tuple[Any, Any] | None) -> Any:
    """Write the pool's topology (declared, and measured when given) to its settings; returns it."""
    from backend.config import get_settings
    from backend.db import session_scope
    from backend.services import pools
    from parallab.core.pools import LinkFigures, PoolTopology

    link = cluster.spec.link
    topology = PoolTopology(
        source="emulated",
        nodes=cluster.spec.nodes,
        ranks_per_node=cluster.spec.ranks_per_node,
        inter_node=LinkFigures(bandwidth_bps=link.rate_bps, latency_s=link.latency_s),
        measured_inter_node=measured[0] if measured else None,
        measured_intra_node=measured[1] if measured else None,
    )
    with session_scope(get_settings().sqlalchemy_url) as session:
        pools.record_topology(session=session, name=pool, topology=topology)
    return topology


def calibrate(pool: str, cluster: Any, model: str) -> Any:
    """Run the `calibrate` job in node 0 with all the cluster's ranks and store the profile as the pool's."""
    import tempfile
    from pathlib import Path

    from backend.config import get_settings
    from backend.db import session_scope
    from backend.services.hardware import store_profile
    from workers.emulated_calibration import calibrate_node

    world = cluster.spec.nodes * cluster.spec.ranks_per_node
    with tempfile.TemporaryDirectory(prefix="parallab-calibrate-") as tmp:
        profile = calibrate_node(cluster.nodes[0].netns, world, Path(tmp), model=model)
    with session_scope(get_settings().sqlalchemy_url) as session:
        store_profile(session=session, profile=profile, pool=pool, key=f"{profile.device.kind}:{profile.device.name}")
    return profile


def start_workers(cluster: Any, pool: str) -> list[subprocess.Popen[bytes]]:
    """One `parallab worker --pool POOL` per node, each its own host with its ranks in its namespace."""
    procs = []
    for node in cluster.nodes:
        env = {**os.environ, **cluster.worker_env(node)}
        cmd = [sys.executable, "-m", "parallab", "worker", "--pool", pool, "--loglevel", "WARNING"]
        procs.append(subprocess.Popen(cmd, env=env, start_new_session=True))
    return procs


def _raise_on_term(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


@lab_app.command("emulate")
def emulate(
    nodes: Annotated[int, typer.Option(help="Emulated nodes (network namespaces).")] = 2,
    ranks_per_node: Annotated[int, typer.Option(help="Ranks (devices) per node; they share the node's namespace.")] = 2,
    inter_node: Annotated[str, typer.Option(help="Each node's link rate, tc's units: 1gbit, 200mbit.")] = "1gbit",
    latency: Annotated[str, typer.Option(help="One-way latency of a link (netem): 200us, 1ms; 0 for none.")] = "0",
    jitter: Annotated[str, typer.Option(help="Latency jitter (netem): 50us; 0 for none.")] = "0",
    loss: Annotated[float, typer.Option(help="Packet loss of a link in percent (nftables drops that share on arrival); 0 for none.")] = 0.0,
    pool: Annotated[str, typer.Option(help="The pool the nodes' workers serve.")] = "emulated",
    workers: Annotated[bool, typer.Option(help="Start one parallab worker per node (--no-workers: namespaces only).")] = True,
    probe: Annotated[bool, typer.Option(help="Measure both paths with gloo before serving (--no-probe: declared figures only).")] = True,
    calibrate_pool: Annotated[
        bool,
        typer.Option(
            "--calibrate/--no-calibrate",
            help="Calibrate the pool before serving (all its ranks at once in node 0); --no-calibrate: catalogue CPU figures.",
        ),
    ] = True,
    calibrate_model: Annotated[str, typer.Option(help="The model preset whose GEMM shapes the calibration times.")] = "tiny",
) -> None:
    """Emulate NODES nodes of RANKS-PER-NODE ranks joined by shaped links, until Ctrl-C."""
    from workers.emulated_calibration import CalibrationFailed
    from workers.launcher import stop_process_group
    from workers.netns import BadShape, EmulatedCluster, Refused

    spec = spec_from_flags(nodes, ranks_per_node, inter_node, latency, jitter, loss)
    cluster = EmulatedCluster(spec)
    signal.signal(signal.SIGTERM, _raise_on_term)
    # Ctrl-C tears the cluster down even where the CLI started with SIGINT ignored (a background
    # job of a non-interactive shell inherits it ignored, and Python then installs no handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        cluster.up()
        names = ", ".join(f"{n.host}={n.netns}@{n.address}" for n in cluster.nodes)
        console.print(f"emulated {nodes} nodes × {ranks_per_node} ranks, links {inter_node} / {latency}: {names}")
        measured = measure(cluster) if probe else None
        topology = record(pool, cluster, measured)
        console.print(f"pool {pool}: {topology.model_dump_json(exclude_none=True)}")
        if calibrate_pool:
            console.print(f"calibrating pool {pool} ({nodes * ranks_per_node} ranks at once, {calibrate_model}'s shapes)")
            profile = calibrate(pool, cluster, calibrate_model)
            console.print(f"pool {pool}: calibrated (op overhead {profile.op_overhead_s or 0:.2e} s, {len(profile.matmul)} GEMMs)")
        if workers:
            procs = start_workers(cluster, pool)
        console.print("[bold]up[/bold] — Ctrl-C tears it down")
        while True:
            time.sleep(1)
            if any(p.poll() is not None for p in procs):
                console.print("[red]a node's worker exited; tearing the cluster down[/red]")
                raise typer.Exit(1)
    except (Refused, BadShape, CalibrationFailed) as exc:
        console.print(f"[red]parallab lab emulate: {exc}[/red]")
        raise typer.Exit(2 if isinstance(exc, BadShape) else 1) from None
    except KeyboardInterrupt:
        console.print("stopping")
    finally:
        for proc in procs:
            stop_process_group(proc, grace_s=20)
        cluster.down()
