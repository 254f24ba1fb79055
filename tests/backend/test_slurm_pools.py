"""Slurm pools on the backend side: declared by an admin, placed on by name, never sent to a Celery
queue (the pool's agent takes its runs from the database), refused with 422 beyond their limits."""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner

from backend.config import Settings, get_settings
from backend.db import session_scope
from backend.services import pools, runs
from backend.services.ledger import DbLedger
from backend.services.workers import register
from parallab.cli import app
from parallab.core.ledger import End, Ending
from parallab.core.pools import SlurmPool
from parallab.core.problems import SpecError
from parallab.core.spec import JobSpec
from tests.backend.test_fleet import info

GPU = SlurmPool(python="/shared/env/bin/python", run_root="/shared/runs", gpus_per_node=4, max_nodes=2)


def spec(world_size: int = 8, nodes: int = 2) -> JobSpec:
    return JobSpec.model_validate(
        {
            "workload": {"model": "tiny", "steps": 2},
            "strategy": {"name": "ddp", "world_size": world_size},
            "placement": {"pool": "a100-slurm", "nodes": nodes},
        }
    )


def test_a_run_placed_on_a_slurm_pool_waits_for_its_agent_not_on_a_queue(settings: Settings, client: Any) -> None:
    unreachable = settings.model_copy(update={"broker_url": "redis://127.0.0.1:1/0", "max_world_size": 8})
    with session_scope(settings.sqlalchemy_url) as session:
        pools.declare_pool(session=session, name="a100-slurm", settings=GPU)
    with session_scope(settings.sqlalchemy_url) as session:
        run = runs.submit_run(session=session, spec=spec(), settings=unreachable, source="api")  # no broker needed
        assert (run.status, run.pool) == ("queued", "a100-slurm")
        taken = pools.next_to_submit(session=session, pool="a100-slurm")
        assert taken is not None and taken[0].id == run.id and taken[1].nodes == 2
        pools.record_submission(session=session, run=run, engine="slurm", pool="a100-slurm", job_id="77", output=None)
    with session_scope(settings.sqlalchemy_url) as session:
        assert pools.next_to_submit(session=session, pool="a100-slurm") is None  # submitted once
        seen = pools.observe(
            session=session, run_id=run.id, state="PENDING", reason="Slurm job 77 PENDING (Priority)", nodes=None, running=False
        )
        assert seen is not None and seen.run_status == "queued" and not seen.cancel
    fleet_page = client.get("/workers").text
    assert 'id="slurm-pool-a100-slurm"' in fleet_page and "<code>/shared/runs</code>" in fleet_page
    page = client.get(f"/runs/{run.id}").text  # the page says where the job stands, in Slurm's words
    assert '<p class="muted" id="run-scheduler">Slurm job 77 PENDING (Priority)</p>' in page and "waiting for Slurm" in page
    assert client.get(f"/runs/{run.id}/status.json").json()["scheduler"] == "Slurm job 77 PENDING (Priority)"
    with session_scope(settings.sqlalchemy_url) as session:
        runs.cancel_run(session=session, run_id=run.id, settings=settings)  # queued: cancelled at once …
    with session_scope(settings.sqlalchemy_url) as session:
        seen = pools.observe(session=session, run_id=run.id, state="PENDING", reason=None, nodes=None, running=False)
        assert seen is not None and seen.cancel  # … and its agent told to scancel the pending job
    assert DbLedger(settings).finish(run.id, Ending(End.FAILED, "late")) == "cancelled"  # its end stands


@pytest.mark.parametrize(
    ("world_size", "nodes", "field", "words"),
    [(8, 4, "placement.nodes", "allows 2 node(s)"), (10, 2, "strategy.world_size", "4 GPU(s) per node")],
)
def test_a_job_beyond_the_slurm_pools_limits_is_refused_naming_the_field(
    settings: Settings, world_size: int, nodes: int, field: str, words: str
) -> None:
    settings = settings.model_copy(update={"max_world_size": 16})
    with session_scope(settings.sqlalchemy_url) as session:
        pools.declare_pool(session=session, name="a100-slurm", settings=GPU)
    with session_scope(settings.sqlalchemy_url) as session, pytest.raises(SpecError) as caught:
        runs.create_run(session=session, spec=spec(world_size, nodes), settings=settings, source="api")
    assert any(".".join(p.loc) == field and words in p.msg for p in caught.value.problems)


def test_a_pool_name_celery_workers_serve_cannot_become_a_slurm_pool(settings: Settings) -> None:
    with session_scope(settings.sqlalchemy_url) as session:
        register(session=session, info=info("gpu-1", pool="h100x8"))
    with session_scope(settings.sqlalchemy_url) as session, pytest.raises(pools.PoolError, match="served by Celery workers"):
        pools.declare_pool(session=session, name="h100x8", settings=GPU)


def test_the_cli_declares_a_slurm_pool_and_refuses_bad_settings_naming_the_flag(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PARALLAB_DATABASE_URL", settings.sqlalchemy_url)
    monkeypatch.setenv("PARALLAB_HOME", str(settings.resolved_home))
    get_settings.cache_clear()
    runner = CliRunner()
    base = ["pool", "create-slurm", "a100-slurm", "--python", "/shared/env/bin/python", "--run-dir", "/shared/runs"]
    try:
        bad = runner.invoke(app, [*base, "--time", "an hour"])
        assert bad.exit_code == 2 and "--time" in bad.output
        relative = runner.invoke(app, [*base[:-1], "runs"])
        assert relative.exit_code == 2 and "--run-dir" in relative.output
        with session_scope(settings.sqlalchemy_url) as session:
            assert pools.scheduled_pools(session=session) == {}  # nothing half-written
        done = runner.invoke(app, [*base, "--partition", "gpu", "--gpus-per-node", "4", "--time", "04:00:00"])
        assert done.exit_code == 0, done.output
        with session_scope(settings.sqlalchemy_url) as session:
            declared = pools.scheduled_pool(session=session, name="a100-slurm")
        assert isinstance(declared, SlurmPool)
        assert (declared.partition, declared.gpus_per_node, declared.time_limit) == ("gpu", 4, "04:00:00")
        agent = runner.invoke(app, ["slurm-agent", "--pool", "nope", "--once"])
        assert agent.exit_code == 2 and "no Slurm pool named 'nope'" in agent.output
    finally:
        get_settings.cache_clear()
