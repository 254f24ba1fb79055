"""REST compare and leaderboard on SQLite and Postgres, over runs stored by the ingest path."""

from __future__ import annotations

import pytest

from backend.db import session_scope
from tests.ui.factories import make_document, store_run

GPU = {"device": "cuda", "device_name": "NVIDIA H100 80GB HBM3"}


@pytest.fixture
def lab(settings) -> dict[str, str]:
    with session_scope(settings.sqlalchemy_url) as session:
        plan = {
            "ddp2": make_document(strategy="ddp", world_size=2, tokens_per_s=16_000.0),
            "fsdp2": make_document(strategy="fsdp", world_size=2, tokens_per_s=14_000.0),
            "tp2": make_document(strategy="tp", world_size=2, tokens_per_s=11_000.0),
            "gpu-ddp8": make_document(strategy="ddp", world_size=8, tokens_per_s=400_000.0, hardware=GPU),
        }
        return {key: store_run(session, doc).id for key, doc in plan.items()}


def test_leaderboard_ranks_within_workload_and_hardware_groups(client, lab) -> None:
    body = client.get("/api/v1/leaderboard", params={"runs": "all"}).json()
    assert body["total"] == 4
    cpu = [row for row in body["items"] if row["hardware_key"] != "cuda:NVIDIA H100 80GB HBM3"]
    gpu = [row for row in body["items"] if row["hardware_key"] == "cuda:NVIDIA H100 80GB HBM3"]
    assert [r["strategy"] for r in sorted(cpu, key=lambda r: r["rank"])] == ["ddp", "fsdp", "tp"]
    assert [r["rank"] for r in gpu] == [1]  # never ranked against the CPU runs
    assert sum(r["best"] for r in body["items"]) == 2
    only_fsdp = client.get("/api/v1/leaderboard", params={"strategy": "fsdp"}).json()
    assert [r["id"] for r in only_fsdp["items"]] == [lab["fsdp2"]]
    assert client.get("/api/v1/leaderboard", params={"limit": 0}).status_code == 422


def test_compare_is_relative_to_the_baseline(client, lab) -> None:
    body = client.get("/api/v1/compare", params={"ids": f"{lab['ddp2']},{lab['fsdp2']}", "baseline": lab["ddp2"]}).json()
    assert [r["id"] for r in body["runs"]] == [lab["ddp2"], lab["fsdp2"]]
    tokens = next(m for m in body["metrics"] if m["key"] == "tokens_per_s")
    assert tokens["values"] == [pytest.approx(16_000.0), pytest.approx(14_000.0)]
    assert tokens["relative_to_baseline"][0] == 0
    assert tokens["relative_to_baseline"][1] == pytest.approx(14_000 / 16_000 - 1)
    assert client.get("/api/v1/compare", params={"ids": ""}).status_code == 422


@pytest.mark.parametrize("url", ["/api/v1/leaderboard", "/leaderboard", "/leaderboard.json", "/leaderboard.csv"])
def test_the_page_its_exports_and_rest_read_the_same_parameters(client, lab, url) -> None:
    for bad in ({"world_size": "two"}, {"runs": "some"}, {"dir": "up"}, {"limit": 0}, {"offset": -1}):
        response = client.get(url, params=bad)
        assert response.status_code == 422, (url, bad)
        assert response.json()["detail"][0]["loc"] == ["query", next(iter(bad))]
    # HTML filter forms send an empty value for "any"
    response = client.get(url, params={"strategy": "fsdp", "world_size": "", "model": "", "runs": "all"})
    assert response.status_code == 200
    assert lab["fsdp2"] in response.text and lab["ddp2"] not in response.text


def test_leaderboard_json_is_what_fastapi_writes_for_the_same_dict(client, lab, settings) -> None:
    """The route writes its dict with pydantic's serializer itself: the bytes must be those FastAPI
    writes for a route returning that dict (datetimes as pydantic writes them, floats the same)."""
    from typing import Any

    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from backend.services import leaderboard as leaderboard_service

    with session_scope(settings.sqlalchemy_url) as session:
        board = leaderboard_service.get_leaderboard(session=session, query=leaderboard_service.LeaderboardQuery(best_only=False))
        payload = {
            "items": leaderboard_service.export_rows(board),
            "total": board.total,
            "limit": 50,
            "offset": 0,
            "next_cursor": board.next_cursor,
        }
    reference = FastAPI()

    @reference.get("/board")
    def _board() -> dict[str, Any]:
        return payload

    expected = TestClient(reference).get("/board").content
    assert b'"created_at":"' in expected
    assert client.get("/api/v1/leaderboard", params={"runs": "all"}).content == expected
