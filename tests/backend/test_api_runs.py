"""The REST API on SQLite and on Postgres: submit, validate, list, read, cancel, health."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from backend.db import session_scope
from backend.models import Run
from parallab.core.jobs import ResolvedJob, resolve_job
from parallab.core.spec import JobSpec

VALID = {"workload": {"model": "tiny", "steps": 3}, "strategy": {"name": "ddp", "world_size": 2}}


def run_count(url: str) -> int:
    with session_scope(url) as session:
        return session.execute(select(func.count()).select_from(Run)).scalar_one()


def test_healthz_and_openapi(client) -> None:
    assert client.get("/healthz").json() == {"status": "ok", "database": "ok", "broker": "ok"}
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/api/v1/runs", "/api/v1/runs/{run_id}", "/api/v1/results", "/api/v1/plan"} <= set(paths)


def test_submit_valid_spec_is_queued_with_resolved_spec(client, settings) -> None:
    response = client.post("/api/v1/runs", json=VALID)
    assert response.status_code == 202, response.text
    run = response.json()
    assert run["status"] == "queued"
    assert run["source"] == "api"
    assert run["strategy"] == "ddp" and run["world_size"] == 2
    # Defaults are filled in, so the stored spec is exactly what will run.
    assert run["spec"]["workload"]["hidden_size"] == 64
    assert run["spec"]["strategy"]["options"] == {"bucket_cap_mb": 25.0}
    assert client.get(f"/api/v1/runs/{run['id']}").json()["id"] == run["id"]
    assert run_count(settings.sqlalchemy_url) == 1


def stored(url: str, run_id: str) -> tuple[dict, dict | None, str]:
    """A run's stored spec, frozen job and status."""
    with session_scope(url) as session:
        run = session.get(Run, run_id)
        return run.spec, run.job, run.status


def test_the_resolved_job_is_frozen_at_submission_and_its_spec_resubmits_to_the_same_job(client, settings) -> None:
    raw = {"workload": {"model": "tiny", "steps": 3, "rope_theta": 500000}, "strategy": {"name": "pp", "world_size": 2}, "trace": True}
    run_id = client.post("/api/v1/runs", json=raw).json()["id"]
    spec, job, _ = stored(settings.sqlalchemy_url, run_id)
    frozen = ResolvedJob.model_validate(job)
    assert job == resolve_job(JobSpec.model_validate(raw)).model_dump(mode="json")
    assert frozen.options.microbatches == 4 and frozen.global_batch_size == 8 and frozen.model.rope_theta == 500000
    assert frozen.spec.model_dump(mode="json") == spec, "the stored spec is the frozen job's spec"
    again = client.post("/api/v1/runs", json=spec)
    assert again.status_code == 202, again.text
    assert stored(settings.sqlalchemy_url, again.json()["id"])[1] == job


def test_an_unreachable_queue_is_503_and_the_run_is_failed_not_left_queued(client, settings) -> None:
    settings.broker.broker_url = f"sqla+sqlite:///{settings.resolved_home}/no-such-dir/broker.db"  # the transport cannot open it
    response = client.post("/api/v1/runs", json=VALID)
    assert response.status_code == 503 and "queue" in response.json()["detail"]
    with session_scope(settings.sqlalchemy_url) as session:
        runs = session.execute(select(Run)).scalars().all()
        assert [(r.status, "could not reach the job queue" in r.error) for r in runs] == [("failed", True)]


