"""`parallab up` keeps its worker running: SIGKILL the worker and a new one takes its place (as
compose's restart policy would), logged; stopping `up` stops the new one too."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from parallab.commands.supervise import Supervisor
from tests.e2e.fleet import free_port, wait_until
from workers.launcher import stop_process_group

pytestmark = pytest.mark.slow


def worker_pids(home: Path) -> set[int]:
    """`parallab worker` processes started for this home."""
    out = set()
    for proc in psutil.process_iter(["pid", "cmdline", "environ", "status"]):
        cmd = proc.info["cmdline"] or []
        mine = (proc.info["environ"] or {}).get("PARALLAB_HOME") == str(home)
        if mine and proc.info["status"] != psutil.STATUS_ZOMBIE and cmd[-3:-1] == ["worker", "--loglevel"]:
            out.add(proc.info["pid"])
    return out


def live_workers(base: str) -> set[int]:
    try:
        items = httpx.get(f"{base}/api/v1/workers", timeout=10).json()["items"]
    except (httpx.HTTPError, ValueError, KeyError):
        return set()
    return {w["id"] for w in items if w["alive"]}


def test_up_restarts_its_worker_when_it_is_killed(tmp_path: Path) -> None:
    port = free_port()
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PARALLAB_")}
    env.update(PARALLAB_HOME=str(home), OMP_NUM_THREADS="1", PARALLAB_HEARTBEAT_S="1", PARALLAB_WORKER_TTL_S="6")
    log = tmp_path / "up.log"
    server = subprocess.Popen(
        [sys.executable, "-m", "parallab", "up", "--port", str(port)],
        cwd=tmp_path,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: live_workers(base), "the first worker to register", timeout=90)
        (first,) = wait_until(lambda: worker_pids(home), "the worker process", timeout=30)  # type: ignore[misc]
        os.kill(first, signal.SIGKILL)
        restarted = wait_until(lambda: worker_pids(home) - {first}, "a new worker process", timeout=60)
        assert server.poll() is None, "`parallab up` itself keeps serving"
        before = live_workers(base)
        wait_until(lambda: live_workers(base) - before, "the new worker to register", timeout=90)
        text = log.read_text()
        assert f"worker (pid {first}) stopped: killed by signal 9" in text, text[-2000:]
        assert "worker started again" in text
    finally:
        stop_process_group(server, grace_s=30)
    time.sleep(1)
    assert not worker_pids(home), f"stopping `parallab up` stops the restarted worker {restarted} too"


def test_a_stopped_supervisor_starts_nothing_more() -> None:
    said: list[str] = []
    supervisor = Supervisor(
        lambda: subprocess.Popen(["sleep", "0.2"], start_new_session=True), name="sleeper", say=said.append, backoff_s=0.1, poll_s=0.05
    )
    supervisor.start()
    wait_until(lambda: supervisor.restarts >= 2, "two restarts", timeout=20, every=0.05)
    supervisor.stop(grace_s=1)
    count = supervisor.restarts
    time.sleep(0.5)
    assert supervisor.restarts == count and not supervisor.is_alive()
    assert any("sleeper (pid" in line and "exit code 0" in line for line in said), said
