"""Every list a query string can send is bounded and counted once, and every name a route does not
take is refused: `GET /api/v1/plan` (whose ranking plans the product of its lists), the compare
routes, and a walk over every route so a new list parameter without a bound fails here."""

from __future__ import annotations

import types
import typing
from collections.abc import Iterator
from typing import Any

import annotated_types
import pytest
from pydantic import BaseModel

from backend.api.app import create_app
from backend.schemas.queries import QueryParams
from backend.services.compare import MAX_COMPARE
from parallab.core.ranking import MAX_ACCUMULATION, MAX_CHECKPOINTING

RANK = {"mode": "rank", "model": "tiny", "device": "h100", "nodes": 1, "gpus_per_node": 2, "precisions": "fp32"}


def _query_fields(app: Any) -> Iterator[tuple[str, str, Any, type[BaseModel] | None]]:
    """(path, name, field info, the query model it belongs to) of every query parameter of every route."""
    for route in app.routes:
        for r in route.effective_route_contexts() if hasattr(route, "effective_route_contexts") else [route]:
            stack = [r.dependant] if hasattr(r, "dependant") else []
            while stack:
                dependant = stack.pop()
                stack += dependant.dependencies
                for field in dependant.query_params:
                    model = field.field_info.annotation
                    if isinstance(model, type) and issubclass(model, BaseModel):
                        yield from ((r.path, name, info, model) for name, info in model.model_fields.items())
                    else:
                        yield r.path, field.name, field.field_info, None


def _is_list(annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    if origin in (list, set, frozenset, tuple):
        return True
    return origin in (typing.Union, types.UnionType) and any(_is_list(a) for a in typing.get_args(annotation))


def test_every_list_query_parameter_of_every_route_has_a_bound_and_every_query_model_refuses_unknown_names() -> None:
    fields = list(_query_fields(create_app()))
    lists = [(path, name, info) for path, name, info, _ in fields if _is_list(info.annotation)]
    assert {"/api/v1/plan", "/api/v1/compare", "/compare"} <= {path for path, _, _ in lists}, "the walk sees the routes' lists"
    unbounded = [f"{path} {name}" for path, name, info in lists if not any(isinstance(m, annotated_types.MaxLen) for m in info.metadata)]
    assert unbounded == []
    models = {model for *_, model in fields if model is not None}
    assert {m.__name__ for m in models} >= {"PlanQuery", "RunListParams", "LeaderboardParams"}
    assert [m.__name__ for m in models if not issubclass(m, QueryParams)] == []


def _detail(response: Any) -> list[dict[str, Any]]:
    assert response.status_code == 422, response.text
    return response.json()["detail"]


@pytest.mark.parametrize(
    ("name", "value", "cap"),
    [
        ("accumulation", [str(i) for i in range(1, MAX_ACCUMULATION + 2)], MAX_ACCUMULATION),
        ("checkpointing", ["none"] * (MAX_CHECKPOINTING + 1), MAX_CHECKPOINTING),
    ],
)
def test_plan_refuses_a_list_past_the_sweeps_cap_naming_it(client, name: str, value: list[str], cap: int) -> None:
    detail = _detail(client.get("/api/v1/plan", params={**RANK, name: value}))
    assert detail[0]["loc"] == ["query", name] and f"at most {cap}" in detail[0]["msg"], detail


def test_plan_counts_a_repeated_value_once_and_refuses_an_accumulation_no_spec_may_have(client) -> None:
    once = client.get("/api/v1/plan", params={**RANK, "accumulation": ["1", "2"], "checkpointing": ["none"]}).json()
    repeated = client.get("/api/v1/plan", params={**RANK, "accumulation": ["1", "1", "2", "1"], "checkpointing": ["none", "none"]})
    assert repeated.status_code == 200, repeated.text
    planned = repeated.json()
    assert planned["fitting"] + len(planned["rejected"]) == once["fitting"] + len(once["rejected"]) > 0
    assert {r["grad_accumulation_steps"] for r in planned["fits"]} == {1, 2}
    detail = _detail(client.get("/api/v1/plan", params={**RANK, "accumulation": "100000000"}))
    assert detail[0]["loc"] == ["query", "accumulation", 0], detail


def test_plan_refuses_an_unknown_parameter_listing_the_names_it_takes(client) -> None:
    for params in ({"strategy": "ddp", "world_size": 2, "stratgy": "fsdp"}, {**RANK, "acumulation": "1"}):
        msg = " ".join(d["msg"] for d in _detail(client.get("/api/v1/plan", params=params)))
        misspelt = next(k for k in params if k in ("stratgy", "acumulation"))
        assert f"unknown parameter {misspelt!r}" in msg and "/plan takes:" in msg and "accumulation" in msg, msg


def test_compare_refuses_more_runs_than_it_compares_naming_ids(client) -> None:
    assert _detail(client.get("/api/v1/compare", params={"ids": [f"r{i}" for i in range(MAX_COMPARE + 1)]}))[0]["loc"] == ["query", "ids"]
    many = ",".join(f"r{i}" for i in range(MAX_COMPARE + 1))
    detail = _detail(client.get("/api/v1/compare", params={"ids": many}))
    assert detail[0]["loc"] == ["query", "ids"] and f"at most {MAX_COMPARE}" in detail[0]["msg"]
    assert client.get("/api/v1/compare", params={"ids": ["nope"] * MAX_COMPARE}).status_code != 422, "one id repeated is one run"


def test_a_sweep_plans_a_repeated_value_once_and_refuses_an_accumulation_no_spec_may_have(client) -> None:
    body = {"workload": {"model": "tiny"}, "world_size": 2, "top": 3, "controls": 1, "steps": 2, "checkpointing": ["none"]}
    once = client.post("/api/v1/sweeps", json={**body, "precisions": ["fp32"], "accumulation": [1]})
    repeated = client.post("/api/v1/sweeps", json={**body, "precisions": ["fp32"] * 4, "accumulation": [1] * MAX_ACCUMULATION})
    assert once.status_code == repeated.status_code == 202, repeated.text
    assert repeated.json()["planned"] == once.json()["planned"]
    refused = client.post("/api/v1/sweeps", json={**body, "accumulation": [0]})
    assert refused.status_code == 422 and refused.json()["detail"][0]["loc"] == ["body", "accumulation", 0], refused.text
