"""`parallab plan`'s ranking mode and `parallab sweep` through typer's CliRunner (nothing is launched:
the sweep's runs are queued on the embedded broker, no worker takes them)."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from backend.config import get_settings
from backend.db import session_scope
from backend.migrate import upgrade
from backend.models import Run
from parallab.commands.plan import plan
from parallab.commands.sweep import sweep

runner = CliRunner()


def cli(command) -> typer.Typer:
    app = typer.Typer()
    app.command()(command)
    return app


def test_plan_ranks_llama_8b_on_two_h100_nodes_and_says_why_the_rest_dont_fit():
    result = runner.invoke(
        cli(plan), ["--model", "llama-8b", "--device", "h100", "--nodes", "2", "--gpus-per-node", "8", "--json", "--top", "5"]
    )
    assert result.exit_code == 0, result.output
    body = json.loads(result.output)
    assert body["world_size"] == 16 and "2 × 8 NVIDIA H100 SXM5 80GB" in body["hardware"]
    assert len(body["fits"]) == 5 and body["fitting"] > 5 and body["rejected"]
    budget = 80e9 - 2**31  # a profiled GPU's budget is the allocator's: its memory less the CUDA context (h100-sxm profile)
    assert all(row["memory_per_rank_bytes"] <= budget and row["tokens_per_s"] > 0 for row in body["fits"])
    assert all(row["accuracy"]["not_modelled"] for row in body["fits"])
    assert all(row["reasons"] for row in body["rejected"])
    table = runner.invoke(cli(plan), ["--model", "llama-8b", "--device", "h100", "--nodes", "2", "--gpus-per-node", "8", "--top", "3"])
    assert (
        table.exit_code == 0 and "configurations fit" in table.output and "do not fit" in table.output and "memory: needs" in table.output
    )


def test_plan_narrows_the_recipe_with_the_workload_flags_and_refuses_an_unknown_device():
    result = runner.invoke(
        cli(plan), ["--model", "llama-1b", "--device", "a100", "--precision", "bf16", "--activation-checkpointing", "full", "--json"]
    )
    body = json.loads(result.output)
    assert {(r["precision"], r["activation_checkpointing"]) for r in body["fits"] + body["rejected"]} == {("bf16", "full")}
    bad = runner.invoke(cli(plan), ["--model", "tiny", "--device", "h900"])
    assert bad.exit_code == 2 and "--device: unknown device 'h900'" in bad.output


@pytest.fixture
def local_home(tmp_path, monkeypatch):
    monkeypatch.setenv("PARALLAB_HOME", str(tmp_path))
    monkeypatch.setenv("PARALLAB_MAX_WORLD_SIZE", "2")
    get_settings.cache_clear()
    settings = get_settings()
    settings.ensure_home()
    upgrade(settings.sqlalchemy_url)
    yield settings
    get_settings.cache_clear()


def test_sweep_queues_the_top_predicted_and_controls_in_the_local_database(local_home):
    args = [
        "--model",
        "tiny",
        "--world-size",
        "2",
        "--top",
        "2",
        "--controls",
        "1",
        "--precision",
        "fp32",
        "--grad-accumulation-steps",
        "1",
        "--json",
    ]
    result = runner.invoke(cli(sweep), args)
    assert result.exit_code == 0, result.output
    body = json.loads(result.output[result.output.index("{") :])
    assert [p["role"] for p in body["points"]] == ["top", "top", "control"]
    with session_scope(local_home.sqlalchemy_url) as session:
        assert session.query(Run).filter(Run.sweep_id == body["id"], Run.status == "queued", Run.source == "cli").count() == 3
    refused = runner.invoke(cli(sweep), ["--model", "tiny", "--world-size", "4"])
    assert refused.exit_code == 2 and "world_size: world size 4 is above the server's limit of 2" in refused.output
