"""The `parallab` command: start the bench, run a job locally, plan, upload, manage the database."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from typing import Annotated

import typer
from rich.console import Console

from backend.config import get_settings
from parallab.commands.bench import bench
from parallab.commands.bench_checks import EXIT_CODES_HELP
from parallab.commands.ci import ci_app, series_app
from parallab.commands.compare import compare
from parallab.commands.emulate import lab_app
from parallab.commands.export import export_app
from parallab.commands.plan import plan
from parallab.commands.pools import pool_app
from parallab.commands.ray_pool import ray_agent
from parallab.commands.slurm import slurm_agent
from parallab.commands.sweep import sweep
from parallab.commands.token import token_app
from parallab.commands.upload import upload
from parallab.commands.user import user_app
from parallab.commands.worker import worker

app = typer.Typer(
    help="parallab — a lab bench for distributed-training parallelism. Add --debug anywhere for tracebacks.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
db_app = typer.Typer(help="Database schema (Alembic migrations).", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(token_app, name="token")
app.add_typer(user_app, name="user")
app.add_typer(pool_app, name="pool")
app.add_typer(export_app, name="export")
app.add_typer(ci_app, name="ci")
app.add_typer(series_app, name="series")
app.add_typer(lab_app, name="lab")
console = Console(stderr=True)

app.command("plan")(plan)
app.command("bench", epilog=EXIT_CODES_HELP)(bench)
app.command("upload")(upload)
app.command("compare")(compare)
app.command("worker")(worker)
app.command("sweep")(sweep)
app.command("slurm-agent")(slurm_agent)
app.command("ray-agent")(ray_agent)


@db_app.command("upgrade")
def db_upgrade(revision: str = "head") -> None:
    """Bring the database schema to the latest migration."""
    from backend.migrate import upgrade

    settings = get_settings()
    settings.ensure_home()
    upgrade(settings.sqlalchemy_url, revision)
    console.print(f"[green]database at {revision}[/green]")


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
    from parallab.commands.supervise import Supervisor

    settings = get_settings()
    host = host or settings.server.host
    port = port or settings.server.port
    try:
        settings.model_copy(update={"host": host}).check_secrets()
    except ValueError as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from None
    settings.ensure_home()
    upgrade(settings.sqlalchemy_url)
    env = dict(os.environ, PARALLAB_HOST=host, PARALLAB_PORT=str(port))
    worker = Supervisor(
        lambda: subprocess.Popen([sys.executable, "-m", "parallab", "worker", "--loglevel", "WARNING"], env=env, start_new_session=True),
        name="worker",
        say=lambda line: console.print(f"[yellow]{line}[/yellow]"),
    )
    worker.start()  # restarts the worker when it dies, as compose's restart policy does
    worker_proc = worker.proc
    console.print(
        f"[bold]parallab[/bold] on http://{host}:{port}  (database {settings.sqlalchemy_url.split('@')[-1]}, worker pid {worker_proc.pid})"
    )
    os.environ["PARALLAB_HOST"] = host
    get_settings.cache_clear()
    # uvicorn restores the previous SIGTERM handler and re-raises the signal after its graceful
    # shutdown; make that an exception so the `finally` below still stops the worker.
    signal.signal(signal.SIGTERM, _raise_system_exit)
    threading.Thread(target=_say_when_ready, args=(host, port), daemon=True).start()
    try:
        uvicorn.run("backend.api.app:app", host=host, port=port, log_level="info")
    finally:
        worker.stop(grace_s=20)


def _say_when_ready(host: str, port: int, timeout_s: float = 120) -> None:
    """Print the URL once the API answers, so the last line of a start is where to go."""
    import httpx

    shown = f"[{host}]" if ":" in host else host
    url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else shown}:{port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                console.print(f"[bold green]parallab is ready:[/bold green] {url}/  (API docs {url}/docs; Ctrl-C stops it)")
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)


def main() -> None:  # pragma: no cover
    """The `parallab` entry point: errors end in one line, tracebacks only with --debug."""
    from parallab.commands.errors import run

    run(app)
