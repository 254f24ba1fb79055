"""Uploads verified or labelled: altered documents against the server's recomputation.

Each case starts from a worker-like document (`make_document`, consistent with itself) and alters
one thing as a person fooling the checks would. What the ranks record is recomputed and a
disagreement refused (422 naming the field); the loss reference comes from the lab's own store when
it has one; what no rank records (gradient and replica checks) is stored as stated by the uploader
and shown so.
"""

from __future__ import annotations

from typing import Any

import pytest

from backend.db import session_scope
from backend.services.tokens import create_token
from backend.store import references as references_store
from parallab.core.checks import reference_key_of
from parallab.core.result import ResultDocument
from tests.ui.factories import make_document


@pytest.fixture
def upload(client, settings):
    with session_scope(settings.sqlalchemy_url) as session:
        headers = {"Authorization": f"Bearer {create_token(session=session, name='ci', scopes=['upload'])}"}
    return lambda doc: client.post("/api/v1/results", json=doc, headers=headers)


def document() -> dict[str, Any]:
    return make_document(strategy="ddp", world_size=2, tokens_per_s=12_000.0).model_dump(mode="json")


def refused_at(response) -> list[str]:
    assert response.status_code == 422, response.text
    return [".".join(str(x) for x in p["loc"]).removeprefix("body.") for p in response.json()["detail"]]


def test_the_unaltered_document_is_stored(upload) -> None:
    assert upload(document()).status_code == 201


def test_plus_20_percent_tokens_per_s_and_rank_comm_bytes_are_refused(upload) -> None:
    doc = document()
    doc["summary"]["tokens_per_s"] *= 1.2
    doc["ranks"][0]["comm"][0]["bytes"] = int(doc["ranks"][0]["comm"][0]["bytes"] * 1.2)
    fields = refused_at(upload(doc))
    assert "summary.tokens_per_s" in fields and "ranks.0.comm.0.algbw_gbps" in fields


def test_one_ranks_comm_bytes_at_minus_20_percent_below_the_max_are_refused(upload) -> None:
    doc = document()
    doc["ranks"][1]["comm"][0]["bytes"] = int(doc["ranks"][1]["comm"][0]["bytes"] * 0.8)
    assert max(r["comm"][0]["bytes"] for r in doc["ranks"]) == doc["summary"]["comm_bytes_per_step"][doc["ranks"][0]["comm"][0]["op"]]
    assert {"ranks.1.comm.0.algbw_gbps", "ranks.1.comm.0.wire_bytes"} <= set(refused_at(upload(doc)))


def test_a_ranks_comm_time_at_plus_20_percent_is_refused(upload) -> None:
    doc = document()
    doc["ranks"][1]["comm"][0]["time_s"] *= 1.2
    assert refused_at(upload(doc)) == ["ranks.1.comm.0.algbw_gbps"]


def test_a_ranks_comm_fraction_below_its_exposed_comm_is_refused(upload) -> None:
    doc = document()
    split = doc["ranks"][0]["step_time_breakdown"]
    doc["ranks"][0]["comm_time_fraction"] = 0.5 * split["exposed_comm_s"] / split["step_s"]
    assert "ranks.0.comm_time_fraction" in refused_at(upload(doc))


def add_lab_reference(settings, doc: dict[str, Any], curve: list[float]) -> None:
    key = reference_key_of(ResultDocument.model_validate(doc))
    assert key is not None, "the factory's workload resolves"
    with session_scope(settings.sqlalchemy_url) as session:
        references_store.add_curve(session, key=key, device="cpu", model="tiny", seed=0, workload={}, loss=curve, run_id=None)


def test_a_loss_reference_replaced_by_the_runs_own_loss_is_refused_against_the_labs_curve(upload, settings) -> None:
    doc = document()
    add_lab_reference(settings, doc, list(doc["loss"]["reference"]))
    doc["loss"]["reference"] = list(doc["loss"]["values"])
    doc["summary"]["loss_max_rel_diff_vs_reference"] = 0.0
    assert refused_at(upload(doc)) == ["summary.loss_max_rel_diff_vs_reference"]


def test_the_labs_reference_replaces_the_stated_one_and_only_then_is_it_not_labelled(upload, settings) -> None:
    doc = document()
    stated = upload(doc).json()["result"]
    assert stated["loss"]["reference_source"] is None and "loss_reference" in stated["summary"]["checks_stated"]
    add_lab_reference(settings, doc, list(doc["loss"]["reference"]))
    doc["name"] = "again"
    stored = upload(doc).json()["result"]
    assert stored["loss"]["reference_source"] == "lab database" and stored["loss"]["reference"] == doc["loss"]["reference"]
    assert "loss_reference" not in stored["summary"]["checks_stated"]


