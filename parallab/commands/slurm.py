"""`parallab pool create-slurm` and `parallab slurm-agent --pool NAME`: labs on a Slurm cluster.

An admin declares a Slurm pool once (straight to the lab's database, like `parallab user`); the
agent then runs on the cluster's login node under the lab's account — typically as a systemd
user service (docs/deploy.md) — and submits, watches, cancels and stores the pool's runs.
"""

from __future__ import annotations

from typing import Annotated

import typer

from parallab.commands.pools import console, declare_from_flags, pool_app, run_agent


@pool_app.command("create-slurm")
def create_slurm(
    name: Annotated[str, typer.Argument(help="The pool's name, as jobs place on it (e.g. a100-slurm).")],
    python: Annotated[str, typer.Option(help="The Python on the cluster's nodes with parallab and torch installed (absolute path).")],
    run_dir: Annotated[str, typer.Option("--run-dir", help="A directory on the cluster's shared filesystem for run directories.")],
    partition: Annotated[str | None, typer.Option(help="sbatch --partition (default: the cluster's default).")] = None,
    account: Annotated[str | None, typer.Option(help="sbatch --account.")] = None,
    qos: Annotated[str | None, typer.Option(help="sbatch --qos.")] = None,
    gpus_per_node: Annotated[int, typer.Option(help="sbatch --gpus-per-node; 0 for CPU nodes.")] = 0,
    time: Annotated[str | None, typer.Option("--time", help="sbatch --time (Slurm's format); default: PARALLAB_MAX_JOB_SECONDS.")] = None,
    max_nodes: Annotated[int, typer.Option(help="The most nodes one job may ask for.")] = 1024,
) -> None:
    """Declare (or update) a pool whose jobs go through sbatch."""
    from parallab.core.pools import SlurmPool

    fields: dict[str, object] = {"python": python, "run_root": run_dir, "partition": partition, "account": account, "qos": qos}
    fields |= {"gpus_per_node": gpus_per_node, "time_limit": time, "max_nodes": max_nodes}
    declare_from_flags(name, SlurmPool, fields, {"run_root": "--run-dir", "time_limit": "--time"})
    console.print(f"Slurm pool [bold]{name}[/bold] declared; start its agent on the login node: parallab slurm-agent --pool {name}")


def slurm_agent(
    pool: Annotated[str, typer.Option(help="The Slurm pool whose runs this agent submits.")],
    once: Annotated[bool, typer.Option(help="One round (reconcile, submit, watch), then exit.")] = False,
    loglevel: str = "INFO",
) -> None:
    """Submit a Slurm pool's queued runs with sbatch, watch them, cancel them and store their results."""
    from backend.config import get_settings
    from workers.slurm_agent import SlurmAgent

    settings = get_settings()
    run_agent(
        lambda: SlurmAgent(settings, pool), pool=pool, once=once, loglevel=loglevel, poll_s=settings.worker.slurm_poll_s, label="Slurm"
    )
