"""`parallab plan` through typer's CliRunner."""

from __future__ import annotations

import json

import typer
from typer.testing import CliRunner

from parallab.commands.plan import plan

app = typer.Typer()
app.command()(plan)
runner = CliRunner()

GPT_7_5B = ["--layers", "40", "--hidden", "4096", "--heads", "32", "--vocab", "50257", "--seq-len", "1024",
            "--ffn-hidden", "8960", "--global-batch-size", "64"]


def test_json_for_tiny_ddp():
    result = runner.invoke(app, ["--strategy", "ddp", "--world-size", "2", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["model_state_bytes_per_rank"] == {"params": 4 * 295_488, "grads": 4 * 295_488, "optimizer": 8 * 295_488}
    assert doc["comm_bytes_per_step"] == {"all_reduce": 4 * 295_488}
    assert doc["strategy"] == {"name": "ddp", "world_size": 2, "options": {"bucket_cap_mb": 25.0}}
    assert "flops_per_token" in doc and "activation_bytes_per_rank" in doc


def test_7_5b_gpt_at_64_ranks_against_zero_table():
    result = runner.invoke(app, ["-s", "fsdp", "-n", "64", *GPT_7_5B, "--precision", "mixed", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["workload"]["precision"] == "bf16"
    assert round(sum(doc["model_state_bytes_per_rank"].values()) / 1e9, 1) == 1.9
    assert {k: round(v / 1e9, 1) for k, v in doc["zero_stages_bytes_per_rank"].items()} == {
        "baseline": 120.0, "stage1": 31.4, "stage2": 16.6, "stage3": 1.9}


def test_table_and_options():
    result = runner.invoke(app, ["-s", "pp", "-n", "2", "--option", "microbatches=8", "--option", "schedule=gpipe"])
    assert result.exit_code == 0, result.output
    assert "pipeline bubble" in result.stdout and "11.1%" in result.stdout  # (2−1)/(8+2−1)
    assert "ZeRO" in result.stdout


def test_spec_errors_exit_2_with_the_message():
    result = runner.invoke(app, ["-s", "tp", "-n", "3"])
    assert result.exit_code == 2
    assert "heads (4) is not divisible by 3" in result.output
    assert runner.invoke(app, ["-s", "fsdp", "-n", "2", "--option", "bogus=1"]).exit_code == 2
    assert runner.invoke(app, ["-s", "fsdp", "-n", "2", "--option", "novalue"]).exit_code == 2
    assert runner.invoke(app, ["-s", "ddp", "-n", "2", "--precision", "int4"]).exit_code == 2
