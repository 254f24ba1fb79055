"""Labs on a cluster, against a real single-node Slurm: runs placed on a Slurm pool go through
`parallab slurm-agent` (sbatch of srun torchrun), and end in their true state — succeeded with the
same result as a Celery worker's run of the same spec, cancelled from the run page, failed on a
time limit or an unknown partition, failed when their job vanished — across an agent SIGKILLed
mid-run; a sweep on the pool is one Slurm job per run, runs to its end, and is cancelled as a whole.

The launches are few and shared: one ddp × 2 job on a Celery worker then on Slurm (its agent
killed and restarted under it), one long job that Slurm's time limit ends (submitted first,
checked last, running meanwhile), a sweep of three single-rank configurations of a few steps, and
jobs cancelled within seconds of starting.
"""

from __future__ import annotations

import json
import os
import re
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
from backend.models import Run
from backend.services import pools
from parallab.core.jobs import ResolvedJob
from parallab.core.pools import SlurmPool
from tests.conftest import TABLES, worker_env
from tests.e2e.fleet import live_hosts, wait_until
from workers.engines.slurm import SlurmHandle
from workers.launcher import stop_process_group
from workers.slurm_agent import SlurmAgent

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
POOL, SHORT, NOPE = "cpu-slurm", "cpu-slurm-short", "cpu-slurm-nope"
DDP = {"workload": {"model": "tiny", "steps": 4, "warmup_steps": 1, "lr": 1e-2, "seed": 0}, "strategy": {"name": "ddp", "world_size": 2}}
LONG = {"workload": {"model": "tiny", "steps": 200_000}, "strategy": {"name": "ddp", "world_size": 2}, "trace": False}
"""Minutes of work: it ends by a cancel or a time limit, never by itself."""
SWEEP = {"workload": {"model": "tiny"}, "world_size": 1, "top": 2, "controls": 1, "precisions": ["fp32"], "accumulation": [1], "pool": POOL}
"""Three configurations, the cheapest there are: one rank each (single, checkpointing none, selective, full)."""


@dataclass
class Lab:
    settings: Settings
    client: TestClient
    shared: Path
    timed_out: str
    """A run on the pool with a one-minute time limit, submitted when the lab starts."""

    def submit(self, spec: dict[str, Any], pool: str = POOL) -> str:
        response = self.client.post("/api/v1/runs", json={**spec, "placement": {"pool": pool}})
        assert response.status_code == 202, response.text
        return str(response.json()["id"])

    def run(self, run_id: str) -> dict[str, Any]:
        return dict(self.client.get(f"/api/v1/runs/{run_id}").json())

    def wait(self, run_id: str, statuses: set[str], timeout: float = 300, **fields: Any) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        run = self.run(run_id)
        while time.monotonic() < deadline:
            run = self.run(run_id)
            if run["status"] in statuses:
                return run
            time.sleep(0.5)
        raise AssertionError(f"run {run_id} never reached {statuses}; last: {run['status']} {run.get('error')}")

    def slurm_job(self, run_id: str) -> tuple[str, str]:
        """(Slurm job id, state as last seen) of a run, once its agent submitted it."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with session_scope(self.settings.sqlalchemy_url) as session:
                job = pools.engine_job(session=session, run_id=run_id)
                if job is not None:
                    return job.job_id, job.state
            time.sleep(0.3)
        raise AssertionError(f"run {run_id} was never submitted to Slurm")

    def start(self, *args: str, log: str) -> subprocess.Popen[bytes]:
        """`parallab ARGS…` of this checkout on the lab's settings, in its own process group."""
        env = worker_env(self.settings) | {"PARALLAB_SLURM_POLL_S": "1", "SLURM_CONF": os.environ["SLURM_CONF"]}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
        out = (self.settings.resolved_home / log).open("ab")
        cmd = [sys.executable, "-m", "parallab", *args]
        return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def agent(self, pool: str = POOL) -> subprocess.Popen[bytes]:
        return self.start("slurm-agent", "--pool", pool, log=f"agent-{pool}.log")

    def worker(self) -> subprocess.Popen[bytes]:
        """A Celery worker of the default pool (the embedded broker under the lab's home)."""
        return self.start("worker", "--loglevel", "INFO", log="worker.log")

    def sweep(self, sweep_id: str) -> dict[str, Any]:
        return dict(self.client.get(f"/api/v1/sweeps/{sweep_id}").json())


