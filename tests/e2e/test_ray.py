"""Labs on a Ray cluster, against a real one-node Ray cluster the session starts (`ray start
--head`, tests/e2e/raycluster.py): runs placed on a Ray pool go through `parallab ray-agent` (a
placement group of one bundle a rank, one actor a rank, each running the harness as torchrun
would) and end in their true state — succeeded with the same result as a Celery worker's run of
the same spec, across an agent SIGKILLed mid-run and restarted (it finds the run's actors by name);
cancelled from the API with no actor or rank left; failed, saying which rank, when a rank's Ray
worker is killed; failed when its actors vanished while the agent was down.

The launches are few: one ddp × 2 job on a Celery worker then on Ray, and three long jobs that
end by a cancel or a kill within seconds of running.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from backend.api.app import create_app
from backend.config import Settings, get_settings
from backend.db import get_engine, session_scope
from backend.services import pools
from parallab.core.pools import RayPool
from tests.conftest import TABLES, worker_env
from tests.e2e.fleet import live_hosts, wait_until
from tests.e2e.raycluster import RayCluster, on_cluster, pid_alive
from workers.engines.ray_cluster import RayEngine
from workers.launcher import stop_process_group

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
POOL = "cpu-ray"
DDP = {"workload": {"model": "tiny", "steps": 4, "warmup_steps": 1, "lr": 1e-2, "seed": 0}, "strategy": {"name": "ddp", "world_size": 2}}
LONG = {"workload": {"model": "tiny", "steps": 200_000}, "strategy": {"name": "ddp", "world_size": 2}, "trace": False}
"""Minutes of work: it ends by a cancel or a kill, never by itself."""


@dataclass
class Lab:
    settings: Settings
    client: TestClient
    runs: Path
    cluster: RayCluster
    engine: RayEngine

    def submit(self, spec: dict[str, Any]) -> str:
        response = self.client.post("/api/v1/runs", json={**spec, "placement": {"pool": POOL}})
        assert response.status_code == 202, response.text
        return str(response.json()["id"])

    def run(self, run_id: str) -> dict[str, Any]:
        response = self.client.get(f"/api/v1/runs/{run_id}")
        assert response.status_code == 200, f"{response.status_code} {response.text[:2000]}"
        return dict(response.json())

    def wait(self, run_id: str, statuses: set[str], timeout: float = 300) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        run = self.run(run_id)
        while time.monotonic() < deadline:
            run = self.run(run_id)
            if run["status"] in statuses:
                return run
            time.sleep(0.5)
        raise AssertionError(f"run {run_id} never reached {statuses}; last: {run['status']} {run.get('error')}")

    def launched(self, run_id: str) -> dict[str, Any]:
        """What the engine wrote of the run's actors once every rank started (their pids and nodes)."""
        path = self.runs / run_id / "ray.json"
        wait_until(path.exists, f"the ranks of {run_id} to start", timeout=180)
        return dict(json.loads(path.read_text()))

    def actors_of(self, run_id: str) -> list[str]:
        """The run's actors and placement group still on the cluster."""
        said = on_cluster(self.cluster.address, self.engine.namespace, "names")
        return [name for name in said["actors"] + said["groups"] if name.startswith(f"parallab-{run_id}")]

    def start(self, *args: str, log: str) -> subprocess.Popen[bytes]:
        env = worker_env(self.settings)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
        out = (self.settings.resolved_home / log).open("ab")
        cmd = [sys.executable, "-m", "parallab", *args]
        return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def agent(self) -> subprocess.Popen[bytes]:
        return self.start("ray-agent", "--pool", POOL, "--poll-s", "1", log="ray-agent.log")

    def worker(self) -> subprocess.Popen[bytes]:
        return self.start("worker", "--loglevel", "INFO", log="worker.log")

    def ranks_gone(self, launched: dict[str, Any]) -> bool:
        """Every rank process and every actor process of a run has exited."""
        return not any(pid_alive(int(pid)) for pid in [*launched["pids"], *(w["pid"] for w in launched["ranks"])])


def empty_tables(settings: Settings) -> None:
    with get_engine(settings.sqlalchemy_url).begin() as conn:
        for table in TABLES:
            conn.execute(text(f"DELETE FROM {table}"))


