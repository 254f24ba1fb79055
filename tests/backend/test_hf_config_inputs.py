"""A config.json as an input of the API (`workload.hf_config`) and of `parallab plan`/`bench`
(`--hf-config FILE`): a good one is the model, resolved into the explicit fields it stands for; a
bad one is a 422 (or exit 2) naming its key, and nothing is stored or queued."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from parallab.commands.plan import plan
from parallab.core.hf_config import MAX_CONFIG_BYTES
from tests.backend.test_api_runs import run_count
from tests.core.hf_configs import LLAMA_3_8B, MIXTRAL_8X7B, TINY_LLAMA, TINY_MIXTRAL, nested

runner = CliRunner()
plan_app = typer.Typer()
plan_app.command()(plan)


def job(**workload) -> dict:
    return {"workload": {"model": "tiny", "steps": 3, **workload}, "strategy": {"name": "ddp", "world_size": 2}}


# ---- the API ----


def test_the_api_takes_a_config_and_stores_the_explicit_fields(client, settings) -> None:
    response = client.post("/api/v1/runs", json=job(hf_config=TINY_LLAMA))
    assert response.status_code == 202, response.text
    workload = response.json()["spec"]["workload"]
    assert "hf_config" not in workload
    assert (workload["family"], workload["num_layers"], workload["num_kv_heads"], workload["rope_theta"]) == ("hf", 2, 2, 500000.0)
    explicit = {
        "family": "hf",
        "vocab_size": 256,
        "hidden_size": 64,
        "ffn_hidden_size": 256,
        "num_layers": 2,
        "num_heads": 4,
        "num_kv_heads": 2,
        "norm_eps": 1e-5,
        "rope_theta": 500000.0,
    }
    same = client.post("/api/v1/runs", json=job(**explicit))
    assert same.status_code == 202, same.text
    assert same.json()["spec"] == response.json()["spec"]  # the same job, so the same workload key
    assert run_count(settings.sqlalchemy_url) == 2


def test_the_api_takes_a_mixtral_config_as_the_hf_familys_experts(client, settings) -> None:
    response = client.post("/api/v1/runs", json=job(hf_config=TINY_MIXTRAL))
    assert response.status_code == 202, response.text
    workload = response.json()["spec"]["workload"]
    assert (workload["family"], workload["num_experts"], workload["top_k"], workload["rope_theta"]) == ("hf", 4, 2, 1e6)
    assert "hf_config" not in workload and run_count(settings.sqlalchemy_url) == 1
    refused = client.post("/api/v1/runs", json={**job(hf_config=TINY_MIXTRAL), "strategy": {"name": "ring", "world_size": 2}})
    assert refused.status_code == 422 and ["body", "strategy", "name"] in [d["loc"] for d in refused.json()["detail"]], refused.text
    assert run_count(settings.sqlalchemy_url) == 1


@pytest.mark.parametrize(
    ("config", "loc", "words"),
    [
        (
            {**TINY_LLAMA, "model_type": "gpt2"},
            ["body", "workload", "hf_config", "model_type"],
            "the hf family builds llama, mistral, qwen2",
        ),
        (
            {**TINY_LLAMA, "num_key_value_heads": 3},
            ["body", "workload", "hf_config", "num_key_value_heads"],
            "not divisible by num_kv_heads 3",
        ),
        ({**TINY_LLAMA, "num_hidden_layers": 10**6}, ["body", "workload", "hf_config", "num_hidden_layers"], "less than or equal to 1024"),
        ({**TINY_LLAMA, "rope_scaling": nested(40)}, ["body", "workload", "hf_config"], "rope_scaling: nested deeper than 32 levels"),
        ({**TINY_LLAMA, "architectures": ["x" * MAX_CONFIG_BYTES]}, ["body", "workload", "hf_config"], "at most 65,536"),
        ({**TINY_LLAMA, "flash": True}, ["body", "workload", "hf_config", "flash"], "not a key the hf family knows"),
        (
            {**TINY_MIXTRAL, "num_experts_per_tok": 6},
            ["body", "workload", "hf_config", "num_experts_per_tok"],
            "top_k 6 must be between 1 and num_experts 4",
        ),
        (
            {**TINY_MIXTRAL, "moe_intermediate_size": 128},
            ["body", "workload", "hf_config", "moe_intermediate_size"],
            "not a key the hf family knows for model_type 'mixtral'",
        ),
        ({**TINY_MIXTRAL, "router_jitter_noise": 0.1}, ["body", "workload", "hf_config", "router_jitter_noise"], "must be 0"),
    ],
)
def test_a_bad_config_is_422_naming_its_key_and_nothing_is_queued(client, settings, config, loc, words) -> None:
    response = client.post("/api/v1/runs", json=job(hf_config=config))
    assert response.status_code == 422, response.text
    matching = [d for d in response.json()["detail"] if d["loc"] == loc]
    assert matching and words in matching[0]["msg"], response.json()["detail"]
    assert run_count(settings.sqlalchemy_url) == 0


def test_a_200_level_config_is_refused_with_the_body_before_any_route(client, settings) -> None:
    response = client.post("/api/v1/runs", json=job(hf_config={**TINY_LLAMA, "rope_scaling": nested(200)}))
    assert response.status_code == 422
    assert "nested deeper than 200 levels" in response.json()["detail"][0]["msg"]
    assert run_count(settings.sqlalchemy_url) == 0


# ---- the CLI ----


def write(tmp_path: Path, name: str, config: object) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(config))
    return str(path)


def test_plan_takes_a_config_file(tmp_path) -> None:
    path = write(tmp_path, "llama3.json", LLAMA_3_8B)
    args = ["--hf-config", path, "--strategy", "fsdp", "--world-size", "8", "--precision", "bf16"]
    result = runner.invoke(plan_app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    psi = out["params_total"]
    assert psi == 8_030_261_248 and out["workload"]["family"] == "hf" and out["workload"]["num_kv_heads"] == 8
    assert sum(out["model_state_bytes_per_rank"].values()) == 16 * psi // 8  # mixed precision, sharded 8 ways
    table = runner.invoke(plan_app, args, env={"COLUMNS": "200"})
    assert table.exit_code == 0, table.output
    words = " ".join(table.output.split())  # the table wraps its title and notes
    assert "Ψ=8,030,261,248 parameters" in words and "shape from --hf-config" in words and "(model_type llama)" in words
    layers = runner.invoke(plan_app, [*args, "--json", "--layers", "2"])  # a flag overrides the file's field
    assert layers.exit_code == 0 and json.loads(layers.output)["workload"]["num_layers"] == 2


@pytest.mark.parametrize(
    ("config", "words"),
    [
        ({**LLAMA_3_8B, "num_hidden_layers": 10**6}, "workload.hf_config.num_hidden_layers: num_layers 1000000"),
        ({**LLAMA_3_8B, "model_type": "bloom"}, 'workload.hf_config.model_type: model_type "bloom"'),
        ({**LLAMA_3_8B, "num_key_value_heads": 6}, "workload.hf_config.num_key_value_heads: num_heads 32 is not divisible"),
        ({**LLAMA_3_8B, "rope_scaling": nested(150)}, "workload.hf_config.rope_scaling: nested deeper than 32 levels"),
        (nested(250), "not JSON: JSON nested deeper than 200 levels"),
        ({**LLAMA_3_8B, "architectures": ["x" * MAX_CONFIG_BYTES]}, "larger than 65,536 bytes"),
        ([LLAMA_3_8B], "a config.json is a JSON object, not list"),
        ({**MIXTRAL_8X7B, "num_experts_per_tok": 9}, "workload.hf_config.num_experts_per_tok: top_k 9 must be between 1 and num_experts 8"),
        ({**MIXTRAL_8X7B, "expert_capacity": 2}, "workload.hf_config.expert_capacity: not a key the hf family knows"),
    ],
)
def test_bench_refuses_a_bad_config_file_naming_its_key_and_launches_nothing(tmp_path, monkeypatch, config, words) -> None:
    from backend.config import get_settings
    from parallab.cli import app as cli

    monkeypatch.setenv("PARALLAB_HOME", str(tmp_path))
    get_settings.cache_clear()
    try:
        out = tmp_path / "result.json"
        path = write(tmp_path, "bad.json", config)
        result = runner.invoke(cli, ["bench", "--hf-config", path, "--strategy", "ddp", "--world-size", "2", "--out", str(out)])
        assert result.exit_code == 2, result.output
        assert words in result.output
        assert not out.exists()
    finally:
        get_settings.cache_clear()


def test_plan_ranks_a_config_files_model(tmp_path) -> None:
    path = write(tmp_path, "tiny-llama.json", TINY_LLAMA)
    result = runner.invoke(plan_app, ["--hf-config", path, "--device", "h100", "--top", "3"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "llama (config.json, from tiny) on" in result.output
    ranked = runner.invoke(plan_app, ["--hf-config", path, "--device", "h100", "--top", "3", "--json"])
    assert ranked.exit_code == 0, ranked.output
    best = json.loads(ranked.output)["fits"][0]["spec"]["workload"]
    assert (best["family"], best["num_kv_heads"], best["vocab_size"]) == ("hf", 2, 256) and "hf_config" not in best
