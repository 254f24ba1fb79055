"""CI uploads: scoped hashed tokens, idempotency, size limits, all-or-nothing validation."""

from __future__ import annotations

import copy

import pytest
from sqlalchemy import func, select

from backend.db import session_scope
from backend.models import ApiToken, CommMetric, RankMetric, Run
from backend.services.tokens import create_token

DOCUMENT = {
    "schema_version": 1,
    "name": "ci nightly ddp",
    "workload": {"model": "tiny", "hidden_size": 64, "num_layers": 4, "seq_len": 64, "global_batch_size": 8, "precision": "fp32"},
    "strategy": {"name": "ddp", "world_size": 2, "options": {}},
    "hardware": {"device": "cpu", "device_name": "x86_64"},
    "environment": {"torch": "2.13.0"},
    # consistent with its ranks: per step the slowest rank takes 0.4 s, then 0.41 s; 8 × 64 tokens a step
    "summary": {
        "tokens_per_s": 8 * 64 / 0.405,
        "step_time_s": {"median": 0.405, "p90": 0.409},
        "comm_bytes_per_step": {"all_reduce": 1000},
    },
    "ranks": [
        {
            "rank": r,
            "model_state_bytes": {"params": 100, "grads": 100, "optimizer": 200},
            "step_times_s": [0.4, 0.41],
            "comm": [{"op": "all_reduce", "count": 1, "bytes": 1000, "time_s": 0.01}],
        }
        for r in range(2)
    ],
    "loss": {"values": [5.5, 5.4], "reference": [5.5, 5.4]},
    "source": {"repository": "lab/model", "branch": "main", "commit": "abc123"},
}


def token(settings, *scopes: str) -> dict[str, str]:
    with session_scope(settings.sqlalchemy_url) as session:
        return {"Authorization": f"Bearer {create_token(session=session, name='ci', scopes=list(scopes))}"}


def count(settings, model) -> int:
    with session_scope(settings.sqlalchemy_url) as session:
        return session.execute(select(func.count()).select_from(model)).scalar_one()


def test_upload_stores_a_finished_run_with_rank_and_comm_rows(client, settings) -> None:
    response = client.post("/api/v1/results", json=DOCUMENT, headers=token(settings, "upload"))
    assert response.status_code == 201, response.text
    run = response.json()
    assert run["status"] == "succeeded" and run["source"] == "ci"
    assert run["tokens_per_s"] == pytest.approx(8 * 64 / 0.405)
    assert run["branch"] == "main" and run["commit"] == "abc123"
    assert run["result"]["ranks"][1]["rank"] == 1
    assert count(settings, RankMetric) == 2 and count(settings, CommMetric) == 2


def test_only_the_hash_of_a_token_is_stored(settings) -> None:
    plain = token(settings, "upload")["Authorization"].split()[1]
    with session_scope(settings.sqlalchemy_url) as session:
        stored = session.execute(select(ApiToken.token_hash)).scalar_one()
    assert plain not in stored and len(stored) == 64


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer plb_wrong"}, {"Authorization": "Basic abc"}])
def test_upload_without_a_valid_token_is_401(client, settings, headers) -> None:
    response = client.post("/api/v1/results", json=DOCUMENT, headers=headers)
    assert response.status_code == 401
    assert count(settings, Run) == 0


def test_upload_needs_the_upload_scope_even_in_local_mode(client, settings) -> None:
    assert settings.local_mode
    assert client.post("/api/v1/results", json=DOCUMENT).status_code == 401
    response = client.post("/api/v1/results", json=DOCUMENT, headers=token(settings, "submit"))
    assert response.status_code == 403 and "upload" in response.json()["detail"]
    assert client.post("/api/v1/results", json=DOCUMENT, headers=token(settings, "admin")).status_code == 201


def test_idempotency_key_returns_the_first_run(client, settings) -> None:
    headers = {**token(settings, "upload"), "Idempotency-Key": "ci-build-77"}
    first = client.post("/api/v1/results", json=DOCUMENT, headers=headers)
    again = client.post("/api/v1/results", json=DOCUMENT, headers=headers)
    assert first.status_code == 201 and again.status_code == 200
    assert first.json()["id"] == again.json()["id"]
    assert count(settings, Run) == 1


