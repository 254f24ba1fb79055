"""GET /api/v1/plan: its parameters are the job spec's fields and the strategies' options, by name."""

from __future__ import annotations

import re

import pytest

from backend.schemas.plan import RANK_PARAMS, RECIPE_PARAMS
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
    assert names == {"strategy", "world_size"} | {f.name for f in workload_fields()} | options | set(RANK_PARAMS) | set(RECIPE_PARAMS)


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


EIGHT_B = {"model": "llama-3-8b", "seq_len": 8192, "global_batch_size": 64, "precision": "bf16", "activation_checkpointing": "selective"}


def test_the_recipe_parameters_change_the_prediction_and_the_ranking(client) -> None:
    fsdp = {**EIGHT_B, "strategy": "fsdp", "world_size": 32}
    eager, compiled = (plan(client, **fsdp, compiled_loss=c)["prediction"] for c in ("false", "true"))
    # the kept fp32 log-softmax and the logits' fp32 gradient become 16-bit: 4 B less an entry and token
    assert eager["activation_bytes_per_rank"] + eager["backward_temporary_bytes_per_rank"] - (
        compiled["activation_bytes_per_rank"] + compiled["backward_temporary_bytes_per_rank"]
    ) == pytest.approx(4 * 2 * 8192 * 128256, rel=0.01)
    titan = plan(client, **fsdp, selective_policy="torchtitan_op")["prediction"]
    assert titan["activation_bytes_per_rank"] != eager["activation_bytes_per_rank"]
    hybrid = {**EIGHT_B, "strategy": "hybrid", "world_size": 8, "tp": 4, "sequence_parallel": "true"}
    whole, sharded = (plan(client, **hybrid, loss_parallel=lp)["prediction"] for lp in ("false", "true"))
    assert sharded["activation_bytes_per_rank"] < whole["activation_bytes_per_rank"]
    rank = {"mode": "rank", "model": "llama-3-8b", "device": "h100", "nodes": 1, "gpus_per_node": 8}
    plain, with_loss = (plan(client, **rank, compiled_loss=c) for c in ("false", "true"))
    assert with_loss["fitting"] > plain["fitting"]


@pytest.mark.parametrize(
    ("params", "field", "said"),
    [
        ({"compiled_loss": "true", "loss_parallel": "true"}, "compiled_loss", "a compiled loss under loss parallel is not modelled"),
        ({"selective_policy": "bogus"}, "selective_policy", "'bogus' is not one of every_matmul, torchtitan_op"),
        (
            {"model": "mixtral-8x7b", "selective_policy": "torchtitan_op"},
            "selective_policy",
            "torchtitan_op is counted for dense SwiGLU blocks",
        ),
    ],
)
def test_a_recipe_the_planner_does_not_count_is_422_naming_it(client, params, field, said) -> None:
    response = client.get("/api/v1/plan", params={"strategy": "ddp", "world_size": 2, "activation_checkpointing": "selective", **params})
    assert response.status_code == 422, response.text
    detail = response.json()["detail"][0]
    assert detail["loc"] == ["query", field] and said in detail["msg"]


def test_the_plan_page_ranks_under_the_recipe_it_was_given(client) -> None:
    query = {"model": "llama-3-8b", "device": "h100", "nodes": 1, "gpus_per_node": 8}
    plain = client.get("/plan", params=query).text
    page = client.get("/plan", params={**query, "compiled_loss": "true", "selective_policy": "torchtitan_op"}).text
    fitting = re.compile(r"(\d+) of (\d+) configurations fit")
    assert int(fitting.search(page).group(1)) > int(fitting.search(plain).group(1))  # type: ignore[union-attr]
    assert re.search(r'name="compiled_loss" value="true" checked', page) and not re.search(
        r'name="loss_parallel" value="true" checked', page
    )
    assert '<option value="torchtitan_op" title="' in page and re.search(r'value="torchtitan_op" title="[^"]*" selected', page)
    link = re.search(r'href="(/api/v1/plan\?mode=rank[^"]*)"', page).group(1).replace("&amp;", "&")  # type: ignore[union-attr]
    assert link.endswith("&compiled_loss=true&selective_policy=torchtitan_op")  # the JSON link asks the API the same
    assert client.get(link).json()["fitting"] == int(fitting.search(page).group(1))  # type: ignore[union-attr]
    refused = client.get("/plan", params={**query, "compiled_loss": "true", "loss_parallel": "true"})
    assert refused.status_code == 200 and "compiled_loss: a compiled loss under loss parallel is not modelled" in refused.text
    assert "configurations fit" not in refused.text
    assert client.get("/plan", params={**query, "selective_policy": "x" * 40}).status_code == 422  # bounded as the API's
