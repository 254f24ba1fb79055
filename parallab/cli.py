"""The `parallab` command: start the bench, run a job locally, plan, upload, manage the database."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from backend.config import get_settings
from parallab.commands.bench import bench
from parallab.commands.plan import plan
from parallab.commands.sweep import sweep

app = typer.Typer(help="parallab — a lab bench for distributed-training parallelism.", no_args_is_help=True)
db_app = typer.Typer(help="Database schema (Alembic migrations).", no_args_is_help=True)
token_app = typer.Typer(help="Scoped API tokens.", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(token_app, name="token")
console = Console(stderr=True)

app.command("plan")(plan)
app.command("bench")(bench)
app.command("sweep")(sweep)


@db_app.command("upgrade")
def db_upgrade(revision: str = "head") -> None:
    """Bring the database schema to the latest migration."""
    from backend.migrate import upgrade

    settings = get_settings()
    settings.ensure_home()
    upgrade(settings.sqlalchemy_url, revision)
    console.print(f"[green]database at {revision}[/green]")


@token_app.command("create")
def token_create(
    scope: Annotated[list[str], typer.Option("--scope", help="upload, submit or admin; repeat for several.")],
    name: Annotated[str, typer.Option(help="What the token is for, e.g. 'ci'.")] = "token",
) -> None:
    """Create a token and print it once (only its hash is stored)."""
    from backend.db import session_scope
    from backend.services.tokens import create_token

    try:
        with session_scope(get_settings().sqlalchemy_url) as session:
            token = create_token(session=session, name=name, scopes=scope)
    except ValueError as exc:
        console.print(f"[red]--scope: {exc}[/red]")
        raise typer.Exit(2) from None
    typer.echo(token)


@app.command()
def worker(
    queue: Annotated[str | None, typer.Option(help="Queue to consume (default from settings).")] = None,
    loglevel: str = "INFO",
) -> None:
    """Run the Celery worker that owns this host's accelerators (one job at a time)."""
    from workers.celery_app import celery_app

    settings = get_settings()
    celery_app.worker_main(
        [
            "worker",
            "--pool",
            "solo",
            "--concurrency",
            "1",
            "--queues",
            queue or settings.queue,
            "--loglevel",
            loglevel,
            "--without-gossip",
            "--without-mingle",
            "--hostname",
            f"parallab@{os.uname().nodename}",
        ]
    )


def _raise_system_exit(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


@app.command()
def up(
    host: Annotated[str | None, typer.Option(help="Bind address (default 127.0.0.1: local mode, no login).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default 8000).")] = None,
) -> None:
    """Start parallab: migrate the database, then the API and one worker on the embedded default."""
    import uvicorn

    from backend.migrate import upgrade
    from workers.launcher import stop_process_group

    settings = get_settings()
    host = host or settings.host
    port = port or settings.port
    try:
        settings.model_copy(update={"host": host}).check_secrets()
    except ValueError as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from None
    settings.ensure_home()
    upgrade(settings.sqlalchemy_url)
    env = dict(os.environ, PARALLAB_HOST=host, PARALLAB_PORT=str(port))
    worker_proc = subprocess.Popen([sys.executable, "-m", "parallab", "worker", "--loglevel", "WARNING"], env=env, start_new_session=True)
    console.print(
        f"[bold]parallab[/bold] on http://{host}:{port}  (database {settings.sqlalchemy_url.split('@')[-1]}, worker pid {worker_proc.pid})"
    )
    os.environ["PARALLAB_HOST"] = host
    get_settings.cache_clear()
    # uvicorn restores the previous SIGTERM handler and re-raises the signal after its graceful
    # shutdown; make that an exception so the `finally` below still stops the worker.
    signal.signal(signal.SIGTERM, _raise_system_exit)
    try:
        uvicorn.run("backend.api.app:app", host=host, port=port, log_level="info")
    finally:
        stop_process_group(worker_proc, grace_s=20)


@app.command()
def upload(
    file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="A result document (JSON).")],
    server: Annotated[str, typer.Option(help="parallab's URL, e.g. http://lab:8000")],
    token: Annotated[str, typer.Option(envvar="PARALLAB_TOKEN", help="A token with scope 'upload'.")],
    idempotency_key: Annotated[str | None, typer.Option(help="Retries with the same key never store twice.")] = None,
    branch: Annotated[str | None, typer.Option(help="Git branch to record with the result.")] = None,
    commit: Annotated[str | None, typer.Option(help="Git commit to record with the result.")] = None,
) -> None:
    """Upload a result document (what CI runs)."""
    import httpx

    document = json.loads(file.read_text())
    if branch or commit:
        source = document.setdefault("source", {}) or {}
        document["source"] = {**source, **{k: v for k, v in {"branch": branch, "commit": commit}.items() if v}}
    headers = {"Authorization": f"Bearer {token}"}
    if idempotency_key:
        headers["Idempotency-Key"] = idempotency_key
    try:
        response = httpx.post(f"{server.rstrip('/')}/api/v1/results", json=document, headers=headers, timeout=60)
    except httpx.HTTPError as exc:
        console.print(f"[red]could not reach {server}: {exc}[/red]")
        raise typer.Exit(1) from None
    if response.status_code not in (200, 201):
        console.print(f"[red]upload refused ({response.status_code}): {response.text}[/red]")
        raise typer.Exit(1)
    run = response.json()
    console.print(f"[green]stored as run {run['id']}[/green] ({'new' if response.status_code == 201 else 'already uploaded'})")
    typer.echo(run["id"])


def main() -> None:  # pragma: no cover
    app()