@pytest.mark.parametrize(
    ("spec", "loc", "words"),
    [
        ({"strategy": {"name": "warp", "world_size": 2}}, ["body", "strategy", "name"], "single"),
        ({"strategy": {"name": "ddp", "world_size": 64}}, ["body", "strategy", "world_size"], "limit of 4"),
        ({"workload": {"steps": 0}, "strategy": {"name": "ddp", "world_size": 2}}, ["body", "workload", "steps"], "greater than"),
        ({"workload": {"steps": -3}, "strategy": {"name": "ddp", "world_size": 2}}, ["body", "workload", "steps"], "greater than"),
        ({"workload": {"model": "gpt5"}, "strategy": {"name": "ddp", "world_size": 2}}, ["body", "workload", "model"], "unknown model"),
        (
            {"workload": {"num_heads": 3, "hidden_size": 66}, "strategy": {"name": "tp", "world_size": 2}},
            ["body", "workload", "num_heads"],
            "not divisible by 2",
        ),
        ({"workload": {"num_layers": 3}, "strategy": {"name": "pp", "world_size": 2}}, ["body", "workload", "num_layers"], "layers (3)"),
        (
            {"strategy": {"name": "pp", "world_size": 4, "options": {"microbatches": 2}}},
            ["body", "strategy", "options", "microbatches"],
            "at least pp=4 stages",
        ),
        (
            {"strategy": {"name": "pp", "world_size": 2, "options": {"schedule": "interleaved_1f1b", "virtual_stages": 4}}},
            ["body", "workload", "num_layers"],
            "layers (4) is not divisible by 8 stages (pp=2 × virtual_stages=4)",
        ),
        (
            {"strategy": {"name": "layout", "world_size": 2, "options": {"pp": 2, "schedule": "1f1b", "virtual_stages": 2}}},
            ["body", "strategy", "options", "virtual_stages"],
            "schedule 1f1b runs 1 stage(s) per rank, not virtual_stages=2",
        ),
        (
            {"strategy": {"name": "pp", "world_size": 2, "options": {"schedule": "looped_bfs"}}},
            ["body", "strategy", "options", "schedule"],
            "interleaved_1f1b",
        ),
        ({"workload": {"seq_len": 66}, "strategy": {"name": "ring", "world_size": 4}}, ["body", "workload", "seq_len"], "sequence length"),
        (
            {"workload": {"num_experts": 3}, "strategy": {"name": "moe", "world_size": 2}},
            ["body", "workload", "num_experts"],
            "experts (3)",
        ),
        ({"strategy": {"name": "hybrid", "world_size": 4, "options": {"tp": 3}}}, ["body", "strategy", "options", "tp"], "world size 4"),
        (
            {"strategy": {"name": "layout", "world_size": 4, "options": {"pp": 2, "dp_shard": 2, "tp": 2}}},
            ["body", "strategy", "options"],
            "pp=2 × dp_shard=2 × tp=2 make 8 ranks, not the world size 4",
        ),
        (
            {"strategy": {"name": "layout", "world_size": 2, "options": {"ep": 2}}},
            ["body", "workload", "num_experts"],
            "ep=2 needs a model with experts",
        ),
        (
            {"strategy": {"name": "ddp", "world_size": 2, "options": {"bucket": 1}}},
            ["body", "strategy", "options"],
            "unknown option 'bucket'; valid: bucket_cap_mb",
        ),
        (
            {"workload": {"data": "words"}, "strategy": {"name": "ddp", "world_size": 2}},
            ["body", "workload", "data"],
            "Input should be 'random' or 'text'",
        ),
        (
            {"workload": {"data": "text", "vocab_size": 64}, "strategy": {"name": "ddp", "world_size": 2}},
            ["body", "workload", "data"],
            "it needs vocab_size ≥ 128, not 64",
        ),
        (
            {"workload": {"stepz": 3}, "strategy": {"name": "ddp", "world_size": 2}},
            ["body", "workload"],
            "unknown workload field 'stepz'; valid: ",
        ),
        (
            {"strategi": {"name": "ddp", "world_size": 2}},
            ["body"],
            "unknown job spec field 'strategi'; valid: name, placement, repeat, repeats, strategy, tags, trace, workload; "
            "did you mean 'strategy'?",
        ),
        (
            {"strategy": {"nam": "ddp", "world_size": 2}},
            ["body", "strategy"],
            "unknown strategy field 'nam'; valid: name, options, world_size; did you mean 'name'?",
        ),
        (
            {"strategy": {"name": "ddp", "world_size": 2}, "placement": {"pol": "cpu"}},
            ["body", "placement"],
            "unknown placement field 'pol'; valid: nodes, order, pool; did you mean 'pool'?",
        ),
        (
            {"strategy": {"name": "hybrid", "world_size": 4, "options": {"tp": 2}}, "placement": {"nodes": 2, "order": "tp-outside"}},
            ["body", "placement", "order"],
            "Input should be 'inner-first' or 'across'",
        ),
        (
            {"strategy": {"name": "ddp", "world_size": 2}, "repeat": {"group": "ab", "index": 1, "off": 2}},
            ["body", "repeat"],
            "unknown repeat field 'off'; valid: group, index, of; did you mean 'of'?",
        ),
    ],
)
def test_bad_spec_is_422_naming_the_field_and_nothing_is_stored(client, settings, spec, loc, words) -> None:
    response = client.post("/api/v1/runs", json=spec)
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    matching = [d for d in detail if d["loc"] == loc]
    assert matching, f"no error at {loc}: {detail}"
    assert words in matching[0]["msg"]
    assert run_count(settings.sqlalchemy_url) == 0


