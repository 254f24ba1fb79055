"""Expert parallelism: the EP layer equals the same MoE on one rank; the moe job equals `single`."""

from __future__ import annotations

import json

import pytest

from parallab.core.rundir import RunDir
from tests.workers.conftest import HarnessSpec

# The group's first test pays for its folded launches, whichever file it is in (test_layouts.py).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


@pytest.mark.parametrize("n", [2, 4])
def test_ep_without_drops_equals_one_rank(ring_moe_results, n):
    errors = ring_moe_results[f"moe n={n} no-drop"]
    assert errors.pop("dropped_total") == 0
    assert max(errors.values()) <= 1e-5, errors


@pytest.mark.parametrize("n", [2, 4])
def test_ep_with_drops_equals_one_rank_routing_in_n_groups(ring_moe_results, n):
    errors = ring_moe_results[f"moe n={n} drops"]
    assert errors.pop("dropped_total") > 0, "capacity 0.5 must drop some slots"
    assert max(errors.values()) <= 1e-5, errors


HARNESS_JOBS: list[HarnessSpec] = [
    ("moe", 2, {}, {}),  # test_prediction_agreement.py reads its traffic: one launch for both
    ("tp", 2, {}, {"num_experts": 4, "first_dense_layers": 1}),
    ("moe", 2, {}, {"precision": "bf16"}, False),  # untraced: its test reads the checks alone
]
"""What this file reads from `harness_job`, declared to the `tiny-runs` group's folded launches
(tests/workers/conftest.py): with the group's other 2-rank jobs, whichever file asks first."""


@pytest.fixture(scope="module", autouse=True)
def moe_runs(harness_jobs) -> None:
    """The three 2-rank jobs below, folded into the group's 2-rank launch (`harness_jobs`), read
    through `harness_job`'s memo."""
    harness_jobs(HARNESS_JOBS)


def test_moe_job_agrees_with_single_and_reports_routing(harness_job):
    doc, run_dir = harness_job("moe", 2)
    assert doc.summary.loss_max_rel_diff_vs_reference <= 1e-4, doc.loss
    check = doc.summary.gradient_check  # experts gathered whole, routed like the reference
    assert check.passed and {f"layers.0.feed_forward.{w}" for w in ("w1", "w2", "w3")} <= set(check.per_param), check
    # No other job shares this reference (MoE routes in dp groups): rank 0 computed it in-job.
    phases = [json.loads(line)["phase"] for line in RunDir(run_dir).progress.read_text().splitlines()]
    total = doc.workload["warmup_steps"] + doc.workload["steps"]
    assert phases.count("reference") == total and phases.count("train") == doc.workload["steps"]
    experts = doc.workload["num_experts"]
    for rank in doc.ranks:
        moe = rank.moe
        assert len(moe["tokens_per_expert"]) == experts
        # every token of every measured step, top_k slots each, all layers, all ranks
        steps, tokens = doc.workload["steps"], doc.workload["global_batch_size"] * doc.workload["seq_len"]
        assert sum(moe["tokens_per_expert"]) == steps * tokens * doc.workload["top_k"] * doc.workload["num_layers"]
        assert moe["imbalance"] >= 1.0 and moe["dropped_tokens"] >= 0
    # half the experts per rank: expert parameters are not replicated
    assert doc.ranks[0].model_state_bytes.params < 0.75 * 4 * sum_params(doc)


def sum_params(doc) -> int:
    from parallab.core.families import param_counts
    from parallab.core.model import SHAPE_FIELDS, ModelConfig

    return param_counts(ModelConfig.model_validate({k: doc.workload[k] for k in SHAPE_FIELDS})).total


def test_tp_keeps_the_experts_whole_and_matches_single(harness_job):
    """Tensor parallelism splits an MoE model's attention and leaves its router and experts whole
    on each rank: both ranks route the same rows as `single` does (the capacity drops included), so
    loss and every gradient match it, and the all-reduces are the attention's alone in MoE blocks
    (2 per MoE layer, 4 per dense first layer: `parallab.core.dims.tp.split_blocks`)."""
    doc, _ = harness_job("tp", 2, workload={"num_experts": 4, "first_dense_layers": 1})
    assert doc.summary.loss_max_rel_diff_vs_reference <= 1e-5, doc.loss
    check = doc.summary.gradient_check
    assert check is not None and check.passed, check
    assert {f"layers.1.feed_forward.{w}" for w in ("w1", "w2", "w3", "router.weight")} <= set(check.per_param), check
    measured, predicted = doc.summary.comm_bytes_per_step, doc.prediction.comm_bytes_per_step
    assert predicted and measured == predicted, (measured, predicted)
    # the experts are whole on each rank: the measured model state is the prediction's, which counts them unsplit
    assert not [f for f in doc.flags if f.metric.startswith(("comm_bytes", "model_state"))], doc.flags


def test_moe_in_bf16_passes_against_fp32_with_each_ranks_routing_gathered(harness_job):
    """Each ep rank records the experts its rows chose in the check's step, rank 0 gathers them in
    the global batch's order (`workers.harness.routing.gathered`) and the fp32 reference replays
    them. Without the replay this run failed the bf16 tolerance at 0.091 (tokens whose top-2 flip
    under rounding train other experts); with it, 0.010."""
    doc, _ = harness_job("moe", 2, workload={"precision": "bf16"}, trace=False)
    check = doc.summary.gradient_check
    assert check is not None and check.passed and check.noise_max_rel_err is not None, check
    assert check.tolerance == pytest.approx(min(5e-2, 2 * check.noise_max_rel_err)) and check.tolerance < 5e-2, "bf16's noise, doubled"
    assert check.max_rel_err < 0.03, check
    routing = doc.summary.routing_check  # the reference's own top-k against the gathered choices
    assert routing is not None and routing.passed and routing.unexplained_rate == 0.0, routing
