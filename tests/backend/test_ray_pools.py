"""A Ray pool is declared like a Slurm pool: the CLI names the flag of a bad setting and writes
nothing, a good one is stored as the ray kind's settings, its runs are not queued for workers,
a job asking for more ranks than the pool allows is refused naming the limit, the agent
refuses a pool that is not a Ray pool, and the /workers page lists it in a table of its own."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from backend.config import Settings, get_settings
from backend.db import session_scope
from backend.services import pools
from parallab.cli import app
from parallab.core.jobs import Limits, resolve_job
from parallab.core.pools import RayPool, SlurmPool
from parallab.core.spec import JobSpec


def test_the_cli_declares_a_ray_pool_and_refuses_bad_settings_naming_the_flag(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARALLAB_DATABASE_URL", settings.sqlalchemy_url)
    monkeypatch.setenv("PARALLAB_HOME", str(settings.resolved_home))
    get_settings.cache_clear()
    runner = CliRunner()
    base = ["pool", "create-ray", "ray-cpu", "--address", "10.0.0.5:6379", "--run-dir", "/shared/runs"]
    try:
        relative = runner.invoke(app, [*base[:-1], "runs"])
        assert relative.exit_code == 2 and "--run-dir" in relative.output
        bad = runner.invoke(app, [*base, "--strategy", "spread"])
        assert bad.exit_code == 2 and "--strategy" in bad.output
        with session_scope(settings.sqlalchemy_url) as session:
            assert pools.scheduled_pools(session=session) == {}  # nothing half-written
        done = runner.invoke(app, [*base, "--gpus-per-rank", "1", "--strategy", "strict_pack", "--max-ranks", "2"])
        assert done.exit_code == 0, done.output
        with session_scope(settings.sqlalchemy_url) as session:
            declared = pools.scheduled_pool(session=session, name="ray-cpu")
            assert not pools.uses_queue(session=session, pool="ray-cpu")
        assert isinstance(declared, RayPool)
        assert (declared.address, declared.gpus_per_rank, declared.strategy, declared.max_ranks) == ("10.0.0.5:6379", 1, "STRICT_PACK", 2)
        job = resolve_job(JobSpec.model_validate({"workload": {"model": "tiny"}, "strategy": {"name": "ddp", "world_size": 4}}), Limits())
        assert [p.msg for p in declared.problems("ray-cpu", job)] == ["pool 'ray-cpu' allows 2 rank(s); this job asks for 4"]
        agent = runner.invoke(app, ["ray-agent", "--pool", "nope", "--once"])
        assert agent.exit_code == 2 and "no Ray pool named 'nope'" in agent.output
    finally:
        get_settings.cache_clear()


def test_the_workers_page_lists_the_declared_pools_of_every_scheduler_kind_ray_included(settings: Settings, client: TestClient) -> None:
    """Each kind in the registry that a scheduler drives gets its own table of its declared pools,
    with the kind's settings as columns: a Ray pool shows beside a Slurm pool, each only in its own."""
    ray = RayPool(address="10.0.0.5:6379", run_root="/shared/ray-runs", gpus_per_rank=1, max_ranks=16)
    slurm = SlurmPool(python="/shared/env/bin/python", run_root="/shared/slurm-runs", partition="gpu")
    with session_scope(settings.sqlalchemy_url) as session:
        pools.declare_pool(session=session, name="ray-gpu", settings=ray)
        pools.declare_pool(session=session, name="a100-slurm", settings=slurm)
    page = client.get("/workers")
    assert page.status_code == 200
    html = page.text
    assert "No worker has registered yet" not in html
    sections = {kind: html[html.index(f'id="{kind}-pools"') :] for kind in ("slurm", "ray")}
    sections = {kind: text[: text.index("</section>")] for kind, text in sections.items()}
    assert "<h2>Ray pools</h2>" in sections["ray"] and "<h2>Slurm pools</h2>" in sections["slurm"]
    assert "<code>parallab ray-agent --pool NAME</code>" in sections["ray"]
    row = sections["ray"][sections["ray"].index('id="ray-pool-ray-gpu"') :].split("</tr>")[0]
    assert "<td>10.0.0.5:6379</td>" in row and "<code>/shared/ray-runs</code>" in row and "<td>PACK</td>" in row and "<td>16</td>" in row
    assert '<th title="The cluster&#39;s address' in sections["ray"] and ">GPUs per rank</th>" in sections["ray"]
    assert "a100-slurm" not in sections["ray"] and "ray-gpu" not in sections["slurm"]
    slurm_row = sections["slurm"][sections["slurm"].index('id="slurm-pool-a100-slurm"') :].split("</tr>")[0]
    assert "<td>gpu</td>" in slurm_row and "<code>/shared/slurm-runs</code>" in slurm_row and ">QoS</th>" in sections["slurm"]
