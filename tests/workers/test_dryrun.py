"""The dry run at full scale (`parallab plan --dry-run`, `workers.dryrun`): the real rank code of a
layout at world 512 in one process, under torch's fake process group and fake tensors, held
against the planner. Each rank runs in a forked child; no torchrun.
"""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from parallab.cli import app
from parallab.core.jobs import Limits, ResolvedJob, resolve_job
from parallab.core.spec import JobSpec
from workers.dryrun import DryRunFailed, as_layout_job, dry_run, run_forked

# `small`'s widths with 8 layers and 8 heads: every degree below divides them at world 512.
WORKLOAD = {"model": "small", "num_layers": 8, "num_heads": 8, "global_batch_size": 128, "precision": "bf16"}


def job(world_size: int, layers: int = 8, precision: str = "bf16", **degrees: int) -> ResolvedJob:
    workload = {**WORKLOAD, "num_layers": layers, "precision": precision}
    spec = {"workload": workload, "strategy": {"name": "layout", "world_size": world_size, "options": degrees}}
    return resolve_job(JobSpec.model_validate(spec), Limits())


@pytest.fixture(scope="module")
def three_d():
    """The first stage, a middle one (the busiest pipeline P2P: both ways) and the world's last rank."""
    return dry_run(job(512, pp=8, tp=8, dp_shard=8), ranks=[0, 64, 511])


def test_a_405b_shaped_layout_builds_at_world_512_in_torchtitans_order(three_d):
    assert three_d.mesh == [("pp", 8), ("dp_shard", 8), ("tp", 8)]
    assert [r.coordinates["pp"] for r in three_d.ranks] == [0, 1, 7]
    assert three_d.ranks[-1].rank == 511 and three_d.ranks[-1].coordinates == {"pp": 7, "dp_shard": 7, "tp": 7}
    # every stage's parameters as the planner predicts them: the embedding on the first, the head on the last
    assert three_d.passed, three_d.as_dict()["checks"]
    params = [g for g in three_d.gaps if "params" in g.what]
    assert len(params) == 3 and all(g.measured == g.predicted for g in params), params
    assert params[0].measured != params[1].measured != params[2].measured


def test_every_dimension_issues_the_collectives_the_planner_predicts(three_d):
    """One real step of the 1F1B schedule with FSDP and TP inside each stage, at world 512."""
    checks = {g.what: g for g in three_d.gaps}
    for name in ("tp all_reduce", "tp all_gather", "dp_shard all_gather", "dp_shard reduce_scatter", "pp send", "pp recv"):
        gap = checks[f"{name} bytes per step"]
        assert gap.measured > 0 and gap.ok, gap
    assert not [w for w in checks if w.startswith(("world", "?"))], checks  # every call ran on one mesh dim's group
    assert all(r.state["optimizer"] > 0 for r in three_d.ranks)  # one real AdamW step ran


def test_a_dry_run_of_a_layout_that_does_not_divide_the_heads_fails_on_the_ranks():
    """The rules refuse tp=8 on 4 heads; a job that skipped them fails in the rank code itself."""
    good = as_layout_job(job(64, layers=2, tp=8, dp_shard=8))
    bad = good.model_copy(update={"model": good.model.model_copy(update={"num_heads": 4})})
    with pytest.raises(DryRunFailed, match="rank 0"):
        run_forked(bad, 0, {"model_state_bytes_per_rank": {"params": 0, "grads": 0, "optimizer": 0}})


def test_the_cli_refuses_a_wrong_layout_naming_the_dimension_and_the_numbers():
    result = CliRunner().invoke(app, ["plan", "--dry-run", "--layout", "tp=3,dp_shard=2", "--model", "small"])
    assert result.exit_code == 2, result.output
    assert "tp" in result.output and "3" in result.output and "heads" in result.output


@pytest.mark.parametrize(("layout", "model"), [("cp=2,dp_shard=2", []), ("ep=2,dp_shard=2", ["--experts", "4"])])
def test_the_cli_refuses_a_dimension_that_decides_by_values_naming_it(layout, model):
    """Ring attention's causal block skips and MoE's row counts read values fake tensors lack: a
    clear refusal, not a traceback from the ranks."""
    result = CliRunner().invoke(app, ["plan", "--dry-run", "--layout", layout, "--model", "small", *model])
    assert result.exit_code == 2, result.output
    assert layout.split(",")[0] in result.output and "fake tensor" in result.output, result.output


