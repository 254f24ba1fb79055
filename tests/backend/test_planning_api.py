"""Issue 14 through the API, on SQLite and Postgres: hardware profiles from calibrate results, the
precision check at submission, the ranking mode of /plan, and sweeps (create, view, cancel)."""

from __future__ import annotations

import pytest

from backend.db import session_scope
from backend.models import Run
from backend.services.hardware import pool_of
from backend.services.ingest import attach_result
from backend.services.sweeps import choose
from parallab.core.hardware import DeviceDescription, HardwareProfile, MatmulPoint
from parallab.core.planner import spearman
from parallab.core.result import ResultDocument
from tests.ui.factories import make_document

CPU = DeviceDescription(kind="cpu", name="Intel(R) Xeon(R) Processor", memory_bytes=16 << 30)


def calibrate_document(world_size: int = 2) -> ResultDocument:
    """What a calibrate run's ranks report (a small profile: the planner interpolates)."""
    profile = HardwareProfile(
        device=CPU,
        world_size=world_size,
        matmul=[
            MatmulPoint(precision=p, m=m, n=64, k=64, flops_per_s=f * m) for p, f in (("fp32", 1e7), ("bf16", 2e7)) for m in (64, 4096)
        ],
        memory_bandwidth=5e9,
        op_overhead_s=2e-6,
    )
    doc = make_document(strategy="ddp", world_size=world_size).model_dump(mode="json")
    doc.update(strategy={"name": "calibrate", "world_size": world_size, "options": {}}, calibration=profile.model_dump(mode="json"))
    doc["hardware"] = {"device": "cpu", "device_name": CPU.name}
    return ResultDocument.model_validate(doc)


def store_calibration(settings, pool: str) -> str:
    with session_scope(settings.sqlalchemy_url) as session:
        run = Run(status="running", source="api", spec={}, strategy="calibrate", world_size=2, model="tiny")
        session.add(run)
        session.flush()
        attach_result(session, run=run, document=calibrate_document(), pool=pool)
        return run.id


def test_a_calibration_is_kept_for_its_pool_and_fp8_is_refused_there_with_the_devices_reason(client, settings):
    spec = {"workload": {"model": "tiny", "steps": 2, "precision": "fp8"}, "strategy": {"name": "ddp", "world_size": 2}}
    assert client.post("/api/v1/runs", json=spec).status_code == 202, "no calibration yet: the device is not known at submission"
    pool = pool_of(settings)  # the pool the job is placed on (no worker registered: the default)
    store_calibration(settings, pool)
    refused = client.post("/api/v1/runs", json=spec)
    assert refused.status_code == 422
    (detail,) = refused.json()["detail"]
    assert detail["loc"] == ["body", "workload", "precision"]
    assert f"pool '{pool}'" in detail["msg"] and "no CUDA device here (Intel(R) Xeon(R) Processor)" in detail["msg"]
    assert client.post("/api/v1/runs", json={**spec, "workload": {**spec["workload"], "precision": "bf16"}}).status_code == 202
    ranked = client.get("/api/v1/plan", params={"mode": "rank", "model": "tiny"}).json()
    assert "calibrated on 2 rank(s)" in ranked["hardware"]
    assert ranked["fitting"] > 0 and all(row["precision"] != "fp8" for row in ranked["fits"])


def test_plan_rank_mode_lists_what_fits_and_why_the_rest_do_not(client):
    body = client.get(
        "/api/v1/plan", params={"mode": "rank", "model": "llama-8b", "device": "h100", "nodes": 2, "gpus_per_node": 8, "top": 5}
    ).json()
    assert body["world_size"] == 16 and len(body["fits"]) == 5 and body["fitting"] > 5
    first = body["fits"][0]
    assert set(first["mesh"]) == {"dp", "tp", "pp", "cp", "ep"} and first["tokens_per_s"] > 0 and first["memory_per_rank_bytes"] > 0
    assert "memory" in {g["field"] for g in body["rejected_by_reason"]}
    assert body["invalid"] > 0 and "workload.global_batch_size" in {g["field"] for g in body["invalid_by_reason"]}
    assert "workload.global_batch_size" not in {g["field"] for g in body["rejected_by_reason"]}  # not a misfit
    assert all(row["reasons"] for row in body["rejected"])
    narrowed = client.get(
        "/api/v1/plan",
        params={
            "mode": "rank",
            "model": "llama-8b",
            "device": "h100",
            "nodes": 2,
            "precisions": "bf16",
            "checkpointing": "full",
            "accumulation": 1,
        },
    ).json()
    assert {(r["precision"], r["activation_checkpointing"], r["grad_accumulation_steps"]) for r in narrowed["fits"]} == {
        ("bf16", "full", 1)
    }
    assert client.get("/api/v1/plan", params={"mode": "rank", "device": "h900"}).json()["detail"][0]["loc"] == ["query", "device"]


def sweep(client, **overrides):
    body = {
        "workload": {"model": "tiny"},
        "world_size": 2,
        "top": 3,
        "controls": 1,
        "steps": 2,
        "precisions": ["fp32"],
        "accumulation": [1],
    }
    return client.post("/api/v1/sweeps", json={**body, **overrides})


