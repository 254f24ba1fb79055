"""Refusals that name what was wrong: an unknown sort or filter name, or an enumerated value outside
its set, is a 422 listing the valid ones on every list (leaderboard, runs, sweeps, series, workers;
API and page alike, never silently ignored), and a sweep refusal always says why."""

from __future__ import annotations

import pytest

SWEEP = {"workload": {"model": "tiny"}, "world_size": 2, "top": 2, "controls": 0, "steps": 2, "precisions": ["fp32"]}


@pytest.mark.parametrize("path", ["/api/v1/leaderboard", "/leaderboard", "/leaderboard.csv"])
def test_an_unknown_sort_is_refused_with_the_sortable_columns(client, path) -> None:
    response = client.get(path, params={"sort": "speed"})
    assert response.status_code == 422
    error = response.json()["detail"][0]
    assert error["loc"] == ["query", "sort"]
    assert "'speed' is not a column of the leaderboard" in error["msg"] and "tokens_per_s" in error["msg"]
    assert client.get(path, params={"sort": "tokens_per_s", "dir": "asc"}).status_code == 200


@pytest.mark.parametrize("path", ["/api/v1/leaderboard", "/leaderboard"])
def test_a_misspelt_filter_is_refused_with_the_filters_it_takes(client, path) -> None:
    response = client.get(path, params={"stratgy": "ddp"})
    assert response.status_code == 422
    msg = response.json()["detail"][0]["msg"]
    assert "unknown parameter 'stratgy'" in msg and "strategy" in msg.split("takes:")[1]
    assert client.get(path, params={"strategy": "ddp", "hardware": ""}).status_code == 200


def test_a_sweep_refusal_always_carries_its_reason(client) -> None:
    # MoE on a dense model: the search space holds nothing, so no rejection could say why before.
    response = client.post("/api/v1/sweeps", json={**SWEEP, "strategies": ["moe"]})
    assert response.status_code == 422
    msg = response.json()["detail"][0]["msg"]
    assert msg.startswith("no configuration fits: ") and len(msg) > len("no configuration fits: ") + 20, msg
    assert "holds no configuration of tiny on 2 ranks" in msg and "moe needs a model with experts" in msg
    empty = client.post("/api/v1/sweeps", json={**SWEEP, "strategies": []}).json()["detail"][0]["msg"]
    assert "holds no configuration of tiny on 2 ranks" in empty
    # A strategy that trains nothing is refused on its field, not a server error.
    collectives = client.post("/api/v1/sweeps", json={**SWEEP, "strategies": ["collectives"]})
    assert collectives.status_code == 422 and collectives.json()["detail"][0]["loc"] == ["body", "strategies"]
    assert "the strategies a sweep plans are: single, ddp" in collectives.json()["detail"][0]["msg"]


def test_a_pool_name_outside_the_pool_pattern_is_a_422_on_the_sweep_and_the_plan(client) -> None:
    # The sweep's calibration run is a job spec whose pool must match the pattern: checked at the
    # request (it was a 500 when the calibration's spec refused it; found by the API fuzzer).
    sweep = client.post("/api/v1/sweeps", json={**SWEEP, "pool": "series setting"})
    assert sweep.status_code == 422, sweep.text
    assert sweep.json()["detail"][0]["loc"] == ["body", "pool"]
    plan = client.get("/api/v1/plan", params={"mode": "rank", "model": "tiny", "pool": "Bad Pool"})
    assert plan.status_code == 422, plan.text
    assert plan.json()["detail"][0]["loc"][-1] == "pool"


# ---- every list route: unknown names and values outside an enumeration are 422, never ignored ----


def test_a_misspelt_runs_filter_is_refused_with_the_names_it_takes(client) -> None:
    response = client.get("/api/v1/runs?stratgy=ddp")
    assert response.status_code == 422, response.text
    msg = response.json()["detail"][0]["msg"]
    assert "unknown parameter 'stratgy'" in msg, msg
    takes = msg.split("takes:")[1]
    for name in ("status", "strategy", "user", "cursor", "model", "source", "limit"):
        assert name in takes, msg
    assert client.get("/api/v1/runs?strategy=ddp").status_code == 200


@pytest.mark.parametrize(
    ("param", "bad", "valid"),
    [
        ("status", "bogus", ["queued", "running", "succeeded", "failed", "cancelled"]),
        ("source", "web", ["form", "api", "cli", "ci"]),
        ("strategy", "dpp", ["ddp", "fsdp", "tp"]),
    ],
)
def test_a_runs_filter_value_outside_its_set_is_refused_with_the_valid_ones(client, param, bad, valid) -> None:
    response = client.get("/api/v1/runs", params={param: bad})
    assert response.status_code == 422, response.text
    error = response.json()["detail"][0]
    assert error["loc"] == ["query", param], error
    assert all(v in error["msg"] for v in valid), error["msg"]
    assert client.get("/api/v1/runs", params={param: valid[0]}).status_code == 200


@pytest.mark.parametrize(
    ("path", "takes"), [("/api/v1/series", "no parameters"), ("/api/v1/sweeps", "limit"), ("/api/v1/workers", "no parameters")]
)
def test_the_other_lists_refuse_an_unknown_sort(client, path, takes) -> None:
    response = client.get(path, params={"sort": "x"})
    assert response.status_code == 422, response.text
    msg = response.json()["detail"][0]["msg"]
    assert "unknown parameter 'sort'" in msg and takes in msg.split("takes:")[1], msg
    assert client.get(path).status_code == 200


def test_the_runs_page_refuses_what_the_runs_api_refuses(client) -> None:
    assert client.get("/", params={"status": "bogus"}).status_code == 422
    assert "unknown parameter 'stratgy'" in client.get("/", params={"stratgy": "ddp"}).json()["detail"][0]["msg"]
    # The filter form sends an empty value for "any".
    assert client.get("/", params={"status": "", "strategy": "", "user": ""}).status_code == 200
    assert client.get("/", params={"status": "succeeded", "strategy": "ddp"}).status_code == 200


@pytest.mark.parametrize(
    ("param", "bad"), [("source", "web"), ("strategy", "dpp"), ("precision", "fp64"), ("activation_checkpointing", "most")]
)
def test_a_leaderboard_filter_value_outside_its_set_is_refused(client, param, bad) -> None:
    response = client.get("/api/v1/leaderboard", params={param: bad})
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"] == ["query", param]