@pytest.fixture(scope="module")
def lab(ray_cluster: RayCluster, postgres_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    home = tmp_path_factory.mktemp("ray-home")
    runs = tmp_path_factory.mktemp("ray-runs")  # the cluster's shared filesystem: one node here
    settings = Settings(home=home, database_url=postgres_url, max_world_size=4, max_steps=200_000, max_job_seconds=600)
    settings.ensure_home()
    empty_tables(settings)
    config = RayPool(address=ray_cluster.address, run_root=str(runs), place_timeout_s=120)
    with session_scope(settings.sqlalchemy_url) as session:
        pools.declare_pool(session=session, name=POOL, settings=config)
    engine = RayEngine(POOL, config, max_job_seconds=600, trace_cap_bytes=settings.server.max_trace_bytes)
    app = create_app()
    app.dependency_overrides[get_settings] = lambda: settings
    with TestClient(app) as client:
        try:
            yield Lab(settings, client, runs, ray_cluster, engine)
        finally:
            on_cluster(ray_cluster.address, engine.namespace, "stop", str(runs), POOL)  # nothing of ours left, whatever failed
            empty_tables(settings)


def test_ddp_on_ray_matches_a_celery_run_and_survives_its_agent_killed_mid_run(lab: Lab) -> None:
    # The same spec through a Celery worker first: its result to match, and the reference curve it
    # stores in the lab database, which the agent then copies into the pool's cache.
    worker = lab.worker()
    try:
        wait_until(lambda: any(w["pool"] == "cpu" for w in live_hosts(lab.client).values()), "the worker to register", timeout=90)
        celery_id = lab.client.post("/api/v1/runs", json=DDP).json()["id"]
        celery = lab.wait(celery_id, {"succeeded", "failed", "cancelled"}, timeout=300)
    finally:
        stop_process_group(worker)
    assert celery["status"] == "succeeded", celery["error"]
    local = celery["result"]

    run_id = lab.submit(DDP)
    agent = lab.agent()
    try:
        running = lab.wait(run_id, {"running", "succeeded", "failed"}, timeout=240)
        assert running["status"] == "running", running["error"]
        launched = lab.launched(run_id)
        os.kill(agent.pid, signal.SIGKILL)  # mid-run: the actors are detached and go on without their agent
        agent.wait(timeout=30)
        assert lab.run(run_id)["status"] == "running"
        assert len(lab.actors_of(run_id)) == 3  # two actors, one placement group
        agent = lab.agent()  # restarted: it finds the run's actors by name and carries on
        run = lab.wait(run_id, {"succeeded", "failed", "cancelled"})
    finally:
        stop_process_group(agent)
    assert run["status"] == "succeeded", run["error"]
    result = run["result"]
    hardware = result["hardware"]
    assert hardware["ray_group"] == f"parallab-{run_id}" and hardware["ray_pool"] == POOL
    assert hardware["hosts"] == hardware["ray_nodes"] == [launched["ranks"][0]["ip"]]

    # The same numbers as the Celery worker's run of the same spec.
    assert result["loss"]["values"] == pytest.approx(local["loss"]["values"], rel=1e-6)
    assert result["summary"]["loss_max_rel_diff_vs_reference"] <= 1e-4
    assert result["summary"]["gradient_check"]["passed"] and local["summary"]["gradient_check"]["passed"]
    assert result["summary"]["comm_bytes_per_step"] == local["summary"]["comm_bytes_per_step"]
    assert [r["model_state_bytes"] for r in result["ranks"]] == [r["model_state_bytes"] for r in local["ranks"]]
    assert result["loss"]["reference_source"] == "lab database"
    # Nothing of the run left on the cluster: actors killed, ranks exited, placement group removed.
    assert lab.actors_of(run_id) == []
    assert wait_until(lambda: lab.ranks_gone(launched), "the run's processes to exit", timeout=60)


def test_cancelling_a_run_on_ray_stops_its_ranks_and_leaves_no_actor(lab: Lab) -> None:
    run_id = lab.submit(LONG)
    agent = lab.agent()
    try:
        lab.wait(run_id, {"running"}, timeout=240)
        launched = lab.launched(run_id)
        assert len(lab.actors_of(run_id)) == 3 and not lab.ranks_gone(launched)
        assert lab.client.post(f"/api/v1/runs/{run_id}/cancel").status_code in (200, 202)
        run = lab.wait(run_id, {"cancelled", "failed", "succeeded"}, timeout=120)
    finally:
        stop_process_group(agent)
    assert run["status"] == "cancelled", run["error"]
    assert lab.actors_of(run_id) == []
    assert wait_until(lambda: lab.ranks_gone(launched), "the cancelled run's processes to exit", timeout=60)


def test_a_rank_whose_ray_worker_is_killed_fails_its_run_saying_which(lab: Lab) -> None:
    run_id = lab.submit(LONG)
    agent = lab.agent()
    try:
        lab.wait(run_id, {"running"}, timeout=240)
        launched = lab.launched(run_id)
        os.kill(int(launched["ranks"][1]["pid"]), signal.SIGKILL)  # rank 1's Ray worker process, as the OOM killer would
        run = lab.wait(run_id, {"cancelled", "failed", "succeeded"}, timeout=180)
    finally:
        stop_process_group(agent)
    assert run["status"] == "failed", run["error"]
    assert f"the actor of rank 1 (parallab-{run_id}-rank1)" in run["error"], run["error"]
    assert lab.actors_of(run_id) == []
    assert wait_until(lambda: lab.ranks_gone(launched), "the failed run's processes to exit", timeout=60)


def test_a_run_whose_actors_vanished_while_its_agent_was_down_fails_after_the_restart(lab: Lab) -> None:
    run_id = lab.submit(LONG)
    agent = lab.agent()
    try:
        lab.wait(run_id, {"running"}, timeout=240)
        launched = lab.launched(run_id)
        os.kill(agent.pid, signal.SIGKILL)
        agent.wait(timeout=30)
        on_cluster(lab.cluster.address, lab.engine.namespace, "kill", f"parallab-{run_id}-rank0")
        assert lab.run(run_id)["status"] == "running"  # nobody watches it meanwhile
        agent = lab.agent()
        run = lab.wait(run_id, {"cancelled", "failed", "succeeded"}, timeout=180)
    finally:
        stop_process_group(agent)
    assert run["status"] == "failed", run["error"]
    assert f"the actor of rank 0 (parallab-{run_id}-rank0) is gone from the cluster" in run["error"], run["error"]
    assert lab.actors_of(run_id) == []
    assert wait_until(lambda: lab.ranks_gone(launched), "the run's processes to exit", timeout=60)