def test_list_runs_pages_with_a_cursor(client) -> None:
    ids = [client.post("/api/v1/runs", json=VALID).json()["id"] for _ in range(5)]
    first = client.get("/api/v1/runs", params={"limit": 2}).json()
    assert [r["id"] for r in first["items"]] == ids[::-1][:2]
    assert first["next_cursor"]
    seen = [r["id"] for r in first["items"]]
    cursor = first["next_cursor"]
    while cursor:
        page = client.get("/api/v1/runs", params={"limit": 2, "cursor": cursor}).json()
        seen += [r["id"] for r in page["items"]]
        cursor = page["next_cursor"]
    assert seen == ids[::-1]
    assert client.get("/api/v1/runs", params={"cursor": "garbage"}).status_code == 422
    assert client.get("/api/v1/runs", params={"status": "succeeded"}).json()["items"] == []


def test_cancel_a_queued_run_and_not_twice(client) -> None:
    run_id = client.post("/api/v1/runs", json=VALID).json()["id"]
    cancelled = client.post(f"/api/v1/runs/{run_id}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert client.post(f"/api/v1/runs/{run_id}/cancel").status_code == 409
    assert client.get("/api/v1/runs/nope").status_code == 404


def test_trace_of_a_run_without_one_is_404(client) -> None:
    run_id = client.post("/api/v1/runs", json=VALID).json()["id"]
    response = client.get(f"/api/v1/runs/{run_id}/trace")
    assert response.status_code == 404 and "trace" in response.json()["detail"]


def test_outside_local_mode_submitting_needs_a_token(client, settings) -> None:
    settings.server.host, settings.security.secret_key = "0.0.0.0", "a-real-secret"
    assert client.post("/api/v1/runs", json=VALID).status_code == 401
    assert run_count(settings.sqlalchemy_url) == 0


def test_plan_endpoint_predicts_sharded_state(client) -> None:
    ddp = client.get("/api/v1/plan", params={"strategy": "ddp", "world_size": 4}).json()["prediction"]
    fsdp = client.get("/api/v1/plan", params={"strategy": "fsdp", "world_size": 4}).json()["prediction"]
    assert fsdp["model_state_bytes_per_rank"]["params"] * 4 == pytest.approx(ddp["model_state_bytes_per_rank"]["params"], rel=0.02)
    bad = client.get("/api/v1/plan", params={"strategy": "tp", "world_size": 3})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "workload", "num_heads"]


def test_placeholder_secret_is_refused_beyond_loopback() -> None:
    from backend.config import Settings

    Settings(host="127.0.0.1").check_secrets()  # local mode: fine
    Settings(host="0.0.0.0", secret_key="s3cr3t-from-vault").check_secrets()
    with pytest.raises(ValueError, match="PARALLAB_SECRET_KEY"):
        Settings(host="0.0.0.0").check_secrets()


def test_default_global_batch_rounds_up_to_split_evenly_but_an_explicit_one_is_checked(client) -> None:
    three = {"workload": {"model": "tiny", "steps": 3}, "strategy": {"name": "ddp", "world_size": 3}}
    response = client.post("/api/v1/runs", json=three)
    assert response.status_code == 202, response.text
    assert response.json()["spec"]["workload"]["global_batch_size"] == 9
    explicit = {**three, "workload": {"model": "tiny", "steps": 3, "global_batch_size": 8}}
    response = client.post("/api/v1/runs", json=explicit)
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", "workload", "global_batch_size"]
