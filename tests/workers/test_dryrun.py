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


def job(world_size: int, layers: int = 8, **degrees: int) -> ResolvedJob:
    spec = {"workload": {**WORKLOAD, "num_layers": layers}, "strategy": {"name": "layout", "world_size": world_size, "options": degrees}}
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
