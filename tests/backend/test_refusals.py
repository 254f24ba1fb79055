"""Refusals that name what was wrong: an unknown leaderboard sort or filter is a 422 listing the
valid names (API and page alike, never silently ignored), and a sweep refusal always says why."""

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