def test_a_failed_gradient_check_rewritten_as_passed_is_stored_as_stated_by_the_uploader(upload, client) -> None:
    doc = document()
    doc["summary"]["gradient_check"].update(passed=True, max_rel_err=1e-6)  # the lab measured 0.7: failed
    response = upload(doc)
    assert response.status_code == 201, response.text
    run = response.json()
    assert run["result"]["summary"]["checks_stated"] == ["gradient_check", "replica_check", "frozen_check", "loss_reference"]
    page = client.get(f"/runs/{run['id']}")
    assert page.status_code == 200
    card = page.text[page.text.index('id="gradient-check"') :]
    assert "stated by the uploader" in card[: card.index("</h2>")]


def test_an_uploaded_checks_stated_is_never_trusted(upload) -> None:
    doc = document()
    doc["summary"]["checks_stated"] = []
    doc["summary"].pop("gradient_check")
    doc["summary"]["replica_check"] = {"passed": True, "tolerance": 1e-5, "max_rel_diff": 0.0, "copies_compared": 39}
    assert upload(doc).json()["result"]["summary"]["checks_stated"] == ["replica_check", "frozen_check", "loss_reference"]


def test_a_loss_drift_of_1e_3_in_one_upload_is_a_loss_flag_on_its_page_in_compare_and_on_the_leaderboard(upload, client) -> None:
    clean = document()
    clean["loss"]["values"] = list(clean["loss"]["reference"])
    clean["summary"].update(loss_max_rel_diff_vs_reference=0.0, final_loss=clean["loss"]["values"][-1])
    drifted = {**clean, "name": "drifted", "loss": {**clean["loss"], "values": list(clean["loss"]["values"])}}
    drifted["loss"]["values"][3] *= 1 + 1e-3
    drifted["summary"] = {
        **clean["summary"],
        "loss_max_rel_diff_vs_reference": abs(drifted["loss"]["values"][3] / clean["loss"]["values"][3] - 1),
    }
    ok, bad = upload(clean).json(), upload(drifted).json()
    assert "loss_max_rel_diff_vs_reference" in [f["metric"] for f in bad["result"]["flags"]]
    assert "loss_max_rel_diff_vs_reference" not in [f["metric"] for f in ok["result"]["flags"]]
    assert 'id="stat-loss" data-flagged="true"' in client.get(f"/runs/{bad['id']}").text
    assert 'id="stat-loss" data-flagged="false"' in client.get(f"/runs/{ok['id']}").text
    compare = client.get(f"/compare?ids={ok['id']},{bad['id']}").text
    assert "beyond the recipe&#39;s tolerance ⚑" in compare or "beyond the recipe's tolerance ⚑" in compare
    board = client.get("/leaderboard?runs=all").text
    assert board.count('data-loss-flagged="true"') == 1 and 'data-loss-flagged="false"' in board


def test_an_untraced_run_has_no_byte_flag_and_its_page_says_what_was_not_measured(upload, client) -> None:
    doc = document()
    for rank in doc["ranks"]:
        rank.update(profiled_steps=0, comm=[], comm_time_fraction=None, exposed_comm_time_s=None, step_time_breakdown=None)
    for field in ("comm_bytes_per_step", "wire_bytes_per_step"):
        doc["summary"][field] = {}
    doc["summary"].update(comm_time_fraction=None, exposed_comm_fraction=None)
    assert doc["prediction"]["comm_bytes_per_step"], "a prediction of bytes nobody measured"
    run = upload(doc).json()
    assert not [f for f in run["result"]["flags"] if f["metric"].startswith(("comm_bytes", "wire_bytes"))]
    assert "comm_bytes_per_step" in run["result"]["summary"]["not_measured"]
    page = client.get(f"/runs/{run['id']}").text
    assert 'id="not-measured"' in page and "comm_bytes_per_step" in page[page.index('id="not-measured"') :][:400]


def test_a_pipelines_bubble_is_recomputed_from_its_stages_actions_and_shown_with_its_imbalance(upload, client) -> None:
    doc = make_document(strategy="pp", world_size=2, tokens_per_s=12_000.0).model_dump(mode="json")
    # GPipe, m = 4, unit actions: each stage idles 1 of 5 slots within the step's window
    stage0 = [(float(i), i + 1.0) for i in range(4)] + [(float(6 + i), 7.0 + i) for i in range(4)]
    stage1 = [(float(1 + i), 2.0 + i) for i in range(4)] + [(float(5 + i), 6.0 + i) for i in range(4)]
    for rank, actions in zip(doc["ranks"], (stage0, stage1), strict=True):
        rank["pipeline_actions_us"] = [actions]
    doc["summary"].update(bubble_fraction=0.3)  # stated as the worst stage, not what the stages give
    assert "summary.bubble_fraction" in refused_at(upload(doc))
    doc["summary"].update(bubble_fraction=0.2, bubble_per_stage=[0.2, 0.2], stage_imbalance=0.0)
    run = upload(doc).json()
    assert run["result"]["summary"]["bubble_per_stage"] == [0.2, 0.2]
    page = client.get(f"/runs/{run['id']}").text
    assert 'id="pipeline-bubble"' in page and "Stage imbalance" in page
