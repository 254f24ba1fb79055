"""`parallab pool …`: pools an admin declares for a scheduler (Slurm, Ray), and the two steps every
scheduler's commands share — declaring a pool from its flags, and running its agent.

Each scheduler's own commands (`parallab/commands/slurm.py`, `ray_pool.py`) add a `create-KIND`
command to `pool_app` and an agent command; nothing here names a scheduler.
"""

from __future__ import annotations

import logging
import re
import signal
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.table import Table

from parallab.commands.jobspec import fail

if TYPE_CHECKING:
    from parallab.core.pools import PoolSettings
    from workers.scheduler_agent import SchedulerAgent

pool_app = typer.Typer(
    help="Pools declared by an admin (a scheduler's, such as Slurm or Ray; Celery pools appear when their workers register).",
    no_args_is_help=True,
)
console = Console()


def declare_from_flags(name: str, kind: type[PoolSettings], fields: Mapping[str, object], flags: Mapping[str, str]) -> None:
    """Validate a pool's settings as its flags gave them and store the pool; a bad value fails
    naming its flag (`flags` maps a settings field to a flag not spelled `--field-name`)."""
    from pydantic import ValidationError

    from backend.config import get_settings
    from backend.db import session_scope
    from backend.services.pools import PoolError, declare_pool
    from parallab.core.spec import POOL_PATTERN

    if not re.fullmatch(POOL_PATTERN, name):
        fail(f"NAME: {name!r} is not a pool name (lower-case letters, digits, '-' and '_')")
    try:
        settings = kind.model_validate(dict(fields))
    except ValidationError as exc:
        first = exc.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else ""
        fail(f"{flags.get(field, '--' + field.replace('_', '-'))}: {first['msg']}")
    try:
        with session_scope(get_settings().sqlalchemy_url) as session:
            declare_pool(session=session, name=name, settings=settings)
    except PoolError as exc:
        fail(f"NAME: {exc}")


def run_agent(make: Any, *, pool: str, once: bool, loglevel: str, poll_s: float, label: str) -> None:
    """Run a scheduler's agent: `make()` builds it (its NoSuchPool fails naming --pool); `once`
    is one round (reconcile, submit, watch), otherwise rounds every `poll_s` until SIGTERM/SIGINT."""
    from workers.scheduler_agent import NoSuchPool

    logging.basicConfig(level=loglevel.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        agent: SchedulerAgent = make()
    except NoSuchPool as exc:
        fail(f"--pool: {exc}")
    if once:
        agent.reconcile()
        agent.poll()
        return
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    console.print(f"{label} agent of pool [bold]{pool}[/bold]: polling every {poll_s:g} s")
    agent.run(stop)


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
