"""Shared fixtures: real databases (SQLite file and a scratch Postgres database), settings,
an API client on each, and the environment a worker subprocess needs to see the same ones.

Postgres: 127.0.0.1:5432 (trust auth). Each test session creates its own database and drops it
at the end, so parallel sessions and the developer's data never collide.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from backend.config import Settings, get_settings
from backend.migrate import upgrade

PG_ADMIN_URL = os.environ.get("PARALLAB_TEST_PG_ADMIN_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("PARALLAB_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
TABLES = (
    "engine_jobs",
    "pools",
    "reference_curves",
    "leaderboard_cells",
    "leaderboard_counts",
    "leaderboard_entries",
    "run_nodes",
    "workers",
    "series_verdicts",
    "comm_metrics",
    "rank_metrics",
    "run_traces",
    "run_result_parts",
    "run_results",
    "hardware_profiles",
    "runs",
    "sweeps",
    "series",
    "api_tokens",
    "user_sessions",
    "users",
)


@contextlib.contextmanager
def scratch_postgres(prefix: str) -> Iterator[str]:
    """A Postgres database of its own, empty, dropped after (with whatever still holds it open)."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    try:
        yield url
    finally:
        from backend.db import get_engine

        get_engine(url).dispose()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]


@pytest.fixture(scope="module")
def browser() -> Iterator:
    """Debian's Chromium driven by Playwright (never a browser Playwright downloads), one per test
    module, for the UI and security browser tests: a module's pages share it, each test opens its
    own context."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A fresh, migrated Postgres database for this test session."""
    with scratch_postgres("parallab_test") as url:
        upgrade(url)
        yield url


@pytest.fixture(params=["sqlite", "postgres"])
def scratch_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty, unmigrated database of the test's own, on SQLite and on Postgres (migration tests
    walk it down and up)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'scratch.db'}"
        return
    with scratch_postgres("parallab_scratch") as url:
        yield url


@pytest.fixture(scope="session")
def sqlite_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("sqlite") / "parallab.db"
    url = f"sqlite:///{path}"
    upgrade(url)
    return url


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """Each test that takes this runs once on SQLite and once on Postgres, on empty tables: emptied
    before (a module-scoped fixture on the session's database, the API fuzzer's or an e2e lab's,
    leaves its rows behind) and after."""
    url = request.getfixturevalue(f"{request.param}_url")
    empty_tables(url)
    yield url
    empty_tables(url)


def empty_tables(url: str) -> None:
    """Delete every row of the app's tables (`TABLES`), in one transaction."""
    from backend.db import get_engine

    with get_engine(url).begin() as conn:
        for table in TABLES:
            conn.execute(text(f"DELETE FROM {table}"))


@pytest.fixture
def settings(db_url: str, tmp_path: Path) -> Settings:
    """Settings on the test database with the embedded (SQLite) broker under a temp home."""
    return Settings(home=tmp_path / "home", database_url=db_url, max_world_size=4)


@pytest.fixture
def client(settings: Settings):
    from fastapi.testclient import TestClient

    from backend.api.app import create_app

    app = create_app()
    app.dependency_overrides[get_settings] = lambda: settings
    with TestClient(app) as test_client:
        yield test_client


def worker_env(settings: Settings) -> dict[str, str]:
    """Environment for a `parallab worker` subprocess that must see exactly `settings`."""
    env = dict(os.environ)
    env.update(
        PARALLAB_HOME=str(settings.resolved_home),
        PARALLAB_DATABASE_URL=settings.sqlalchemy_url,
        PARALLAB_BROKER_URL=settings.celery_broker_url,
        PARALLAB_MAX_WORLD_SIZE=str(settings.max_world_size),
        PARALLAB_MAX_JOB_SECONDS=str(settings.max_job_seconds),
        PARALLAB_QUEUE=settings.queue,
        OMP_NUM_THREADS="1",
    )
    return env


SLURM_START = Path(__file__).resolve().parent / "slurm" / "start.sh"


@pytest.fixture(scope="session")
def slurm_conf() -> str:
    """A running single-node Slurm (tests/slurm/start.sh installs and starts it when it is down),
    exported as SLURM_CONF for this process and its children. Fails — never skips — when Slurm
    cannot come up: the Slurm tests must run wherever the suite runs."""
    try:
        done = subprocess.run(["bash", str(SLURM_START)], capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"Slurm did not come up within 15 minutes: {exc}")
    if done.returncode != 0:
        pytest.fail(f"Slurm could not be started by {SLURM_START.name} (exit {done.returncode}):\n{done.stderr[-3000:]}")
    conf = done.stdout.strip().splitlines()[-1]
    os.environ["SLURM_CONF"] = conf
    return conf


@pytest.fixture(scope="session")
def ray_cluster():
    """A real one-node Ray cluster (2 CPUs) for the session's Ray pool tests, started once (its
    start costs tens of seconds on 2 cores) and torn down with every process it started."""
    from tests.e2e.raycluster import ray_cluster as start

    with start(num_cpus=2) as cluster:
        yield cluster
