"""docker-compose.yml run outside Docker (issue 13): the commands and environment of its services,
read from the file and interpolated as compose would, against this machine's Postgres and a Redis
of the test's own started with the redis service's command (AOF, a password):

0. the postgres and redis healthchecks pass (their commands, pointed at this machine's servers);
1. `parallab db upgrade` (service migrate) on a scratch database, then exit 0;
2. `uvicorn backend.api.app:app … --workers 2` (service api): two processes race to seed the
   admin from PARALLAB_ADMIN_EMAIL, both must come up; the api's healthcheck command passes;
3. `parallab worker` twice (service worker-cpu), PARALLAB_POOL=a and =b, separate homes posing as
   two hosts;
4. the admin logs in, makes a submit token, queues one tiny job per pool: both succeed, each on
   its own pool's host, and /workers shows both pools alive.

What differs from Docker, and only that: hosts and ports (127.0.0.1 and free ports for the
service names and 8000/6379; uvicorn binds 127.0.0.1, not 0.0.0.0, on this shared machine), the
scratch database's name and role (trust auth), and a heartbeat of 1 s so that the test is short.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, make_url, text

from tests.conftest import PG_ADMIN_URL
from tests.deploy.compose import COMPOSE, environment, interpolate, load
from tests.e2e.fleet import free_port, wait_until
from workers.launcher import stop_process_group

pytestmark = pytest.mark.slow

REPO = COMPOSE.parent
ADMIN = ("admin@lab.example", "first-admin-password-1")
WORKLOAD = {"model": "tiny", "steps": 2, "warmup_steps": 1}


def compose_env() -> dict[str, str]:
    """The lab's .env: the three secrets and the first admin."""
    return {
        "POSTGRES_PASSWORD": secrets.token_urlsafe(16),
        "REDIS_PASSWORD": secrets.token_urlsafe(16),
        "PARALLAB_SECRET_KEY": secrets.token_urlsafe(32),
        "PARALLAB_ADMIN_EMAIL": ADMIN[0],
        "PARALLAB_ADMIN_PASSWORD": ADMIN[1],
    }


def on_this_machine(command: list[str]) -> list[str]:
    """A container's command with its entry points run by this interpreter (this checkout's code)."""
    head = {"parallab": [sys.executable, "-m", "parallab"], "uvicorn": [sys.executable, "-m", "uvicorn"]}
    return head.get(command[0], [command[0]]) + command[1:]


def set_option(command: list[str], option: str, value: str) -> list[str]:
    out = list(command)
    out[out.index(option) + 1] = value
    return out


def process_env(service_env: dict[str, str], **overrides: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("PARALLAB_")}
    return {**base, **service_env, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **overrides}


