"""`parallab pool create-slurm|list` and `parallab slurm-agent --pool NAME`: labs on a Slurm cluster.

An admin declares a Slurm pool once (straight to the lab's database, like `parallab user`); the
agent then runs on the cluster's login node under the lab's account — typically as a systemd
user service (docs/deploy.md) — and submits, watches, cancels and stores the pool's runs.
"""

from __future__ import annotations

import logging
import re
import signal
import threading
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from parallab.commands.jobspec import fail

pool_app = typer.Typer(
    help="Pools declared by an admin (a scheduler's, such as Slurm; Celery pools appear when their workers register).", no_args_is_help=True
)
console = Console()


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
    from pydantic import ValidationError

    from backend.config import get_settings
    from backend.db import session_scope
    from backend.services.pools import PoolError, declare_pool
    from parallab.core.pools import SlurmPool
    from parallab.core.spec import POOL_PATTERN

    if not re.fullmatch(POOL_PATTERN, name):
        fail(f"NAME: {name!r} is not a pool name (lower-case letters, digits, '-' and '_')")
    fields: dict[str, object] = {"python": python, "run_root": run_dir, "partition": partition, "account": account, "qos": qos}
    fields |= {"gpus_per_node": gpus_per_node, "time_limit": time, "max_nodes": max_nodes}
    try:
        settings = SlurmPool.model_validate(fields)
    except ValidationError as exc:
        flags = {"run_root": "--run-dir", "time_limit": "--time"}
        first = exc.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else ""
        fail(f"{flags.get(field, '--' + field.replace('_', '-'))}: {first['msg']}")
    try:
        with session_scope(get_settings().sqlalchemy_url) as session:
            declare_pool(session=session, name=name, settings=settings)
    except PoolError as exc:
        fail(f"NAME: {exc}")
    console.print(f"Slurm pool [bold]{name}[/bold] declared; start its agent on the login node: parallab slurm-agent --pool {name}")


@pool_app.command("list")
def list_() -> None:
    """Declared pools of every scheduler's kind (the registry's), with their settings."""
    from backend.config import get_settings
    from backend.db import session_scope
    from backend.services.pools import scheduled_pools

    table = Table("pool", "kind", "settings")
    with session_scope(get_settings().sqlalchemy_url) as session:
        for name, said in scheduled_pools(session=session).items():
            fields = said.model_dump(mode="json", exclude_none=True)
            table.add_row(name, said.kind, " ".join(f"{key}={value}" for key, value in fields.items()))
    console.print(table)


def slurm_agent(
    pool: Annotated[str, typer.Option(help="The Slurm pool whose runs this agent submits.")],
    once: Annotated[bool, typer.Option(help="One round (reconcile, submit, watch), then exit.")] = False,
    loglevel: str = "INFO",
) -> None:
    """Submit a Slurm pool's queued runs with sbatch, watch them, cancel them and store their results."""
    from backend.config import get_settings
    from workers.slurm_agent import NoSuchPool, SlurmAgent

    logging.basicConfig(level=loglevel.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = get_settings()
    try:
        agent = SlurmAgent(settings, pool)
    except NoSuchPool as exc:
        fail(f"--pool: {exc}")
    if once:
        agent.reconcile()
        agent.poll()
        return
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    console.print(f"Slurm agent of pool [bold]{pool}[/bold]: polling every {settings.slurm_poll_s:g} s")
    agent.run(stop)
