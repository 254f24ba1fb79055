"""`parallab pool create-ray` and `parallab ray-agent --pool NAME`: labs on a Ray cluster.

An admin declares a Ray pool once (straight to the lab's database, like a Slurm pool); its agent
then runs wherever it reaches both the lab's database and the cluster's head (docs/ray.md), and
launches, watches, cancels and stores the pool's runs.
"""

from __future__ import annotations

from typing import Annotated

import typer

from parallab.commands.pools import console, declare_from_flags, pool_app, run_agent


@pool_app.command("create-ray")
def create_ray(
    name: Annotated[str, typer.Argument(help="The pool's name, as jobs place on it (e.g. ray-cpu).")],
    address: Annotated[str, typer.Option(help="The Ray cluster's address (its head's GCS host:port, or auto).")],
    run_dir: Annotated[str, typer.Option("--run-dir", help="A directory every Ray node and the agent share, for run directories.")],
    gpus_per_rank: Annotated[int, typer.Option(help="GPUs in each rank's bundle: 1 for CUDA ranks (NCCL), 0 for CPU ranks (gloo).")] = 0,
    cpus_per_rank: Annotated[float, typer.Option(help="CPUs in each rank's bundle.")] = 1.0,
    strategy: Annotated[str, typer.Option(help="The placement group's strategy: PACK or STRICT_PACK (one node).")] = "PACK",
    namespace: Annotated[str | None, typer.Option(help="The Ray namespace of the pool's actors (default: parallab-NAME).")] = None,
    place_timeout: Annotated[float, typer.Option(help="Seconds a launch waits for the cluster to place every bundle.")] = 60.0,
    max_ranks: Annotated[int, typer.Option(help="The most ranks one job may ask for.")] = 1024,
) -> None:
    """Declare (or update) a pool whose jobs run as Ray actors, one a rank, in a placement group."""
    from parallab.core.pools import RayPool

    fields: dict[str, object] = {"address": address, "run_root": run_dir, "namespace": namespace, "strategy": strategy.upper()}
    fields |= {"gpus_per_rank": gpus_per_rank, "cpus_per_rank": cpus_per_rank, "place_timeout_s": place_timeout, "max_ranks": max_ranks}
    declare_from_flags(name, RayPool, fields, {"run_root": "--run-dir", "place_timeout_s": "--place-timeout"})
    console.print(f"Ray pool [bold]{name}[/bold] declared; start its agent: parallab ray-agent --pool {name}")


def ray_agent(
    pool: Annotated[str, typer.Option(help="The Ray pool whose runs this agent launches.")],
    poll_s: Annotated[float, typer.Option(help="Seconds between rounds.")] = 2.0,
    once: Annotated[bool, typer.Option(help="One round (reconcile, submit, watch), then exit.")] = False,
    loglevel: str = "INFO",
) -> None:
    """Launch a Ray pool's queued runs as actors in placement groups, watch them, cancel them and store their results."""
    from backend.config import get_settings
    from workers.ray_agent import RayAgent

    run_agent(lambda: RayAgent(get_settings(), pool, poll_s=poll_s), pool=pool, once=once, loglevel=loglevel, poll_s=poll_s, label="Ray")
