"""Composed layouts through the real entry point (torchrun, gloo, `tiny`): each 2 × 2 pair at
world 4 (cp and ep beside dp_shard included, ep on a MoE `tiny`) and pp × dp_shard × tp at world 8
agrees with `single` — loss within 1e-5, the gradient check passing — and measures, op by op,
exactly the communication its dimensions predict (the router's all-to-alls on the ranks' mean).

`layout_runs` runs every case once per session through `harness_jobs`: the seven at world 4 in
one launch (each rank runs the harness's `run_training` for each job in turn, jobs_driver.py),
with test_strategies.py's 4-rank jobs when it runs in the same session (`HARNESS_JOBS`, declared
to the `tiny-runs` group), the one at world 8 through the worker's launcher; they are memoised
with `harness_job`'s, so `hybrid` is shared with test_strategies.py. Each test reads its result.
"""

from __future__ import annotations

from typing import Any

import pytest

from parallab.core.result import ResultDocument

# The first test pays for the session's two launches (7 jobs at 4 ranks, with test_strategies' 3
# more when both run, 1 at 8) on 2 cores: more than the suite's 600 s per test when the machine is loaded.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

MOE: dict[str, Any] = {"num_experts": 4, "capacity_factor": 2.0}
"""ep needs a model with experts: tiny with 4 (two a rank at ep=2, FSDP halves each slice). A
capacity of num_experts / top_k × the even share is every token an expert can get: no slot is
ever dropped, so each rank's all-to-alls carry every slot it routes (see ROUTED)."""

ROUTED = frozenset({"all_to_all"})
"""Ops whose bytes on one rank follow its router: a rank receives the rows its experts were sent.
What every rank sends is fixed when nothing is dropped, and all rows sent are received, so the
ranks' mean is the prediction (even routing) exactly; the summary's max over ranks is above it by
the routing's imbalance (within the flag tolerance, asserted by the absence of a flag)."""

LAYOUTS: dict[str, tuple[str, int, dict[str, Any], dict[str, Any]]] = {
    "dp_replicate×dp_shard": ("hsdp", 4, {"dp_replicate": 2}, {}),
    "dp_shard×tp": ("hybrid", 4, {"tp": 2}, {}),
    "dp_replicate×tp": ("layout", 4, {"dp_replicate": 2, "tp": 2}, {}),
    "pp×dp_shard": ("layout", 4, {"pp": 2, "dp_shard": 2}, {}),
    "pp×tp": ("layout", 4, {"pp": 2, "tp": 2}, {}),
    "cp×dp_shard": ("layout", 4, {"cp": 2, "dp_shard": 2}, {}),
    "ep×dp_shard": ("layout", 4, {"ep": 2, "dp_shard": 2}, MOE),
    "pp×dp_shard×tp": ("3d", 8, {}, {}),
}

HARNESS_JOBS = list(LAYOUTS.values())
"""What this file reads, declared to the `tiny-runs` group's folded launches (tests/workers/conftest.py)."""


@pytest.fixture(scope="session")
def layout_runs(harness_jobs) -> dict[str, ResultDocument]:
    """The seven 4-rank layouts in one launch, pp × dp_shard × tp alone at 8 (`harness_jobs`)."""
    runs = harness_jobs(list(LAYOUTS.values()))
    return {key: doc for key, (doc, _) in zip(LAYOUTS, runs, strict=True)}


@pytest.mark.parametrize("key", list(LAYOUTS))
def test_a_composed_layout_trains_like_single(layout_runs, key):
    doc = layout_runs[key]
    assert len(doc.ranks) == doc.strategy.world_size == LAYOUTS[key][1]
    assert doc.summary.loss_max_rel_diff_vs_reference <= 1e-5, doc.loss
    check = doc.summary.gradient_check  # every parameter, gathered across every dimension
    assert check is not None and check.passed and check.params_checked == len(check.per_param) >= 39, check


@pytest.mark.parametrize("key", list(LAYOUTS))
def test_a_composed_layout_communicates_what_its_dimensions_predict(layout_runs, key):
    doc = layout_runs[key]
    predicted, measured = doc.prediction.comm_bytes_per_step, doc.summary.comm_bytes_per_step
    assert predicted and set(measured) == set(predicted), (measured, predicted)
    fixed = {op: b for op, b in measured.items() if op not in ROUTED}
    assert fixed == {op: b for op, b in predicted.items() if op not in ROUTED}, (measured, predicted)
    for op in ROUTED & set(predicted):
        assert all(r.moe is not None and r.moe["dropped_tokens"] == 0 for r in doc.ranks), [r.moe for r in doc.ranks]
        per_rank = [sum(o.bytes for o in r.comm if o.op == op) for r in doc.ranks]
        # each rank's figure is its per-step mean, rounded to a byte: the ranks' mean is exact to that rounding
        assert sum(per_rank) / len(per_rank) == pytest.approx(predicted[op], abs=len(per_rank)), (op, per_rank, predicted[op])
    assert not [f for f in doc.flags if f.metric.startswith("comm_bytes_per_step")]


def test_a_pipeline_layout_reports_its_loss_from_the_last_stage_of_one_replica(layout_runs):
    doc = layout_runs["pp×dp_shard"]
    assert all(v > 0 for v in doc.loss.values) and len(doc.loss.values) == doc.workload["steps"]


def test_the_critical_path_of_a_pipeline_layout_shows_its_bubble_and_its_sends(harness_job):
    """pp × dp_shard: the path crosses the stages' compute, the pipeline's sends/receives lie on it
    as transfer, a stage's wait for its input as bubble, and its parts add up to its length."""
    doc, _ = harness_job(*LAYOUTS["pp×dp_shard"])
    cp = doc.critical_path
    assert cp is not None and cp.steps >= 1 and cp.ranks == [0, 1, 2, 3] and not cp.skipped, cp
    parts = cp.parts_s
    assert parts.get("bubble", 0) > 0, parts
    assert any(p.startswith("transfer pp ") for p in parts), parts
    assert any(p.startswith("compute ") for p in parts), parts
    assert sum(parts.values()) == pytest.approx(cp.length_s, rel=1e-6)
    # The drawn path is one step's (the median's): its pipeline transfer lies on it and it draws
    # only parts the mean counts. Whether that one step waited on its input depends on the
    # scheduler (a stage slowed by a busy machine finds its input already there, and the path then
    # stays on that stage: a clean-clone run drew rank 3 alone, its receive as transfer): the
    # bubble is asserted over every step, above, and the move to the rank a wait was for is held
    # on synthetic steps (tests/core/test_critpath.py), not on the drawn one.
    drawn = {s.part for s in cp.path}
    assert drawn <= set(parts) and any(p.startswith("transfer pp ") for p in drawn), (drawn, parts)
    assert {s.rank for s in cp.path} == set(cp.path_ranks_visited) and set(cp.path_ranks_visited) <= set(cp.ranks), cp.path_ranks_visited
    # each rank's split step covers it exactly
    assert sum(cp.rank_parts_s.values()) == pytest.approx(cp.rank_step_s, rel=1e-6)
    short = doc.summary.critical_path  # the summary keeps the length and parts
    assert short is not None and short.parts_s == cp.parts_s and short.ranks_visited == cp.path_ranks_visited
