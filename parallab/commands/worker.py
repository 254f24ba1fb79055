"""`parallab worker [--pool NAME]`: the Celery worker that owns this host's accelerators.

It registers itself in the fleet (host, pool, devices, memory, interconnect), reconciles what a
worker of this machine may have left behind (runs whose lease lapsed, orphaned ranks), keeps a
heartbeat, and consumes its pool's queue plus its own — one job at a time (the solo pool).
"""

from __future__ import annotations

import logging
import os
import re
import warnings
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from backend.config import get_settings
from parallab.commands.errors import database_hint, database_missing

console = Console(stderr=True)
log = logging.getLogger(__name__)


def worker(
    pool: Annotated[
        str | None,
        typer.Option(help="Pool to serve (queue parallab.<pool>); default: named after this host's hardware, e.g. cpu or h100x8."),
    ] = None,
    loglevel: str = "INFO",
) -> None:
    """Run the Celery worker that owns this host's accelerators (one job at a time)."""
    from backend.db import session_scope
    from backend.queue import pool_queue, worker_queue
    from backend.services import workers as fleet_service
    from parallab.core.spec import POOL_PATTERN
    from workers import fleet

    settings = get_settings()
    if pool is not None and not re.fullmatch(POOL_PATTERN, pool):
        console.print(f"[red]--pool: {pool!r} is not a pool name (lower-case letters, digits, '-' and '_')[/red]")
        raise typer.Exit(2)
    me = fleet.describe(settings, pool=pool)
    fleet.set_current(me)
    try:
        with session_scope(settings.sqlalchemy_url) as session:
            fleet_service.register(session=session, info=me)
    except Exception as exc:
        if database_missing(exc):  # a fresh home: waiting would wait forever
            console.print(f"[red]parallab: {escape(database_hint(exc) or str(exc))}[/red]")
            raise typer.Exit(1) from None
        # the database is down: the heartbeat registers this worker once it is back
        said = database_hint(exc) or (str(exc).splitlines() or [type(exc).__name__])[0]
        console.print(f"[yellow]could not register yet ({escape(said)}); the heartbeat will[/yellow]")
    fleet.reconcile(settings, me)  # lapsed leases failed; the ranks the host engine still holds and no live worker watches killed
    heartbeat = fleet.Heartbeat(settings, me)
    heartbeat.start()
    console.print(f"worker {me.id[:8]} on host {me.host}: pool {me.pool}, {me.device_count} × {me.device_name} ({me.interconnect})")

    from workers.celery_app import celery_app

    if settings.broker.broker_url is None and hasattr(os, "geteuid") and os.geteuid() == 0:
        quiet_root_warning()
    try:
        celery_app.worker_main(
            [
                "worker",
                "--pool",
                "solo",
                "--concurrency",
                "1",
                "--queues",
                f"{pool_queue(settings, me.pool)},{worker_queue(settings, me.id)}",
                "--loglevel",
                loglevel,
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                "--hostname",
                f"parallab-{me.pool}@{me.host}.{me.id[:8]}",
            ]
        )
    finally:
        heartbeat.stop()
        try:
            with session_scope(settings.sqlalchemy_url) as session:
                fleet_service.deregister(session=session, worker_id=me.id)
        except Exception as exc:
            log.warning("could not deregister worker %s: %s", me.id, exc)


def quiet_root_warning() -> None:
    """Silence Celery's "running the worker with superuser privileges" warning, knowingly.

    Celery warns because a root worker that accepts pickled messages from a shared broker runs
    whatever a broker user sends. On the embedded default neither holds: the broker is a SQLite
    file under this user's own PARALLAB_HOME (no network, no other user) and the app accepts JSON
    only. A lab deployment (Redis) keeps the warning, and its images run as the user `parallab`."""
    from celery.exceptions import SecurityWarning

    warnings.filterwarnings("ignore", category=SecurityWarning)
