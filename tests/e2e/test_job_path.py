"""The whole job path with real parts: REST → Celery worker (Redis or the embedded SQLite
transport) → torchrun ranks → result ingested into Postgres or SQLite in one transaction."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from fastapi.testclient import TestClient

from backend.api.app import create_app
from backend.config import Settings, get_settings
from backend.db import session_scope
from backend.models import Run
from backend.store import runs as store
from tests.conftest import REDIS_URL, worker_env
from workers.launcher import stop_process_group

pytestmark = pytest.mark.slow

DDP = {"name": "e2e ddp", "workload": {"model": "tiny", "steps": 3, "warmup_steps": 1}, "strategy": {"name": "ddp", "world_size": 2}}


def start_worker(settings: Settings, log_path: Path) -> subprocess.Popen:
    log = log_path.open("wb")
    return subprocess.Popen(
        [sys.executable, "-m", "parallab", "worker", "--loglevel", "INFO"],
        env=worker_env(settings),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def api_client(settings: Settings) -> TestClient:
    app = create_app()
    app.dependency_overrides[get_settings] = lambda: settings
    return TestClient(app)


def wait_for(client: TestClient, run_id: str, statuses: set[str], timeout: float = 240) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = client.get(f"/api/v1/runs/{run_id}").json()
        if run["status"] in statuses:
            return run
        time.sleep(0.5)
    raise AssertionError(f"run {run_id} never reached {statuses}; last: {run['status']} {run.get('error')}")


def assert_ddp_result(run: dict) -> None:
    assert run["status"] == "succeeded", run["error"]
    result = run["result"]
    assert [r["rank"] for r in result["ranks"]] == [0, 1]
    assert result["summary"]["tokens_per_s"] > 0
    assert result["strategy"] == {"name": "ddp", "world_size": 2, "options": {"bucket_cap_mb": 25.0}}
    assert result["summary"]["loss_max_rel_diff_vs_reference"] <= 1e-4
    assert all(r["model_state_bytes"]["params"] > 0 and r["peak_rss_bytes"] > 0 for r in result["ranks"])
    assert run["tokens_per_s"] == pytest.approx(result["summary"]["tokens_per_s"])


@pytest.fixture(scope="module")
def redis_setup(postgres_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Settings, TestClient]]:
    home = tmp_path_factory.mktemp("redis-home")
    # A queue of our own, so nothing another session left in Redis reaches this worker.
    settings = Settings(home=home, database_url=postgres_url, broker_url=REDIS_URL, queue=f"parallab-test-{uuid.uuid4().hex[:8]}")
    worker = start_worker(settings, home / "worker.log")
    with api_client(settings) as client:
        yield settings, client
    stop_process_group(worker)


def test_cancel_a_running_job_kills_its_ranks(redis_setup) -> None:
    settings, client = redis_setup
    long = {**DDP, "name": "long", "workload": {"model": "tiny", "steps": 5000}}
    run_id = client.post("/api/v1/runs", json=long).json()["id"]
    running = wait_for(client, run_id, {"running", "failed", "succeeded"})
    assert running["status"] == "running"
    deadline = time.monotonic() + 120
    while (client.get(f"/api/v1/runs/{run_id}").json()["progress"] or {}).get("phase") != "train":
        assert time.monotonic() < deadline, "no live progress reached the API"
        time.sleep(0.5)
    assert client.post(f"/api/v1/runs/{run_id}/cancel").status_code == 200
    run = wait_for(client, run_id, {"cancelled", "failed", "succeeded"}, timeout=60)
    assert run["status"] == "cancelled"
    assert "log tail" in run["error"]
    assert run["result"] is None


def test_ddp_job_over_redis_into_postgres_succeeds(redis_setup) -> None:
    """Also proves the worker carried on after the cancelled job before it. Untraced: nothing here
    reads a trace (the traced run over this path is the fsdp one below), and the profiled window
    would be the longest part of its launch after the start."""
    settings, client = redis_setup
    response = client.post("/api/v1/runs", json={**DDP, "trace": False})
    assert response.status_code == 202
    run = wait_for(client, response.json()["id"], {"succeeded", "failed", "cancelled"})
    assert_ddp_result(run)
    assert settings.sqlalchemy_url.startswith("postgresql")


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_parallab_up_on_the_embedded_default_runs_a_curl_style_job(tmp_path: Path) -> None:
    """A new user's first minute: `parallab up`, POST a DDP job over HTTP, see it succeed."""
    import httpx

    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PARALLAB_")}
    env.update(PARALLAB_HOME=str(tmp_path / "home"), OMP_NUM_THREADS="1")
    server = subprocess.Popen(
        [sys.executable, "-m", "parallab", "up", "--port", str(port)],
        cwd=tmp_path,
        env=env,
        stdout=(tmp_path / "up.log").open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{base}/healthz").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, (tmp_path / "up.log").read_text()[-3000:]
            time.sleep(0.5)
        # Untraced: nothing here reads a trace; the profiled window would be most of the launch.
        created = httpx.post(f"{base}/api/v1/runs", json={**DDP, "trace": False})
        assert created.status_code == 202, created.text
        run_id = created.json()["id"]
        deadline = time.monotonic() + 240
        while (run := httpx.get(f"{base}/api/v1/runs/{run_id}").json())["status"] not in ("succeeded", "failed", "cancelled"):
            assert time.monotonic() < deadline, (tmp_path / "up.log").read_text()[-3000:]
            time.sleep(0.5)
    finally:
        stop_process_group(server)
    assert_ddp_result(run)
    # Stopping `parallab up` stops its worker too: nothing of this home is left running.
    time.sleep(1)
    leftover = [p for p in psutil.process_iter(["environ"]) if (p.info["environ"] or {}).get("PARALLAB_HOME") == env["PARALLAB_HOME"]]
    assert leftover == [], [p.cmdline() for p in leftover]
    assert (tmp_path / "home" / "parallab.db").exists() and (tmp_path / "home" / "broker.db").exists()


def test_a_rank_killed_mid_run_fails_the_run_with_its_log_tail(sqlite_url: str, tmp_path: Path) -> None:
    """A rank dying (as the OOM killer would) fails the run; the caller survives and says why."""
    from backend.services.runs import create_run
    from workers.execute import execute_run

    settings = Settings(home=tmp_path / "home", database_url=sqlite_url)
    with session_scope(sqlite_url) as session:
        from parallab.core.spec import JobSpec

        run_id = create_run(
            session=session,
            spec=JobSpec.model_validate({**DDP, "workload": {"model": "tiny", "steps": 5000}}),
            settings=settings,
            source="api",
        ).id

    def kill_a_rank() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with session_scope(sqlite_url) as session:
                progress = store.get_run(session, run_id).progress
            if progress and progress.get("phase") == "train":
                ranks = [
                    p
                    for p in psutil.process_iter(["cmdline"])
                    if "workers.harness.main" in " ".join(p.info["cmdline"] or [])
                    and "--run-dir" in (p.info["cmdline"] or [])
                    and str(settings.runs_dir / run_id) in " ".join(p.info["cmdline"])
                ]
                if ranks:
                    ranks[-1].kill()
                    return
            time.sleep(0.3)

    killer = threading.Thread(target=kill_a_rank)
    killer.start()
    status = execute_run(run_id, settings)
    killer.join()
    assert status == "failed"
    with session_scope(sqlite_url) as session:
        run = session.get(Run, run_id)
        assert run.status == "failed" and run.finished_at is not None
        assert "training process failed" in run.error and "log tail" in run.error
        assert run.result is None
    # The status guard: a finished run never runs again.
    assert execute_run(run_id, settings) == "skipped"


def stored_job(settings: Settings, run_id: str) -> dict:
    """The frozen resolved job a run was stored with."""
    with session_scope(settings.sqlalchemy_url) as session:
        return store.get_run(session, run_id).job


def test_every_strategy_submitted_through_the_api_succeeds_and_its_result_resubmits(redis_setup) -> None:
    """Issue 3's 'the same runs submitted through the API succeed': one worker, queued back to back.
    Then issue 8's round trip: each result's workload and strategy, posted back as a job spec,
    is the same frozen job; one resubmission runs to the end."""
    settings, client = redis_setup
    jobs = [
        ("fsdp", 2, {}),
        ("tp", 2, {"sequence_parallel": True}),
        ("pp", 2, {"schedule": "gpipe"}),
        ("ring", 2, {"zigzag": True}),
        ("moe", 2, {}),
        ("hybrid", 4, {"tp": 2}),
    ]
    ids = {}
    for name, world, options in jobs:
        spec = {
            "workload": {"model": "tiny", "steps": 2, "warmup_steps": 1},
            "strategy": {"name": name, "world_size": world, "options": options},
            "trace": name == "fsdp",
        }
        response = client.post("/api/v1/runs", json=spec)
        assert response.status_code == 202, response.text
        ids[name] = response.json()["id"]
    runs = {}
    for name, run_id in ids.items():
        run = runs[name] = wait_for(client, run_id, {"succeeded", "failed", "cancelled"}, timeout=300)
        assert run["status"] == "succeeded", f"{name}: {run['error']}"
        summary = run["result"]["summary"]
        assert summary["tokens_per_s"] > 0
        assert summary["loss_max_rel_diff_vs_reference"] <= 1e-4, name
        assert len(run["result"]["ranks"]) == run["world_size"]
    # The traced run's Chrome traces are stored per rank and served for Perfetto.
    import gzip
    import json

    response = client.get(f"/api/v1/runs/{ids['fsdp']}/trace", params={"rank": 1})
    assert response.status_code == 200 and response.headers["content-type"] == "application/gzip"
    trace = json.loads(gzip.decompress(response.content))
    names = {event.get("name", "") for event in trace["traceEvents"]}
    assert any(name.startswith("gloo:") for name in names), sorted(names)[:20]
    assert client.get(f"/api/v1/runs/{ids['fsdp']}/trace", params={"rank": 2}).status_code == 404
    assert client.get(f"/api/v1/runs/{ids['fsdp']}?include=timeline").json()["result"]["timeline"], "the traced run keeps its timeline"

    # result → spec → resubmit: the same frozen job, every strategy. Only hybrid (the one that
    # composes two strategies) runs again; the others are cancelled while still queued. Hybrid goes
    # first, so the idle worker takes it and the rest queue behind it (posted first, another would
    # be taken at once and its launch started before its cancel arrived).
    resubmitted = {}
    for name in sorted(runs, key=lambda n: n != "hybrid"):
        result = runs[name]["result"]
        spec = {
            "workload": result["workload"],
            "strategy": result["strategy"],
            "trace": runs[name]["spec"]["trace"],
            "name": result["name"],
        }
        response = client.post("/api/v1/runs", json=spec)
        assert response.status_code == 202, f"{name}: {response.text}"
        resubmitted[name] = response.json()["id"]
        assert stored_job(settings, resubmitted[name]) == stored_job(settings, ids[name]), name
        if name != "hybrid":
            assert client.post(f"/api/v1/runs/{resubmitted[name]}/cancel").status_code == 200
    again = wait_for(client, resubmitted["hybrid"], {"succeeded", "failed", "cancelled"}, timeout=300)
    assert again["status"] == "succeeded", again["error"]
    assert again["result"]["workload"] == runs["hybrid"]["result"]["workload"]
    assert again["result"]["strategy"] == runs["hybrid"]["result"]["strategy"]
