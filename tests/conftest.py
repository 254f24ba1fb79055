"""Shared fixtures: real databases (SQLite file and a scratch Postgres database), settings,
an API client on each, and the environment a worker subprocess needs to see the same ones.

Postgres: 127.0.0.1:5432 (trust auth). Each test session creates its own database and drops it
at the end, so parallel sessions and the developer's data never collide.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from backend.config import Settings, get_settings
from backend.migrate import upgrade
from tests import quiet

if os.environ.get("PYTEST_XDIST_WORKER"):
    # An xdist worker starts with COLUMNS=80 in its environment, which a serial session lacks. The
    # CLI's module-level rich consoles fix their width from COLUMNS when they are made, so a test's
    # own COLUMNS (`monkeypatch.setenv("COLUMNS", "200")`: tables unwrapped) would no longer reach
    # them: a worker runs with the environment a serial session has.
    os.environ.pop("COLUMNS", None)

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
        PARALLAB_MAX_WORLD_SIZE=str(settings.limits.max_world_size),
        PARALLAB_MAX_JOB_SECONDS=str(settings.worker.max_job_seconds),
        PARALLAB_QUEUE=settings.broker.queue,
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


# Running in parallel. `./run test` runs pytest-xdist workers (`-n 2 --dist loadgroup
# --no-loadscope-reorder`): each worker is its own pytest session with its own scratch Postgres
# database, SQLite file, temp folders and, where a test starts them, servers, Redis and Celery
# queues on free ports or under unique names. A file's tests always stay in one worker (its
# module-scoped fixtures, the browser or a module's launch, are set up once), and files that share
# something one process must hold stay together in an xdist group:
#   tiny-runs  the files reading the same memoised launches of the `tiny` workload (`harness_job`'s
#              memo is a process's: in two workers the ddp × 2 both read would be launched twice;
#              test_prediction_agreement's comm-bytes cases are test_strategies' jobs, read again),
#              and those reading `ring_moe_results`' one 4-rank launch (their moe and ring jobs
#              are test_prediction_agreement's too);
#   slurm      the files on the machine's one Slurm (`slurm_conf`): one starter, one queue;
#   emulated   the files that bring up an emulated cluster (network namespaces: one a machine,
#              workers/netns.py's lock refuses a second).
# Every other file that launches (the HF files, test_compile, …) asks for jobs of its own workload
# only, so it is a unit of its own; its `single` reference may be computed once a worker instead of
# once a session (tests accept a computed or a cached reference). The Ray file keeps its session
# cluster as a file of its own.
TINY_RUNS = frozenset(
    f"tests/workers/{name}.py"
    for name in (
        "test_strategies",
        "test_recipes",
        "test_quickstart_pages",
        "test_layouts",
        "test_prediction_agreement",
        "test_moe",
        "test_ring_attention",
    )
)
"""Files whose `harness_job` jobs overlap (ddp, fsdp and tp × 2, hybrid and fsdp × 4 of the `tiny` workload)."""
SLOW_TEST_S, SLOW_E2E_TEST_S, LIGHT_TEST_S = 20.0, 40.0, 0.2
"""Rough seconds a test costs where `UNIT_SECONDS` has no measure of its unit: one marked slow
launches torchrun or a browser, an end-to-end one also starts its own server and workers."""
UNIT_SECONDS = Path(__file__).with_name("unit_seconds.json")
"""Each unit's measured seconds (setup, call and teardown of its tests) from a whole run under xdist,
written by `PARALLAB_TEST_UNIT_SECONDS=tests/unit_seconds.json ./run test` (docs/testing.md)."""
UNIT_SECONDS_ENV = "PARALLAB_TEST_UNIT_SECONDS"
SPENT: dict[str, float] = {}
"""Seconds this session's tests took, by unit (its xdist group), when `UNIT_SECONDS_ENV` asks."""


def measured_unit_seconds() -> dict[str, float]:
    """The committed measure of each unit's cost; empty when the file is missing or unreadable."""
    try:
        found = json.loads(UNIT_SECONDS.read_text())
    except (OSError, ValueError):
        return {}
    return {str(unit): float(seconds) for unit, seconds in found.items()} if isinstance(found, dict) else {}


