"""`parallab plan` and `parallab bench`'s flags through typer's CliRunner (nothing is launched)."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from parallab.commands.bench import bench
from parallab.commands.jobspec import spec_document
from parallab.commands.plan import plan
from parallab.core.spec import workload_fields

app = typer.Typer()
app.command()(plan)
runner = CliRunner()

GPT_7_5B = [
    "--layers",
    "40",
    "--hidden",
    "4096",
    "--heads",
    "32",
    "--vocab",
    "50257",
    "--seq-len",
    "1024",
    "--ffn-hidden",
    "8960",
    "--global-batch-size",
    "64",
]


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
        "baseline": 120.0,
        "stage1": 31.4,
        "stage2": 16.6,
        "stage3": 1.9,
    }


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


# ---- the flags derive from the core; bench's flags override its spec file ----


def _options(command) -> set[str]:
    """Every flag name a typer command accepts."""
    click_app = typer.Typer()
    click_app.command()(command)
    return {opt for param in typer.main.get_command(click_app).params for opt in (*param.opts, *param.secondary_opts)}


def test_every_workload_field_is_a_bench_flag_and_every_keyed_one_a_plan_flag():
    bench_flags, plan_flags = _options(bench), _options(plan)
    for field in workload_fields():
        assert field.cli in bench_flags, field.name
        if field.workload_key or field.name == "model":
            assert field.cli in plan_flags, field.name
    assert "--steps" not in plan_flags  # the prediction does not read it
    contractual = {
        "--strategy",
        "--world-size",
        "--model",
        "--steps",
        "--out",
        "--spec",
        "--option",
        "-o",
        "--trace",
        "--no-trace",
        "--run-dir",
    }
    assert contractual <= bench_flags
    assert {
        "--strategy",
        "--world-size",
        "--model",
        "--layers",
        "--hidden",
        "--heads",
        "--vocab",
        "--seq-len",
        "--precision",
        "--json",
        "-o",
    } <= plan_flags


def test_shape_and_recipe_flags_reach_the_resolved_workload():
    args = [
        "-s",
        "pp",
        "-n",
        "2",
        "--model",
        "small",
        "--layers",
        "6",
        "--hidden",
        "128",
        "--heads",
        "4",
        "--vocab",
        "512",
        "--seq-len",
        "32",
        "--grad-accumulation-steps",
        "2",
        "--activation-checkpointing",
        "full",
        "-o",
        "microbatches=2",
        "--json",
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    wl = doc["workload"]
    assert (wl["model"], wl["num_layers"], wl["hidden_size"], wl["num_heads"], wl["vocab_size"], wl["seq_len"]) == (
        "small",
        6,
        128,
        4,
        512,
        32,
    )
    assert wl["ffn_hidden_size"] == 512  # not given: derived from the new hidden size, 8/3·128 rounded up to 256s
    assert wl["custom"] is True
    assert (wl["grad_accumulation_steps"], wl["activation_checkpointing"]) == (2, "full")
    assert doc["strategy"]["options"] == {"schedule": "1f1b", "virtual_stages": 1, "microbatches": 2}
    assert doc["bubble_fraction"] == pytest.approx(1 / 3)  # (2−1)/(2+2−1)


def test_a_bad_flag_value_names_its_field():
    result = runner.invoke(app, ["-s", "ddp", "-n", "2", "--seq-len", "1"])
    assert result.exit_code == 2
    assert "workload.seq_len:" in result.output
    result = runner.invoke(app, ["-s", "collectives", "-n", "2"])
    assert result.exit_code == 2 and "nothing to predict" in result.output
    result = runner.invoke(app, ["-s", "nope", "-n", "2"])
    assert result.exit_code == 2 and "strategy.name: " in result.output and "unknown strategy 'nope'" in result.output


def test_the_data_flag_reaches_the_workload_and_a_bad_one_names_data():
    result = runner.invoke(app, ["-s", "ddp", "-n", "2", "--data", "text", "--json"])
    assert result.exit_code == 0, result.output
    wl = json.loads(result.stdout)["workload"]
    assert (wl["data"], wl["lr"]) == ("text", 2e-3)
    result = runner.invoke(app, ["-s", "ddp", "-n", "2", "--data", "text", "--vocab", "64"])
    assert result.exit_code == 2 and "workload.data: " in result.output and "vocab_size ≥ 128" in result.output
    result = runner.invoke(app, ["-s", "ddp", "-n", "2", "--data", "words"])
    assert result.exit_code == 2 and "--data" in result.output and "'words' is not one of" in result.output


def test_flags_override_the_spec_file_and_leave_the_rest():
    base = {
        "name": "mine",
        "workload": {"model": "tiny", "steps": 7, "num_heads": 8},
        "strategy": {"name": "tp", "world_size": 2, "options": {"sequence_parallel": True}},
        "trace": True,
    }
    doc = spec_document(base, strategy=None, world_size=4, options={"extra": 1}, workload={"num_heads": 2, "seed": 3}, trace=False)
    assert doc == {
        "name": "mine",
        "workload": {"model": "tiny", "steps": 7, "num_heads": 2, "seed": 3},
        "strategy": {"name": "tp", "world_size": 4, "options": {"sequence_parallel": True, "extra": 1}},
        "trace": False,
    }
    assert base["strategy"]["world_size"] == 2 and base["workload"]["num_heads"] == 8  # not modified


def test_bench_refuses_a_bad_job_before_launching_anything(tmp_path, monkeypatch):
    from backend.config import get_settings
    from parallab.cli import app as cli

    monkeypatch.setenv("PARALLAB_MAX_WORLD_SIZE", "4")
    monkeypatch.setenv("PARALLAB_HOME", str(tmp_path))
    get_settings.cache_clear()
    try:
        spec = tmp_path / "spec.json"
        spec.write_text(json.dumps({"workload": {"model": "tiny"}, "strategy": {"name": "tp", "world_size": 2}}))
        out = tmp_path / "result.json"
        result = runner.invoke(cli, ["bench", "--spec", str(spec), "--heads", "3", "--out", str(out)])
        assert result.exit_code == 2
        assert "workload.num_heads: hidden_size 64 is not divisible by num_heads 3" in result.output  # the flag beat the file
        result = runner.invoke(cli, ["bench", "--spec", str(spec), "-n", "8", "--out", str(out)])
        assert result.exit_code == 2 and "strategy.world_size: world size 8 is above parallab bench's" in result.output
        assert "worker" not in result.output  # no worker is involved: the CLI speaks of itself
        spec.write_text("[1, 2]")
        result = runner.invoke(cli, ["bench", "--spec", str(spec), "--out", str(out)])
        assert result.exit_code == 2 and "expected a JSON object" in result.output
        assert not out.exists()
    finally:
        get_settings.cache_clear()


def test_the_planner_as_a_user_types_it_plans_the_model_described():
    args = ["--strategy", "ddp", "--world-size", "64", "--layers", "36", "--hidden", "4096", "--heads", "32", "--vocab", "50257"]
    result = runner.invoke(app, [*args, "--precision", "mixed"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "custom (from tiny)" in out and "ffn=11008" in out and "Ψ=7,697,510,400 parameters" in out
    assert "ffn_hidden_size 11,008 derived from hidden_size" in out and "from the preset tiny: seq_len 64" in out
    assert "4+4+8" in out and "ZeRO stage1 (paper, 2+2+12)" in out and "on the wire" in out
    doc = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    assert doc["params_total"] == 7_697_510_400 and doc["workload"]["ffn_hidden_size"] == 11008 and doc["workload"]["custom"] is True
    plain = runner.invoke(app, ["-s", "ddp", "-n", "2"], env={"COLUMNS": "200"}).stdout
    assert "— tiny: L=4" in plain and "custom" not in plain


def test_bench_takes_a_layout_of_degrees_and_refuses_a_bad_one_naming_the_dimension(tmp_path, monkeypatch):
    from backend.config import get_settings
    from parallab.cli import app as cli
    from parallab.commands.jobspec import layout_flags

    assert layout_flags("pp=2,dp_shard=2,tp=2", strategy=None, world_size=None, options={"schedule": "gpipe"}) == (
        "layout",
        8,
        {"schedule": "gpipe", "pp": 2, "dp_shard": 2, "tp": 2},
    )
    monkeypatch.setenv("PARALLAB_HOME", str(tmp_path))
    get_settings.cache_clear()
    try:
        out = tmp_path / "result.json"
        for args, says in [
            (["--layout", "pp=2,dp_shard=2,tp=2", "-n", "4"], "pp=2 × dp_shard=2 × tp=2 make 8 ranks, not the world size 4"),
            (["--layout", "tp=8"], "workload.num_heads: heads (4) is not divisible by 8 (tp=8)"),
            (["--layout", "ep=2,dp_shard=2"], "ep=2 needs a model with experts"),
            (["--layout", "dp=2"], "'dp=2' is not DIM=DEGREE"),
            (["--layout", "pp=2", "-o", "virtual_stages=2"], "strategy.options.virtual_stages: schedule 1f1b runs 1 stage(s) per rank"),
            (["--layout", "pp=2", "-o", "schedule=interleaved_1f1b", "-o", "virtual_stages=4"], "layers (4) is not divisible by 8 stages"),
            (["--layout", "pp=2", "-o", "schedule=interleaved_1f1b", "-o", "microbatches=5"], "in 2 rounds of pp=2"),
            (["--layout", "tp=2", "--strategy", "ddp"], "give one of --layout or --strategy"),
        ]:
            result = runner.invoke(cli, ["bench", *args, "--out", str(out)])
            assert result.exit_code == 2 and says in result.output, (args, result.output)
        assert not out.exists()
    finally:
        get_settings.cache_clear()
