"""Exact gates through the API: each deterministic counter's change named with its size in the upload's
answer, an accepted change no longer reported, another config never compared, the accept route's
owner check and refusals."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from parallab.core import counters as exact
from tests.backend.ci_documents import document, slowed
from tests.backend.test_series import member, upload


def with_counters(doc: dict[str, Any]) -> dict[str, Any]:
    """`doc` with every kind of counter: a group size, traced activations, pipeline actions, a parameter count."""
    out = copy.deepcopy(doc)
    for rank in out["ranks"]:
        rank["comm"][0]["group_size"] = 2
        rank["memory_breakdown"] = {"activations": 4096}
        rank["pipeline_actions_us"] = [[[0.0, 1.0], [1.0, 2.0]], [[3.0, 4.0], [4.0, 5.0]]]
    out["prediction"] = {"params_total": 1234, "activation_bytes_per_rank": 5000}
    return out


def all_reduce_bytes(doc: dict[str, Any], size: int) -> None:
    """Every rank's all-reduce moves `size` bytes a step (the summary says so too: uploads are checked)."""
    for rank in doc["ranks"]:
        rank["comm"][0]["bytes"] = size
    doc["summary"]["comm_bytes_per_step"]["all_reduce"] = size


def _bytes(doc: dict[str, Any]) -> None:
    all_reduce_bytes(doc, 1500)  # bucket_cap_mb changed: the all-reduce moves more


def _calls(doc: dict[str, Any]) -> None:
    for rank in doc["ranks"]:
        rank["comm"][0]["count"] = 2


def _new_collective(doc: dict[str, Any]) -> None:
    for rank in doc["ranks"]:  # a commit adds an all-gather on the same group
        rank["comm"].append({"op": "all_gather", "count": 3, "bytes": 600, "time_s": 0.001, "group_size": 2})
    doc["summary"]["comm_bytes_per_step"]["all_gather"] = 600


def _state(doc: dict[str, Any]) -> None:
    doc["ranks"][0]["model_state_bytes"]["optimizer"] = 400


def _activations(doc: dict[str, Any]) -> None:
    doc["ranks"][1]["memory_breakdown"]["activations"] = 8192


def _predicted(doc: dict[str, Any]) -> None:
    doc["prediction"]["activation_bytes_per_rank"] = 6000


def _params(doc: dict[str, Any]) -> None:
    doc["prediction"]["params_total"] = 1300


def _pipeline(doc: dict[str, Any]) -> None:
    doc["ranks"][0]["pipeline_actions_us"] = [[[0.0, 1.0], [1.0, 2.0], [2.0, 3.0]]] * 2


CASES: list[tuple[Callable[[dict[str, Any]], None], str, str, float, float]] = [
    (_bytes, "comm.all_reduce.g2.bytes", "bytes", 2000, 3000),
    (_calls, "comm.all_reduce.g2.calls", "calls", 2, 4),
    (_new_collective, "comm.all_gather.g2.bytes", "bytes", 0, 1200),
    (_state, "state.r0.optimizer", "memory", 200, 400),
    (_activations, "activations.r1", "memory", 4096, 8192),
    (_predicted, "activations.predicted", "memory", 5000, 6000),
    (_params, "params.count", "params", 1234, 1300),
    (_pipeline, "pipeline.r0.actions", "pipeline", 2, 3),
]


@pytest.mark.parametrize(("change", "counter", "category", "old", "new"), CASES, ids=[c[1] + ":" + c[0].__name__ for c in CASES])
def test_each_counter_change_is_named_with_its_size(change, counter, category, old, new) -> None:
    base = with_counters(document())
    changed = copy.deepcopy(base)
    change(changed)
    found = exact.diff(exact.counters(base), exact.counters(changed))
    assert [(c.counter, c.category, c.old, c.new) for c in found if c.counter == counter] == [(counter, category, old, new)]
    others = [c.counter for c in found if c.counter != counter]
    assert others in ([], ["comm.all_gather.g2.calls"]), others
    assert exact.diff(exact.counters(base), exact.counters(slowed(base, 1.7))) == [], "timings are not counters"


