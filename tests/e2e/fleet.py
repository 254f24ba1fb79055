"""Helpers of the fleet and fault tests: workers posing as hosts, a private Redis, process checks."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
from fastapi.testclient import TestClient

from backend.api.app import create_app
from backend.config import Settings, get_settings
from tests.conftest import worker_env
from workers.launcher import stop_process_group

FAST_LEASES = {"heartbeat_s": 1.0, "worker_ttl_s": 6.0, "reservation_timeout_s": 90.0}
"""Heartbeat every second, dead after six: the fault tests see a lapsed lease in seconds."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def api_client(settings: Settings) -> TestClient:
    app = create_app()
    app.dependency_overrides[get_settings] = lambda: settings
    return TestClient(app)


def host_settings(base: Settings, home: Path, host: str) -> Settings:
    """The settings of one worker posing as `host`: its own home, the shared database and broker."""
    return base.model_copy(update={"home": home, "worker_host": host, "worker_address": "127.0.0.1"})


def start_worker(
    settings: Settings, log_path: Path, *, pool: str | None = None, extra_env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """A `parallab worker` seeing exactly `settings` (and `extra_env`: an emulated node's namespace)."""
    env = worker_env(settings)
    env.update(
        PARALLAB_WORKER_HOST=settings.worker.worker_host or "",
        PARALLAB_WORKER_ADDRESS=settings.worker.worker_address or "",
        PARALLAB_HEARTBEAT_S=str(settings.worker.heartbeat_s),
        PARALLAB_WORKER_TTL_S=str(settings.worker.worker_ttl_s),
        PARALLAB_RESERVATION_TIMEOUT_S=str(settings.worker.reservation_timeout_s),
    )
    if settings.worker.worker_devices:
        env["PARALLAB_WORKER_DEVICES"] = str(settings.worker.worker_devices)
    env.update(extra_env or {})
    cmd = [sys.executable, "-m", "parallab", "worker", "--loglevel", "INFO"] + (["--pool", pool] if pool else [])
    return subprocess.Popen(cmd, env=env, stdout=log_path.open("ab"), stderr=subprocess.STDOUT, start_new_session=True)


def wait_until(check: Callable[[], object], what: str, timeout: float = 120, every: float = 0.5) -> object:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(every)


def live_hosts(client: TestClient) -> dict[str, dict]:
    """The live workers the API lists, by host."""
    return {w["host"]: w for w in client.get("/api/v1/workers").json()["items"] if w["alive"]}


def wait_for_run(client: TestClient, run_id: str, statuses: set[str], timeout: float = 300) -> dict:
    def check() -> dict | None:
        run = client.get(f"/api/v1/runs/{run_id}").json()
        return run if run["status"] in statuses else None

    return wait_until(check, f"run {run_id} to reach {statuses}", timeout)  # type: ignore[return-value]


def rank_processes(run_id: str) -> list[psutil.Process]:
    """torchrun and rank processes of `run_id` on this machine (any home), zombies aside."""
    out = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmd = proc.info["cmdline"] or []
        if proc.info["status"] == psutil.STATUS_ZOMBIE or "--run-dir" not in cmd:
            continue
        index = cmd.index("--run-dir")
        if index + 1 < len(cmd) and Path(cmd[index + 1]).name == run_id:
            out.append(proc)
    return out


def ranks_of(run_id: str, home: Path) -> list[psutil.Process]:
    """The rank processes (not torchrun) of `run_id` whose run directory is under `home`."""
    return [
        p
        for p in rank_processes(run_id)
        if "workers.harness.main" in p.info["cmdline"]
        and str(home) in " ".join(p.info["cmdline"])
        and "torch.distributed.run" not in p.info["cmdline"]
    ]


def wait_for_training(client: TestClient, run_id: str, timeout: float = 180) -> None:
    def check() -> bool:
        run = client.get(f"/api/v1/runs/{run_id}").json()
        assert run["status"] in ("queued", "running"), run.get("error")
        return (run["progress"] or {}).get("phase") == "train"

    wait_until(check, f"run {run_id} to train", timeout)


def kill_worker(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the worker alone (no cleanup runs): its torchrun, in a session of its own, dies by its parent-death signal."""
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


def stop_worker(proc: subprocess.Popen[bytes]) -> None:
    stop_process_group(proc, grace_s=20)


class PrivateRedis:
    """A redis-server of the test's own on a free loopback port (never the machine's shared one),
    with an append-only file so that a restart keeps what was queued."""

    def __init__(self, directory: Path):
        self.directory, self.port = directory, free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        exe = shutil.which("redis-server")
        assert exe, "redis-server is not installed"
        args = [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.directory), "--appendonly", "yes", "--save", ""]
        self.proc = subprocess.Popen(
            args, stdout=(self.directory / "redis.log").open("ab"), stderr=subprocess.STDOUT, start_new_session=True
        )
        wait_until(self._answers, "the private redis to answer", timeout=20, every=0.1)

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=20)
        self.proc = None


@contextmanager
def private_redis(directory: Path) -> Iterator[PrivateRedis]:
    redis = PrivateRedis(directory)
    redis.start()
    try:
        yield redis
    finally:
        redis.stop()
