"""GET /api/v1/plan: its parameters are the job spec's fields and the strategies' options, by name."""

from __future__ import annotations

import pytest

from backend.schemas.plan import RANK_PARAMS
from parallab.core.spec import workload_fields
from parallab.core.strategies import REGISTRY

LEGACY = {
    "strategy",
    "world_size",
    "model",
    "num_layers",
    "hidden_size",
    "num_heads",
    "vocab_size",
    "seq_len",
    "ffn_hidden_size",
    "global_batch_size",
    "num_experts",
    "precision",
    "tp",
    "microbatches",
    "reshard_after_forward",
    "sequence_parallel",
    "zigzag",
}


def plan(client, **params):
    response = client.get("/api/v1/plan", params=params)
    assert response.status_code == 200, response.text
    return response.json()


def test_every_workload_field_and_strategy_option_is_a_parameter(client) -> None:
    names = {p["name"] for p in client.get("/openapi.json").json()["paths"]["/api/v1/plan"]["get"]["parameters"]}
    assert names >= LEGACY, "the parameter names scripts already use keep working"
    options = {name for d in REGISTRY.values() for name in d.options_model.model_fields}
    assert names == {"strategy", "world_size"} | {f.name for f in workload_fields()} | options | set(RANK_PARAMS)


def test_shape_and_recipe_parameters_reach_the_plan(client) -> None:
    base = plan(client, strategy="ddp", world_size=2)
    deeper = plan(client, strategy="ddp", world_size=2, num_layers=8, rope_theta=500000, precision="bf16", global_batch_size=16)
    assert deeper["workload"]["num_layers"] == 8 and deeper["workload"]["rope_theta"] == 500000
    assert deeper["workload"]["precision"] == "bf16" and deeper["workload"]["global_batch_size"] == 16
    assert deeper["prediction"]["params_total"] > base["prediction"]["params_total"]
    assert deeper["prediction"]["precision_recipe"] != base["prediction"]["precision_recipe"]
    assert deeper["workload"]["custom"] is True and base["workload"]["custom"] is False


@pytest.mark.parametrize(
    ("strategy", "world_size", "params", "options"),
    [
        (
            "hybrid",
            4,
            {"tp": 2, "sequence_parallel": "true", "reshard_after_forward": "false"},
            {"tp": 2, "sequence_parallel": True, "reshard_after_forward": False},
        ),
        ("pp", 2, {"microbatches": 8, "schedule": "gpipe"}, {"microbatches": 8, "schedule": "gpipe"}),
        ("ring", 2, {"zigzag": "true"}, {"zigzag": True}),
        ("collectives", 2, {"ops": ["all_reduce", "broadcast"], "iters": 3}, {"ops": ["all_reduce", "broadcast"], "iters": 3}),
    ],
)
def test_option_parameters_reach_the_strategy(client, strategy, world_size, params, options) -> None:
    resolved = plan(client, strategy=strategy, world_size=world_size, **params)["strategy"]["options"]
    assert {k: resolved[k] for k in options} == options


def test_an_option_the_strategy_lacks_or_a_bad_value_is_422_naming_it(client) -> None:
    lacking = client.get("/api/v1/plan", params={"strategy": "ddp", "world_size": 2, "zigzag": "true"})
    assert lacking.status_code == 422 and lacking.json()["detail"][0]["loc"] == ["body", "strategy", "options"]
    assert "unknown option 'zigzag'; valid: bucket_cap_mb" in lacking.json()["detail"][0]["msg"]
    bad = client.get("/api/v1/plan", params={"strategy": "pp", "world_size": 2, "microbatches": 0})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["query", "microbatches"]
    unknown = client.get("/api/v1/plan", params={"strategy": "warp"})
    assert unknown.status_code == 422 and unknown.json()["detail"][0]["loc"] == ["query", "strategy"]