def test_an_upload_reports_a_planted_change_and_an_accepted_one_no_more(client, settings) -> None:
    ada = member(settings, "ada@lab.org")
    first = upload(client, ada, with_counters(document(commit="aaaa001")))
    assert first["changes"] == [] and first["changed"] is False
    same = upload(client, ada, slowed(with_counters(document(commit="aaaa002")), 1.3))
    assert same["changes"] == [] and same["changed"] is False, "a slower run moves no counter"
    planted = with_counters(document(commit="aaaa003"))
    _bytes(planted)
    third = upload(client, ada, planted)
    assert third["changed"] is True
    assert [(c["counter"], c["old"], c["new"], c["delta"], c["change_pct"], c["accepted"]) for c in third["changes"]] == [
        ("comm.all_reduce.g2.bytes", 2000, 3000, 1000, 50.0, False)
    ]
    sid = third["series_id"]
    report = client.get(f"/api/v1/series/{sid}/report").json()
    assert report["changed"] is True and report["exact"]["changes"][0]["counter"] == "comm.all_reduce.g2.bytes"
    accepted = client.post(f"/api/v1/series/{sid}/accept", json={"metric": "bytes"}, headers=ada)
    assert accepted.status_code == 200, accepted.text
    assert [(c["counter"], c["accepted"]) for c in accepted.json()["accepted"]] == [("comm.all_reduce.g2.bytes", True)]
    assert client.get(f"/api/v1/series/{sid}/report").json()["changed"] is False, "an accepted change is no longer reported"
    # a pull request changes it again: reported against main's latest; accepted on the branch's
    # series, the same value is not reported when it lands on main (accepted for the family)
    again = with_counters(document(branch="feature/bucket", commit="bbbb001"))
    all_reduce_bytes(again, 1700)
    pr = upload(client, ada, again)
    assert [(c["old"], c["new"], c["accepted"]) for c in pr["changes"]] == [(3000, 3400, False)] and pr["changed"] is True
    assert (
        client.post(f"/api/v1/series/{pr['series_id']}/accept", json={"metric": "comm.all_reduce.g2.bytes"}, headers=ada).status_code == 200
    )
    merged = with_counters(document(commit="aaaa004"))
    all_reduce_bytes(merged, 1700)
    landed = upload(client, ada, merged)
    assert landed["changes"][0]["accepted"] is True and landed["changed"] is False
    # a value nobody accepted is a new change
    other = with_counters(document(commit="aaaa005"))
    all_reduce_bytes(other, 1600)
    assert upload(client, ada, other)["changed"] is True


def test_an_upload_of_another_config_never_joins_the_comparison(client, settings) -> None:
    ada = member(settings, "ada@lab.org")
    first = upload(client, ada, with_counters(document(commit="cccc001")))
    wider = with_counters(document(commit="cccc002"))
    wider["strategy"]["options"] = {"bucket_cap_mb": 50}
    _bytes(wider)
    answer = upload(client, ada, wider)
    assert answer["changes"] == [] and answer["changed"] is False, "another config is compared with nothing"
    back = upload(client, ada, with_counters(document(commit="cccc003")))
    assert back["changes"] == [], "the original config is compared with its own last result, not the other config's"
    assert answer["series_id"] != first["series_id"] == back["series_id"]
    report = client.get(f"/api/v1/series/{first['series_id']}/report", headers=ada).json()
    assert [t["jobs"] for t in report["timing"]] == [2] * len(report["timing"]) and report["timing"], "nor the timing search"
    assert report["exact"]["baseline_run_id"] == first["id"]


def test_accept_is_refused_for_another_member_and_for_a_metric_that_did_not_change(client, settings) -> None:
    settings.security.allow_local_mode, settings.security.secret_key = False, "gates-test-secret"
    ada = member(settings, "ada@lab.org")
    bob = member(settings, "bob@lab.org")
    upload(client, ada, with_counters(document(commit="dddd001")))
    planted = with_counters(document(commit="dddd002"))
    _state(planted)
    sid = upload(client, ada, planted)["series_id"]
    assert client.post(f"/api/v1/series/{sid}/accept", json={"metric": "memory"}, headers=bob).status_code == 403
    refused = client.post(f"/api/v1/series/{sid}/accept", json={"metric": "bytes"}, headers=ada)
    assert refused.status_code == 422
    assert refused.json()["detail"][0]["loc"] == ["body", "metric"] and "state.r0.optimizer" in refused.json()["detail"][0]["msg"]
    missing = client.post(f"/api/v1/series/{sid}/accept", json={}, headers=ada)
    assert missing.status_code == 422 and "metric: is required" in missing.text
    assert client.post(f"/api/v1/series/{sid}/accept", json={"metric": "state.r0.optimizer"}, headers=ada).status_code == 200


def test_a_result_of_another_config_on_the_same_series_is_never_the_baseline(client, settings) -> None:
    """Should a result of another config ever land on a series (its key is not the config), the
    comparison still skips it: the baseline is the latest result of the same config."""
    from backend.db import session_scope
    from backend.models import Run, SeriesCounters

    ada = member(settings, "ada@lab.org")
    first = upload(client, ada, with_counters(document(commit="ffff001")))
    stranger = with_counters(document(commit="ffff002"))
    stranger["strategy"]["options"] = {"bucket_cap_mb": 50}
    _bytes(stranger)
    other = upload(client, ada, stranger)
    with session_scope(settings.sqlalchemy_url) as session:  # move the other config's result onto the first series
        session.get(Run, other["id"]).series_id = first["series_id"]
        session.get(SeriesCounters, other["id"]).series_id = first["series_id"]
    again = upload(client, ada, with_counters(document(commit="ffff003")))
    assert again["series_id"] == first["series_id"] and again["changes"] == [], "compared with ffff001, not the other config"