def test_a_sweep_queues_the_top_predicted_and_controls_as_one_group(client, settings):
    response = sweep(client)
    assert response.status_code == 202, response.text
    view = response.json()
    roles = [p["role"] for p in view["points"]]
    assert roles == ["top", "top", "top", "control"] and view["status"] == "running" and view["planned"] > 4
    predicted = [p["predicted"]["tokens_per_s"] for p in view["points"]]
    assert predicted[:3] == sorted(predicted[:3], reverse=True) and predicted[3] <= predicted[2]
    assert [p["predicted_rank"] for p in view["points"]][:3] == [1, 2, 3]
    with session_scope(settings.sqlalchemy_url) as session:
        runs = [session.get(Run, p["run_id"]) for p in view["points"]]
        assert all(r.status == "queued" and r.sweep_id == view["id"] for r in runs)
        assert all(r.precision == "fp32" and r.micro_batch_size for r in runs)
        assert all(r.spec["workload"]["steps"] == 2 for r in runs)
    assert client.get(f"/api/v1/sweeps/{view['id']}").json()["points"] == view["points"]
    assert view["id"] in [s["id"] for s in client.get("/api/v1/sweeps").json()["items"]]


@pytest.mark.parametrize(
    ("top", "controls", "ranks"),
    [
        (4, 4, [1, 2, 3, 4, 8, 12, 16, 20]),  # spread evenly below the top, the last the lowest
        (4, 1, [1, 2, 3, 4, 20]),  # one control: the lowest predicted that fits
        (4, 0, [1, 2, 3, 4]),
        (18, 5, list(range(1, 21))),  # more controls than configurations left: all of them, once
        (4, 16, list(range(1, 21))),
    ],
)
def test_controls_are_spread_down_the_ranking_to_its_lowest(top: int, controls: int, ranks: list[int]) -> None:
    fits = [f"configuration {i + 1}" for i in range(20)]  # in predicted order, best first
    chosen = choose(fits, top=top, controls=controls)  # type: ignore[arg-type]
    assert [rank for _, rank, _ in chosen] == ranks
    assert [row for _, _, row in chosen] == [fits[r - 1] for r in ranks]
    assert [role for role, _, _ in chosen] == ["top"] * min(top, 20) + ["control"] * (len(ranks) - min(top, 20))


def test_a_sweep_holds_measured_against_predicted_and_marks_an_oom_the_prediction_let_through(client, settings):
    view = sweep(client, top=3, controls=1).json()
    points = view["points"]
    measured = [9_000.0, 12_000.0, 4_000.0]  # the prediction's #1 is second, #2 first
    with session_scope(settings.sqlalchemy_url) as session:
        for point, tps in zip(points[:3], measured, strict=True):
            run = session.get(Run, point["run_id"])
            attach_result(session, run=run, document=make_document(strategy=point["strategy"], world_size=2, tokens_per_s=tps))
        oom = session.get(Run, points[3]["run_id"])
        oom.status, oom.error = "failed", "training process failed: killed by signal 9\n--- log tail ---\nOut of memory"
    done = client.get(f"/api/v1/sweeps/{view['id']}").json()
    expected = spearman([p["predicted"]["tokens_per_s"] for p in points[:3]], measured)
    assert done["spearman"] == pytest.approx(expected)
    assert done["best"]["run_id"] == points[1]["run_id"] and done["best"]["measured"]["tokens_per_s"] == 12_000.0
    assert [p["out_of_memory"] for p in done["points"]] == [False, False, False, True]
    assert done["status"] == "finished"


def test_a_sweep_is_cancelled_as_a_whole(client, settings):
    view = sweep(client).json()
    with session_scope(settings.sqlalchemy_url) as session:
        session.get(Run, view["points"][0]["run_id"]).status = "running"
    cancelled = client.post(f"/api/v1/sweeps/{view['id']}/cancel").json()
    assert cancelled["status"] == "cancelled"
    with session_scope(settings.sqlalchemy_url) as session:
        runs = [session.get(Run, p["run_id"]) for p in view["points"]]
        assert runs[0].status == "running" and runs[0].cancel_requested, "a running run is asked to stop; its worker kills it"
        assert all(r.status == "cancelled" for r in runs[1:])
    assert client.post("/api/v1/sweeps/nope/cancel").status_code == 404


def test_a_sweep_that_cannot_run_is_422_naming_why(client):
    too_wide = sweep(client, world_size=8)
    assert too_wide.status_code == 422 and too_wide.json()["detail"][0]["loc"] == ["body", "world_size"]
    nothing = sweep(client, workload={"model": "llama-8b"})
    assert nothing.status_code == 422 and "no configuration fits" in nothing.json()["detail"][0]["msg"]
    assert sweep(client, top=0).status_code == 422
    misspelt = sweep(client, contrlos=1)
    assert misspelt.status_code == 422 and misspelt.json()["detail"][0]["loc"] == ["body"]
    msg = misspelt.json()["detail"][0]["msg"]
    assert "unknown sweep field 'contrlos'; valid: accumulation, checkpointing, controls," in msg and "did you mean 'controls'?" in msg
    assert client.get("/api/v1/sweeps/nope").status_code == 404