class Lab:
    def __init__(self, root: Path, doc: dict[str, Any], env: dict[str, str]):
        self.root, self.doc, self.env = root, doc, env
        self.procs: list[subprocess.Popen[bytes]] = []
        self.timings: dict[str, float] = {}

    def service(self, name: str) -> dict[str, Any]:
        return self.doc["services"][name]

    def start(self, name: str, command: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        log = (self.root / f"{name}.log").open("ab")
        proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)
        return proc

    def log(self, name: str) -> str:
        path = self.root / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                stop_process_group(proc, grace_s=20)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Lab, str]]:
    t0 = time.monotonic()
    root = tmp_path_factory.mktemp("compose")
    env = compose_env()
    doc = interpolate(load(COMPOSE), env)
    lab = Lab(root, doc, env)

    # postgres: a scratch database on this machine's server stands for the postgres service.
    db_name = f"parallab_compose_{uuid.uuid4().hex[:10]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{db_name}"'))
    db_url = PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{db_name}"
    pg_check = lab.service("postgres")["healthcheck"]["test"]
    assert pg_check[0] == "CMD-SHELL" and pg_check[1].startswith("pg_isready ")
    server = make_url(PG_ADMIN_URL)
    pg_ready = subprocess.run(["sh", "-c", f"{pg_check[1]} -h {server.host} -p {server.port or 5432}"], capture_output=True, text=True)
    assert pg_ready.returncode == 0, f"the postgres healthcheck: {pg_ready.stdout}{pg_ready.stderr}"

    # redis: the service's own command (AOF, requirepass), on a free loopback port.
    redis_port = free_port()
    redis_cmd = lab.service("redis")["command"] + ["--port", str(redis_port), "--bind", "127.0.0.1", "--dir", str(root), "--save", ""]
    assert redis_cmd[0] == "redis-server" and shutil.which("redis-server"), "redis-server is not installed"
    lab.start("redis", redis_cmd, dict(os.environ))
    try:
        redis_check = lab.service("redis")["healthcheck"]["test"][1].replace("redis-cli", f"redis-cli -p {redis_port}")
        redis_env = {**os.environ, **environment(lab.service("redis"))}
        wait_until(lambda: subprocess.run(["sh", "-c", redis_check], env=redis_env).returncode == 0, "redis's healthcheck", 20, 0.1)

        # What every parallab service gets, with the service names pointed at this machine.
        compose_db = environment(lab.service("api"))["PARALLAB_DATABASE_URL"]
        compose_broker = environment(lab.service("api"))["PARALLAB_BROKER_URL"]
        assert compose_db.startswith("postgresql+psycopg://") and compose_broker.startswith(f"redis://:{env['REDIS_PASSWORD']}@redis:6379/")
        urls = {"PARALLAB_DATABASE_URL": db_url, "PARALLAB_BROKER_URL": compose_broker.replace("@redis:6379", f"@127.0.0.1:{redis_port}")}

        # migrate: one shot, exit 0.
        started = time.monotonic()
        migrate = subprocess.run(
            on_this_machine(lab.service("migrate")["command"]),
            cwd=REPO,
            env=process_env(environment(lab.service("migrate")), **urls, PARALLAB_HOME=str(root / "migrate")),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert migrate.returncode == 0, migrate.stderr[-3000:]
        lab.timings["migrate_s"] = time.monotonic() - started

        # api: uvicorn --workers 2, both processes seeding the admin at once.
        port = free_port()
        api_cmd = set_option(set_option(on_this_machine(lab.service("api")["command"]), "--host", "127.0.0.1"), "--port", str(port))
        assert api_cmd[api_cmd.index("--workers") + 1] == "2"
        started = time.monotonic()
        api = lab.start("api", api_cmd, process_env(environment(lab.service("api")), **urls, PARALLAB_HOME=str(root / "api")))
        url = f"http://127.0.0.1:{port}"
        health = lab.service("api")["healthcheck"]["test"]
        assert health[:2] == ["CMD", "python"]
        health_cmd = [sys.executable, *[a.replace("127.0.0.1:8000", f"127.0.0.1:{port}") for a in health[2:]]]

        def healthy() -> bool:
            assert api.poll() is None, lab.log("api")[-3000:]
            return subprocess.run(health_cmd, capture_output=True).returncode == 0

        wait_until(healthy, "the api's healthcheck", 60, 0.3)
        lab.timings["api_healthy_s"] = time.monotonic() - started

        # Two workers, pools a and b, each posing as its own host.
        started = time.monotonic()
        for pool in ("a", "b"):
            worker_env = process_env(
                environment(lab.service("worker-cpu")),
                **urls,
                PARALLAB_HOME=str(root / f"host-{pool}"),
                PARALLAB_POOL=pool,
                PARALLAB_WORKER_HOST=f"host-{pool}",
                PARALLAB_WORKER_ADDRESS="127.0.0.1",
                PARALLAB_HEARTBEAT_S="1",
            )
            lab.start(f"worker-{pool}", on_this_machine(lab.service("worker-cpu")["command"]), worker_env)
        lab.timings["setup_s"] = time.monotonic() - t0
        lab.timings["_workers_started"] = started
        yield lab, url
    finally:
        lab.stop()
        from backend.db import get_engine

        get_engine(db_url).dispose()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)'))
        admin.dispose()


class Browser:
    """A browser on plain HTTP to a server that is not on loopback by its settings: the server marks
    its cookies Secure (a lab serves through a TLS proxy), which httpx's jar keeps off http://, so
    the cookies are carried by hand, as the proxy's HTTPS would carry them."""

    def __init__(self, url: str):
        self.client = httpx.Client(base_url=url, follow_redirects=False, timeout=30)
        self.cookies: dict[str, str] = {}
        self.secure: set[str] = set()

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        headers = {"Cookie": "; ".join(f"{k}={v}" for k, v in self.cookies.items())} if self.cookies else {}
        response = self.client.request(method, path, headers=headers, **kwargs)
        for header in response.headers.get_list("set-cookie"):
            name, _, value = header.split(";", 1)[0].partition("=")
            self.cookies[name.strip()] = value.strip()
            if "secure" in header.lower().split(";", 1)[1]:
                self.secure.add(name.strip())
        return response

    def get(self, path: str) -> httpx.Response:
        return self.request("GET", path)

    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("POST", path, **kwargs)