def test_invalid_document_is_422_naming_the_field_and_nothing_is_written(client, settings) -> None:
    bad = copy.deepcopy(DOCUMENT)
    bad["ranks"][1]["model_state_bytes"]["grads"] = -5
    response = client.post("/api/v1/results", json=bad, headers=token(settings, "upload"))
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", "ranks", 1, "model_state_bytes", "grads"]
    missing = {k: v for k, v in DOCUMENT.items() if k != "summary"}
    response = client.post("/api/v1/results", json=missing, headers=token(settings, "upload"))
    assert response.status_code == 422 and response.json()["detail"][0]["loc"] == ["body", "summary"]
    assert count(settings, Run) == 0 and count(settings, RankMetric) == 0


def test_oversized_upload_is_413(client, settings) -> None:
    settings.server.max_upload_bytes = 2048
    big = copy.deepcopy(DOCUMENT)
    big["environment"]["padding"] = "x" * 4096
    response = client.post("/api/v1/results", json=big, headers=token(settings, "upload"))
    assert response.status_code == 413
    assert count(settings, Run) == 0


def test_result_schema_is_published(client) -> None:
    schema = client.get("/api/v1/results/schema").json()
    assert {"schema_version", "workload", "strategy", "summary", "ranks"} <= set(schema["required"]) | set(schema["properties"])
    assert set(schema["required"]) >= {"workload", "strategy", "summary", "ranks"}


# ---- the stated summary is checked against the document's own ranks (parallab.core.checks) ----


def test_a_consistent_upload_is_stored_with_its_summary_completed_and_its_flags_recomputed(client, settings) -> None:
    doc = copy.deepcopy(DOCUMENT)
    doc["summary"]["tokens_per_s"] *= 1 + 1e-9  # float noise is not a disagreement
    doc["prediction"] = {"comm_bytes_per_step": {"all_reduce": 2000}}  # the measured 1000 is 50% off
    doc["flags"] = [{"metric": "made_up", "predicted": 1.0, "measured": 9.0, "rel_gap": 8.0}]
    response = client.post("/api/v1/results", json=doc, headers=token(settings, "upload"))
    assert response.status_code == 201, response.text
    stored = response.json()["result"]
    assert stored["summary"]["tokens_per_s"] == 8 * 64 / 0.405  # the recomputed value, not the stated one
    assert stored["summary"]["samples_per_s"] == pytest.approx(8 / 0.405)  # absent, filled in from the ranks
    assert stored["summary"]["final_loss"] == 5.4 and stored["summary"]["loss_max_rel_diff_vs_reference"] == 0.0
    assert [f["metric"] for f in stored["flags"]] == ["comm_bytes_per_step.all_reduce"]  # stated flags are not read


@pytest.mark.parametrize(
    ("change", "fields"),
    [
        ({"tokens_per_s": 8 * 64 / 0.405 * 1.01}, [["summary", "tokens_per_s"]]),
        ({"step_time_s": {"median": 0.41, "p90": 0.409}}, [["summary", "step_time_s", "median"]]),
        ({"comm_bytes_per_step": {"all_reduce": 900}}, [["summary", "comm_bytes_per_step", "all_reduce"]]),
        ({"comm_bytes_per_step": {"all_reduce": 1000, "broadcast": 8}}, [["summary", "comm_bytes_per_step", "broadcast"]]),
        ({"bubble_fraction": 0.2}, [["summary", "bubble_fraction"]]),  # no rank records a bubble
        ({"final_loss": 5.5, "peak_allocated_bytes_max": 10}, [["summary", "peak_allocated_bytes_max"], ["summary", "final_loss"]]),
    ],
)
def test_a_summary_that_disagrees_with_its_ranks_is_422_naming_each_field(client, settings, change, fields) -> None:
    doc = copy.deepcopy(DOCUMENT)
    doc["summary"].update(change)
    response = client.post("/api/v1/results", json=doc, headers=token(settings, "upload"))
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert sorted(d["loc"][1:] for d in detail) == sorted(fields)
    assert all(d["loc"][0] == "body" and "stated" in d["msg"] for d in detail)
    assert count(settings, Run) == 0 and count(settings, RankMetric) == 0


def test_a_workload_the_server_cannot_resolve_is_checked_from_its_batch_and_sequence(client, settings) -> None:
    doc = copy.deepcopy(DOCUMENT)
    doc["workload"] = {"model": "their-own-7b", "global_batch_size": 8, "seq_len": 64}
    doc["summary"]["model_flops_per_token"] = 42.0
    assert client.post("/api/v1/results", json=doc, headers=token(settings, "upload")).status_code == 201
    doc["summary"]["tokens_per_s"] *= 2
    response = client.post("/api/v1/results", json=doc, headers=token(settings, "upload"))
    assert response.status_code == 422 and response.json()["detail"][0]["loc"] == ["body", "summary", "tokens_per_s"]
