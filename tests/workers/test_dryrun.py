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