def form_token(client: Browser, path: str) -> str:
    page = client.get(path)
    assert page.status_code == 200, (path, page.status_code)
    match = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
    assert match, path
    return match.group(1)


def test_compose_commands_run_a_lab_two_pools_each_running_its_job(lab: tuple[Lab, str]) -> None:
    the_lab, url = lab
    t0 = time.monotonic()

    # Two API processes came up, and the admin exists once whichever seeded it.
    def both_started() -> bool:  # the first process answers /healthz while a loaded host may still be starting the second
        return len(re.findall(r"Started server process \[\d+\]", the_lab.log("api"))) == 2

    wait_until(both_started, "both API processes to start", timeout=60)
    api_log = the_lab.log("api")
    assert "Traceback" not in api_log, api_log[-3000:]
    anonymous = httpx.Client(base_url=url, timeout=30)
    assert anonymous.get("/api/v1/runs").status_code == 401, "PARALLAB_HOST=0.0.0.0: no local mode"
    admin = Browser(url)
    login = admin.post("/login", data={"csrf_token": form_token(admin, "/login"), "email": ADMIN[0], "password": ADMIN[1]})
    assert login.status_code == 303, login.text[-500:]
    assert admin.secure, "off loopback the login cookie is Secure (a lab serves through a TLS proxy)"
    users = admin.get("/users")
    assert users.text.count(f'data-email="{ADMIN[0]}"') == 1
    page = admin.post("/tokens", data={"csrf_token": form_token(admin, "/tokens"), "name": "e2e", "scope": ["submit"]})
    token = re.search(r'id="new-token-value">(plb_[^<]+)<', page.text)
    assert token, page.text[-1000:]
    api = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token.group(1)}"}, timeout=30)

    # /workers: both pools, each with its host alive.
    def both_pools() -> dict[str, Any] | None:
        items = api.get("/api/v1/workers").json()["items"]
        alive = {w["pool"]: w for w in items if w["alive"]}
        return alive if {"a", "b"} <= set(alive) else None

    alive = wait_until(both_pools, "workers on pools a and b", 60, 0.5)
    the_lab.timings["workers_alive_s"] = time.monotonic() - the_lab.timings.pop("_workers_started")
    assert {alive["a"]["host"], alive["b"]["host"]} == {"host-a", "host-b"}  # type: ignore[index]
    page_text = admin.get("/workers").text
    assert "host-a" in page_text and "host-b" in page_text

    # One tiny job per pool; both succeed, each on its pool's host.
    started = time.monotonic()
    runs = {}
    for pool in ("a", "b"):
        spec = {"name": f"compose {pool}", "workload": WORKLOAD, "strategy": {"name": "single", "world_size": 1}}
        spec["placement"] = {"pool": pool}
        response = api.post("/api/v1/runs", json=spec)
        assert response.status_code == 202, response.text
        runs[pool] = response.json()["id"]

    def done(run_id: str) -> dict[str, Any] | None:
        run = api.get(f"/api/v1/runs/{run_id}").json()
        assert run["status"] not in ("failed", "cancelled"), run.get("error")
        return run if run["status"] == "succeeded" else None

    for pool, run_id in runs.items():
        run = wait_until(lambda run_id=run_id: done(run_id), f"the job on pool {pool}", 90, 0.5)
        assert run["pool"] == pool  # type: ignore[index]
        assert run["result"]["hardware"]["hosts"] == [f"host-{pool}"], run["result"]["hardware"]  # type: ignore[index]
    the_lab.timings["jobs_s"] = time.monotonic() - started

    metrics = admin.get("/metrics").text
    assert re.search(r'parallab_workers\{pool="a",state="alive"\} 1', metrics) and re.search(
        r'parallab_workers\{pool="b",state="alive"\} 1', metrics
    ), metrics[:2000]
    the_lab.timings["test_s"] = time.monotonic() - t0
    print("compose e2e timings:", {k: round(v, 1) for k, v in the_lab.timings.items()})
