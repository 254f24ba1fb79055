"""Expert parallelism: the EP layer equals the same MoE on one rank; the moe job equals `single`."""

from __future__ import annotations

import json

import pytest

from parallab.core.rundir import RunDir

pytestmark = pytest.mark.slow


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
