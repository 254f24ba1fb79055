"""A sweep end to end on this machine: calibrate the pool, plan tiny's configurations on its
profile, run the top predicted and a control through the worker's own path (`execute_run`: the
Celery task's body, the real launcher and torchrun ranks, ingest into SQLite), and hold the
measurement against the prediction. BENCHMARKS.md has the 8-configuration sweep of `small`."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from backend.api.app import create_app
from backend.config import Settings, get_settings
from backend.db import session_scope
from backend.migrate import upgrade
from backend.services import hardware, runs, sweeps
from backend.services import workers as fleet
from parallab.core.spec import JobSpec
from workers.execute import execute_run
from workers.fleet import describe

pytestmark = pytest.mark.slow

CALIBRATE = {
    "workload": {"model": "tiny"},
    "strategy": {
        "name": "calibrate",
        "world_size": 2,
        "options": {
            "ops": ["all_reduce", "all_gather", "reduce_scatter"],
            "max_bytes": 1 << 20,
            "iters": 2,
            "token_counts": [128, 512],
            "tp_degrees": [1, 2],
            "precisions": ["fp32"],
        },
    },
}


def test_a_calibrated_sweep_of_tiny_runs_and_ranks_its_prediction(tmp_path):
    settings = Settings(home=tmp_path, database_url=f"sqlite:///{tmp_path / 'parallab.db'}", max_world_size=2, sweep_steps=3)
    settings.ensure_home()
    upgrade(settings.sqlalchemy_url)
    # This test's own worker, registered as `parallab worker` does: not the process's cached one, which
    # an earlier test may have described on other settings and registered in another database.
    me = describe(settings)
    with session_scope(settings.sqlalchemy_url) as session:
        fleet.register(session=session, info=me)
        calibration = runs.submit_run(session=session, spec=JobSpec.model_validate(CALIBRATE), settings=settings, source="api").id
    assert execute_run(calibration, settings, me) == "succeeded"
    with session_scope(settings.sqlalchemy_url) as session:
        profile = hardware.latest_profile(session=session, pool=hardware.pool_of(settings))
        assert profile is not None and profile.world_size == 2 and profile.matmul
        request = sweeps.SweepRequest(
            workload={"model": "tiny"},
            world_size=2,
            top=2,
            controls=1,
            precisions=["fp32"],
            checkpointing=["none", "full"],
            accumulation=[1],
        )
        sweep = sweeps.create_sweep(session=session, settings=settings, request=request, source="api")
        run_ids = [c["run_id"] for c in sweep.candidates]
        assert sweep.hardware["calibrated"] and len(run_ids) == 3
    for run_id in run_ids:
        assert execute_run(run_id, settings, me) == "succeeded"
    app = create_app()
    app.dependency_overrides[get_settings] = lambda: settings
    with TestClient(app) as client:
        view = client.get(f"/api/v1/sweeps/{sweep.id}").json()
        page = client.get(f"/sweeps/{sweep.id}")
    assert view["status"] == "finished" and view["spearman"] is not None and -1 <= view["spearman"] <= 1
    assert all(p["status"] == "succeeded" and p["measured"]["tokens_per_s"] > 0 for p in view["points"])
    assert view["best"]["measured"]["tokens_per_s"] == max(p["measured"]["tokens_per_s"] for p in view["points"])
    assert page.status_code == 200 and "Spearman" in page.text
    run = client.get(f"/api/v1/runs/{run_ids[0]}").json()
    estimate = run["result"]["prediction"]["step_time_estimate"]
    assert estimate["calibrated"] is True, "the worker estimates with its pool's latest calibration"
    assert run["result"]["prediction"]["step_time_s"] == pytest.approx(view["points"][0]["predicted"]["step_time_s"])
