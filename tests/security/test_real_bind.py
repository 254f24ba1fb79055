"""Local mode and the placeholder secret decided by the real bind, with uvicorn started the way
compose starts it (`uvicorn backend.api.app:app --host ...`), not through `parallab up`."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from backend.config import PLACEHOLDER_SECRET
from backend.migrate import upgrade

pytestmark = pytest.mark.slow

SPEC = {"workload": {"model": "tiny", "steps": 3}, "strategy": {"name": "ddp", "world_size": 2}}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def uvicorn(home: Path, *, bind: str, secret: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    """uvicorn serving the app on `bind`:port, on a SQLite database under `home`; (process, loopback URL)."""
    home.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{home / 'parallab.db'}"
    upgrade(url)
    port = free_port()
    process_env = {k: v for k, v in os.environ.items() if not k.startswith("PARALLAB_")}
    process_env.update(PARALLAB_HOME=str(home), PARALLAB_DATABASE_URL=url, PARALLAB_SECRET_KEY=secret, **(env or {}))
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "backend.api.app:app", "--host", bind, "--port", str(port), "--log-level", "warning"],
        env=process_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    return proc, f"http://127.0.0.1:{port}"


def wait_until_serving(proc: subprocess.Popen, base: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"uvicorn exited {proc.returncode}: {proc.stdout.read() if proc.stdout else ''}")
        try:
            httpx.get(f"{base}/healthz", timeout=1)
            return
        except httpx.TransportError:
            time.sleep(0.1)
    raise AssertionError("uvicorn did not start")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_a_network_bind_is_not_local_mode_even_through_loopback(tmp_path) -> None:
    """PARALLAB_HOST still says 127.0.0.1, uvicorn binds 0.0.0.0: no submitting without a token,
    even for a request that arrives through 127.0.0.1 (a proxy on the same host would)."""
    proc, base = uvicorn(tmp_path / "network", bind="0.0.0.0", secret="a-real-secret")
    try:
        wait_until_serving(proc, base)
        assert httpx.post(f"{base}/api/v1/runs", json=SPEC).status_code == 401
        form = httpx.post(f"{base}/runs/new", data={"strategy": "ddp"})  # no session: sent to log in, nothing submitted
        assert form.status_code == 303 and form.headers["location"].startswith("/login"), (form.status_code, form.headers)
        # served under any name (no 421 off loopback); an anonymous reader of a lab server must log in
        assert httpx.get(f"{base}/api/v1/runs", headers={"host": "parallab.lab.example"}).status_code == 401
    finally:
        stop(proc)


def test_a_loopback_bind_is_local_mode(tmp_path) -> None:
    proc, base = uvicorn(tmp_path / "loopback", bind="127.0.0.1", secret=PLACEHOLDER_SECRET)
    try:
        wait_until_serving(proc, base)
        response = httpx.post(f"{base}/api/v1/runs", json=SPEC, timeout=30)
        assert response.status_code == 202, response.text
        assert httpx.get(f"{base}/api/v1/runs", headers={"host": "evil.example"}).status_code == 421
    finally:
        stop(proc)


def test_the_placeholder_secret_stops_a_network_bind(tmp_path) -> None:
    proc, base = uvicorn(tmp_path / "placeholder", bind="0.0.0.0", secret=PLACEHOLDER_SECRET)
    try:
        out, _ = proc.communicate(timeout=30)
    finally:
        stop(proc)
    assert proc.returncode not in (0, None)
    assert "PARALLAB_SECRET_KEY still holds its placeholder" in out and "0.0.0.0" in out


def test_the_placeholder_secret_fails_start_up_when_parallab_host_says_network(tmp_path) -> None:
    proc, _ = uvicorn(tmp_path / "configured", bind="127.0.0.1", secret=PLACEHOLDER_SECRET, env={"PARALLAB_HOST": "0.0.0.0"})
    try:
        out, _ = proc.communicate(timeout=30)
    finally:
        stop(proc)
    assert proc.returncode not in (0, None)
    assert "PARALLAB_SECRET_KEY still holds its placeholder" in out and "Application startup failed" in out