def squeue_state(job_id: str) -> str:
    done = subprocess.run(["squeue", "-h", "--states=all", "-j", job_id, "-o", "%T"], capture_output=True, text=True, check=True)
    return done.stdout.strip()


@pytest.fixture(scope="module")
def lab(slurm_conf: str, postgres_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    home = tmp_path_factory.mktemp("slurm-home")
    shared = tmp_path_factory.mktemp("slurm-shared")  # the cluster's shared filesystem: one node here
    settings = Settings(home=home, database_url=postgres_url, max_world_size=4, max_steps=200_000, slurm_poll_s=1, max_job_seconds=600)
    settings.ensure_home()
    empty_tables(settings)  # what earlier tests left on the session's database (their workers' pools) is not this lab's
    with session_scope(settings.sqlalchemy_url) as session:
        for name, extra in ((POOL, {}), (SHORT, {"time_limit": "1"}), (NOPE, {"partition": "no-such-partition"})):
            config = SlurmPool.model_validate({"python": sys.executable, "run_root": str(shared / name), **extra})
            pools.declare_pool(session=session, name=name, settings=config)
    app = create_app()
    app.dependency_overrides[get_settings] = lambda: settings
    with TestClient(app) as client:
        lab = Lab(settings, client, shared, timed_out="")
        lab.timed_out = lab.submit(LONG, pool=SHORT)
        short_agent = lab.agent(SHORT)
        try:
            yield lab
        finally:
            stop_process_group(short_agent)
            for name in (POOL, SHORT):  # nothing of ours left running on the cluster, whatever failed
                engine = SlurmAgent(settings, name).engine
                for job in engine.jobs().values():
                    if job.state in ("PENDING", "RUNNING") and job.run_id:
                        engine.cancel(SlurmHandle(job.run_id, job.job_id))
            empty_tables(settings)  # the session's database as the next tests expect it


def empty_tables(settings: Settings) -> None:
    with get_engine(settings.sqlalchemy_url).begin() as conn:
        for table in TABLES:
            conn.execute(text(f"DELETE FROM {table}"))


def test_ddp_on_slurm_matches_a_celery_run_and_survives_its_agent_killed_mid_run(lab: Lab) -> None:
    # The same spec through a Celery worker first: its result to match, and the reference curve it
    # stores in the lab database, which the agent then copies into the pool's cache.
    worker = lab.worker()
    try:
        # Registered first: a run submitted before any worker of the default pool is live is placed
        # on whichever live pool can take it.
        wait_until(lambda: any(w["pool"] == "cpu" for w in live_hosts(lab.client).values()), "the worker to register", timeout=60)
        celery_id = lab.client.post("/api/v1/runs", json=DDP).json()["id"]
        celery = lab.wait(celery_id, {"succeeded", "failed", "cancelled"}, timeout=240)
    finally:
        stop_process_group(worker)
    assert celery["status"] == "succeeded", celery["error"]
    local = celery["result"]
    assert local["loss"]["reference_source"] == "computed"

    run_id = lab.submit(DDP)
    agent = lab.agent()
    try:
        running = lab.wait(run_id, {"running", "succeeded", "failed"}, timeout=120)
        assert running["status"] == "running", running["error"]
        job_id, _ = lab.slurm_job(run_id)
        os.kill(agent.pid, signal.SIGKILL)  # mid-run: the job goes on in Slurm without its agent
        agent.wait(timeout=30)
        time.sleep(2)
        assert lab.run(run_id)["status"] == "running"
        agent = lab.agent()  # restarted: it finds the job again and carries on
        run = lab.wait(run_id, {"succeeded", "failed", "cancelled"})
    finally:
        stop_process_group(agent)
    assert run["status"] == "succeeded", run["error"]
    result = run["result"]
    hardware = result["hardware"]
    assert hardware["slurm_job_id"] == job_id and hardware["slurm_nodes"] == os.uname().nodename.split(".")[0]
    assert hardware["hosts"] == [hardware["slurm_nodes"]]

    # The same numbers as the Celery worker's run of the same spec.
    assert result["loss"]["values"] == pytest.approx(local["loss"]["values"], rel=1e-6)
    assert result["summary"]["loss_max_rel_diff_vs_reference"] <= 1e-4
    assert result["summary"]["gradient_check"]["passed"] and local["summary"]["gradient_check"]["passed"]
    assert result["summary"]["comm_bytes_per_step"] == local["summary"]["comm_bytes_per_step"]
    assert [r["model_state_bytes"] for r in result["ranks"]] == [r["model_state_bytes"] for r in local["ranks"]]
    # Built as a worker builds it: the reference from the lab database, the host's noise around the ranks.
    assert result["loss"]["reference_source"] == "lab database"
    assert result["loss"]["reference"] == pytest.approx(local["loss"]["reference"], rel=1e-6)
    assert result["noise"]["ranks_on_host"] == 2 and local["noise"]["ranks_on_host"] == 2
    assert result["noise"]["duration_s"] > 0

    # What a Kubernetes pod runs after its ranks (`parallab export k8s`) builds the same document from the same records.
    out = lab.settings.resolved_home / "collected.json"
    files = lab.shared / POOL / run_id
    collect = [sys.executable, "-m", "workers.collect", "--job", str(files / "job.json"), "--run-dir", str(files), "--out", str(out)]
    subprocess.run(collect, cwd=REPO, check=True, timeout=120)
    collected = json.loads(out.read_text())
    assert collected["loss"]["values"] == result["loss"]["values"]
    assert collected["summary"]["comm_bytes_per_step"] == result["summary"]["comm_bytes_per_step"]

    page = lab.client.get(f"/runs/{run_id}").text
    assert f'<p class="muted" id="run-scheduler">Slurm job {job_id} COMPLETED on {hardware["slurm_nodes"]}</p>' in page


def test_cancelling_a_run_on_slurm_from_its_page_scancels_its_job(lab: Lab) -> None:
    run_id = lab.submit(LONG)
    agent = lab.agent()
    try:
        lab.wait(run_id, {"running"}, timeout=120)
        job_id, _ = lab.slurm_job(run_id)
        page = lab.client.get(f"/runs/{run_id}")  # the page's Cancel form, with the CSRF token it carries
        cancel_form = r'<form method="post" action="(/runs/[^"]+/cancel)"[^>]*>\s*<input type="hidden" name="csrf_token" value="([^"]+)"'
        form = re.search(cancel_form, page.text)
        assert form is not None, "the run page offers a Cancel form"
        response = lab.client.post(form.group(1), data={"csrf_token": form.group(2)}, follow_redirects=False)
        assert response.status_code == 303 and response.headers["location"] == f"/runs/{run_id}"
        run = lab.wait(run_id, {"cancelled", "failed", "succeeded"}, timeout=120)
    finally:
        stop_process_group(agent)
    assert run["status"] == "cancelled", run["error"]
    assert f"Slurm job {job_id} CANCELLED" in run["error"]
    assert squeue_state(job_id) == "CANCELLED"


def test_a_job_slurm_refuses_fails_its_run_with_slurms_message(lab: Lab) -> None:
    run_id = lab.submit(DDP, pool=NOPE)
    SlurmAgent(lab.settings, NOPE).poll()
    run = lab.run(run_id)
    assert run["status"] == "failed"
    assert "Slurm refused the job" in run["error"] and "invalid partition" in run["error"].lower()


def test_a_job_that_vanished_from_slurm_fails_its_run_saying_so(lab: Lab) -> None:
    run_id = lab.submit(DDP, pool=NOPE)
    with session_scope(lab.settings.sqlalchemy_url) as session:
        run = session.get(Run, run_id)
        assert run is not None
        pools.record_submission(session=session, run=run, engine="slurm", pool=NOPE, job_id="987654", output=None)
    SlurmAgent(lab.settings, NOPE).poll()
    run = lab.run(run_id)
    assert run["status"] == "failed" and "Slurm job 987654 vanished from Slurm" in run["error"]


def test_a_job_sbatched_but_not_recorded_is_adopted_by_its_name_after_a_restart(lab: Lab) -> None:
    run_id = lab.submit(LONG)
    agent = SlurmAgent(lab.settings, POOL)
    with session_scope(lab.settings.sqlalchemy_url) as session:
        job = ResolvedJob.model_validate(session.get(Run, run_id).job)
    handle = agent.engine.launch(job, run_id)  # the agent died before recording it
    assert agent.reconcile() == [run_id]
    assert lab.slurm_job(run_id)[0] == handle.job_id
    assert lab.client.post(f"/api/v1/runs/{run_id}/cancel").status_code in (200, 202)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (lab.run(run_id)["status"] != "cancelled" or squeue_state(handle.job_id) != "CANCELLED"):
        agent.poll()
        time.sleep(0.5)
    assert lab.run(run_id)["status"] == "cancelled" and squeue_state(handle.job_id) == "CANCELLED"


def test_a_sweep_on_a_slurm_pool_is_one_job_per_run_and_runs_to_its_end(lab: Lab) -> None:
    response = lab.client.post("/api/v1/sweeps", json={**SWEEP, "steps": 3})
    assert response.status_code == 202, response.text
    sweep = response.json()
    run_ids = [run_id for p in sweep["points"] for run_id in p["run_ids"]]
    assert len(run_ids) == 3
    agent = lab.agent()
    try:
        jobs = [lab.slurm_job(run_id)[0] for run_id in run_ids]
        runs = [lab.wait(run_id, {"cancelled", "failed", "succeeded"}, timeout=240) for run_id in run_ids]
    finally:
        stop_process_group(agent)
    assert len(set(jobs)) == 3  # one Slurm job per configuration
    assert [r["status"] for r in runs] == ["succeeded"] * 3, [r["error"] for r in runs]
    assert sorted(r["result"]["hardware"]["slurm_job_id"] for r in runs) == sorted(jobs)
    done = lab.sweep(sweep["id"])
    assert done["status"] == "finished" and done["finished_at"]
    assert [p["status"] for p in done["points"]] == ["succeeded"] * 3
    assert all(p["measured"]["tokens_per_s"] > 0 and p["measured"]["runs"] == 1 for p in done["points"])


def test_a_sweep_on_a_slurm_pool_is_cancelled_as_a_whole(lab: Lab) -> None:
    response = lab.client.post("/api/v1/sweeps", json={**SWEEP, "steps": 10_000})
    assert response.status_code == 202, response.text
    sweep_id = response.json()["id"]
    run_ids = [run_id for p in response.json()["points"] for run_id in p["run_ids"]]
    agent = lab.agent()
    try:
        jobs = [lab.slurm_job(run_id)[0] for run_id in run_ids]
        assert lab.client.post(f"/api/v1/sweeps/{sweep_id}/cancel").status_code == 200
        runs = [lab.wait(run_id, {"cancelled", "failed", "succeeded"}, timeout=120) for run_id in run_ids]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and any(squeue_state(j) != "CANCELLED" for j in jobs):
            time.sleep(0.5)
    finally:
        stop_process_group(agent)
    assert [r["status"] for r in runs] == ["cancelled"] * 3
    assert [squeue_state(j) for j in jobs] == ["CANCELLED"] * 3
    assert lab.sweep(sweep_id)["status"] == "cancelled"


def test_a_job_past_its_time_limit_fails_saying_so(lab: Lab) -> None:
    run = lab.wait(lab.timed_out, {"succeeded", "failed", "cancelled"}, timeout=400)
    assert run["status"] == "failed"
    assert "TIMEOUT: it ran past its time limit" in run["error"]