def test_the_cli_refuses_a_pipeline_of_several_chunks_a_rank_naming_the_option():
    """The dry run answers one stage's shape handshake per rank: several chunks a rank is refused, not guessed."""
    args = ["plan", "--dry-run", "--layout", "pp=2,dp_shard=2", "-o", "schedule=interleaved_1f1b", "-o", "virtual_stages=2"]
    result = CliRunner().invoke(app, [*args, "--model", "small"])
    assert result.exit_code == 2, result.output
    assert "strategy.options.virtual_stages" in result.output and "2 chunks" in result.output, result.output


def test_a_composition_that_drops_a_dimensions_reduction_fails_the_dry_run(monkeypatch):
    """dp_replicate beside tp averages the local gradient shards in one flat all-reduce of its own
    (no DDP or FSDP to do it); drop it, and the dry run sees that dimension's bytes missing.
    fp32: without FSDP a 16-bit recipe's TP all-reduces are partly fp32, which tp's formula does
    not say yet (the dry run's finding, docs/layouts.md)."""
    from workers.strategies import compose

    replicated = job(4, layers=2, precision="fp32", dp_replicate=2, tp=2)
    assert dry_run(replicated, ranks=[0]).passed
    monkeypatch.setattr(compose, "flat_all_reduce_", lambda *args, **kwargs: None)  # the forked rank inherits it
    broken = {g.what: g for g in dry_run(replicated, ranks=[0]).gaps}
    gap = broken["dp_replicate all_reduce bytes per step"]
    assert gap.measured == 0 < gap.predicted and not gap.ok, gap


def tiny_tp(name: str, **options: object) -> ResolvedJob:
    """`tiny` at tp=2 as the preset `tp` (not turned into a layout) or as a layout."""
    opts = {"sequence_parallel": True, **options} if name == "tp" else {"tp": 2, "sequence_parallel": True, **options}
    spec = {"workload": {"model": "tiny", "steps": 1, "warmup_steps": 0}, "strategy": {"name": name, "world_size": 2, "options": opts}}
    return resolve_job(JobSpec.model_validate(spec), Limits())


def test_sequence_parallel_all_reduces_the_norms_gradients_as_predicted():
    """tp=2 with SP: the norms' partial gradients, (2·4 + 1) norms of h=64 fp32, all-reduced over tp."""
    run = dry_run(tiny_tp("layout"))
    checks = {g.what: g for g in run.gaps}
    gap = checks["tp all_reduce bytes per step"]
    assert gap.measured == gap.predicted == 9 * 64 * 4, gap
    assert run.passed, run.as_dict()["checks"]


def test_a_tp_formula_without_the_norms_term_fails_the_dry_run(monkeypatch):
    from parallab.core.dims import tp

    monkeypatch.setattr(tp, "norm_elements", lambda cfg: 0)
    gap = {g.what: g for g in dry_run(tiny_tp("layout")).gaps}["tp all_reduce bytes per step"]
    assert gap.measured > 0 == gap.predicted and not gap.ok, gap


def test_the_tp_preset_keeps_the_embeddings_rows_and_reduces_the_norms(monkeypatch):
    """The `tp` preset itself (the dry run proper runs every job as its layout written out): after
    the step each rank holds the vocab-parallel embedding's gradient as a V/tp shard, like the
    weight — the gradient bytes are the prediction's — and all-reduces SP's norm gradients, one call
    per norm. Without the composition's `lay_out_grads` the embedding's gradient stays whole
    (V·h/2 fp32 more) and the norms' partial sums are never reduced."""
    from parallab.core.prediction import predict
    from workers.strategies import tensor_parallel

    job = tiny_tp("tp")
    predicted = predict(job)
    run = run_forked(job, 0, predicted)
    assert run.state["grads"] == predicted["model_state_bytes_per_rank"]["grads"], run.state
    reduces = [c.nbytes for c in run.calls if c.op == "all_reduce"]
    assert reduces == [64 * 4] * 9 and sum(reduces) == predicted["comm_bytes_per_step"]["all_reduce"]

    monkeypatch.setattr(tensor_parallel, "lay_out_grads", lambda model: None)  # the composition's step for tp
    broken = run_forked(job, 0, predicted)
    assert broken.state["grads"] - run.state["grads"] == 256 * 64 // 2 * 4, broken.state
    assert not [c for c in broken.calls if c.op == "all_reduce"]