def xdist_group(path: str, module: Any, fixturenames: set[str]) -> str | None:
    """The group that keeps the test file `path` with others sharing a session resource, or None
    (the file is a unit of its own)."""
    if path in TINY_RUNS or "ring_moe_results" in fixturenames:
        return "tiny-runs"
    if "slurm_conf" in fixturenames:
        return "slurm"
    if hasattr(module, "emulated_cluster") or hasattr(module, "EmulatedCluster"):
        return "emulated"
    return None


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the marks into the node ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under xdist: mark every test with its unit of work (its group, or else its file, as
    `workers/test_moe`; xdist appends it to the test's id, `…::test@unit`) and put the units in
    order of their rough cost, longest first, so that no long unit starts last and leaves one
    worker running alone at the end. A serial run keeps collection order."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    by_file: dict[str, list[pytest.Item]] = {}
    for item in items:
        by_file.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    unit_of: dict[str, str] = {}
    for path, tests in by_file.items():
        names = set().union(*(getattr(t, "fixturenames", ()) for t in tests))
        unit_of[path] = xdist_group(path, getattr(tests[0], "module", None), names) or path.removeprefix("tests/").removesuffix(".py")
    rough: dict[str, float] = {}
    for item in items:
        unit = unit_of[item.nodeid.split("::", 1)[0]]
        slow = SLOW_E2E_TEST_S if item.nodeid.startswith("tests/e2e/") else SLOW_TEST_S
        rough[unit] = rough.get(unit, 0.0) + (slow if item.get_closest_marker("slow") else LIGHT_TEST_S)
        item.add_marker(pytest.mark.xdist_group(unit))
    measured = measured_unit_seconds()
    cost = {unit: measured.get(unit, seconds) for unit, seconds in rough.items()}
    rank = {unit: i for i, unit in enumerate(sorted(cost, key=lambda u: (-cost[u], u)))}
    items.sort(key=lambda item: rank[unit_of[item.nodeid.split("::", 1)[0]]])  # stable: a unit's order kept


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    """Every test (setup, call, teardown) runs inside the room a quiet measurement empties
    (`tests.quiet`): it starts only while no such measurement waits or runs."""
    quiet.enter_test()
    try:
        return (yield)
    finally:
        quiet.leave_test()


THROUGHPUT: list[tuple[str, int, dict[str, Any], dict[str, Any], float]] = []
"""(strategy, world size, options, workload, tokens/s) of every harness job this session launched
(tests/workers/conftest.py notes them); under xdist the workers hand theirs to the controller."""


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Count a test's setup, call and teardown towards its unit's seconds, when asked to."""
    if os.environ.get(UNIT_SECONDS_ENV) and os.environ.get("PYTEST_XDIST_WORKER") and "@" in report.nodeid:
        unit = report.nodeid.rpartition("@")[2]  # xdist's loadgroup ends the id with the unit
        SPENT[unit] = SPENT.get(unit, 0.0) + report.duration


def pytest_configure(config: pytest.Config) -> None:
    """The xdist controller names its run (the id its workers see as PYTEST_XDIST_TESTRUNUID), so
    that it can remove the run's quiet-machine lock files at the end (`tests.quiet`)."""
    if getattr(config.option, "numprocesses", None) and getattr(config.option, "testrunuid", "") is None:
        config.option.testrunuid = uuid.uuid4().hex


def pytest_sessionfinish(session: pytest.Session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)  # set on an xdist worker only
    if workeroutput is None and (run := getattr(session.config.option, "testrunuid", None)):
        quiet.remove_files(run)
    if workeroutput is not None:
        workeroutput["harness_throughput"] = [list(row) for row in THROUGHPUT]
        workeroutput["unit_seconds"] = dict(SPENT)
    elif (out := os.environ.get(UNIT_SECONDS_ENV)) and SPENT:
        Path(out).write_text(json.dumps({unit: round(s, 1) for unit, s in sorted(SPENT.items(), key=lambda kv: -kv[1])}, indent=1) + "\n")


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """An xdist worker finished: keep its harness jobs' throughput for the summary (and its units'
    seconds, when asked for them)."""
    output = getattr(node, "workeroutput", {})
    THROUGHPUT.extend(tuple(row) for row in output.get("harness_throughput", []))
    for unit, seconds in output.get("unit_seconds", {}).items():
        SPENT[unit] = SPENT.get(unit, 0.0) + seconds


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """tokens/s of each harness job (noisy on a shared 2-core machine: a figure, never asserted)."""
    if not THROUGHPUT:
        return
    terminalreporter.section("harness jobs: tokens/s (tiny)")
    for name, n, options, workload, tps in THROUGHPUT:
        recipe = {
            k: workload[k]
            for k in ("precision", "activation_checkpointing", "grad_accumulation_steps")
            if workload.get(k) not in ("fp32", "none", 1)
        }
        terminalreporter.write_line(f"{name:<12} N={n}  {tps:10.0f}  {options} {recipe or ''}")
