"""The one gap rule (`parallab.core.flags`): what is flagged, and what is not."""

from __future__ import annotations

import pytest

from parallab.core.flags import FLAG_TOLERANCE, agreement, prediction_flags
from parallab.core.metrics import UNTRACED_FIELDS, summarize
from parallab.core.recipes import LOSS_TOLERANCE
from parallab.core.result import Flag

STATE = {"params": 1000, "grads": 1000, "optimizer": 2000}


def rank(**state: int) -> dict:
    return {"rank": 0, "model_state_bytes": {**STATE, **state}}


def flagged(**kwargs) -> list[str]:
    return [f["metric"] for f in prediction_flags(**kwargs)]


@pytest.mark.parametrize(("measured", "is_flagged"), [(1090, False), (910, False), (1110, True), (890, True)])
def test_a_gap_of_nine_percent_is_not_flagged_and_eleven_percent_is(measured, is_flagged):
    kwargs = {"prediction": {"comm_bytes_per_step": {"all_reduce": 1000}}, "summary": {"comm_bytes_per_step": {"all_reduce": measured}}}
    assert flagged(ranks=[], **kwargs) == (["comm_bytes_per_step.all_reduce"] if is_flagged else [])
    assert FLAG_TOLERANCE == 0.10


def test_a_stored_flag_carries_the_figures_and_validates_as_a_result_flag():
    (flag,) = prediction_flags(
        prediction={"comm_bytes_per_step": {"all_gather": 1000}}, summary={"comm_bytes_per_step": {"all_gather": 1200}}, ranks=[]
    )
    assert flag == {"metric": "comm_bytes_per_step.all_gather", "predicted": 1000.0, "measured": 1200.0, "rel_gap": pytest.approx(0.2)}
    Flag.model_validate(flag)


def test_an_op_nobody_predicted_is_flagged_only_above_one_percent_of_the_predicted_total():
    prediction = {"comm_bytes_per_step": {"all_reduce": 1000, "all_gather": 1000}}
    small = {"comm_bytes_per_step": {"all_reduce": 1000, "all_gather": 1000, "broadcast": 20}}  # 1% of 2000
    assert flagged(prediction=prediction, summary=small, ranks=[]) == []
    large = {"comm_bytes_per_step": {"all_reduce": 1000, "all_gather": 1000, "broadcast": 21}}
    assert flagged(prediction=prediction, summary=large, ranks=[]) == ["comm_bytes_per_step.broadcast"]


def test_a_predicted_op_that_never_happened_is_flagged():
    assert flagged(prediction={"comm_bytes_per_step": {"send": 1000}}, summary={}, ranks=[]) == ["comm_bytes_per_step.send"]


def test_model_state_is_compared_per_component_in_fp32():
    prediction = {"model_state_bytes_per_rank": STATE}
    assert flagged(prediction=prediction, summary={}, ranks=[rank(), rank(grads=1050)], precision="fp32") == []
    assert flagged(prediction=prediction, summary={}, ranks=[rank(), rank(grads=1200)], precision="fp32") == [
        "model_state_bytes_per_rank.grads"
    ]
    rows = agreement(prediction=prediction, summary={}, ranks=[rank()], precision="fp32")
    assert [r.metric for r in rows] == [f"model_state_bytes_per_rank.{p}" for p in ("params", "grads", "optimizer")]


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_model_state_is_compared_per_component_in_mixed_precision_too(precision):
    # the prediction is of what runs (autocast: 4+4+8), so a component that differs is caught even
    # when the total agrees — the old total-only rule passed ZeRO's 2+2+12 against 4+4+8
    prediction = {"model_state_bytes_per_rank": STATE}
    rows = agreement(prediction=prediction, summary={}, ranks=[rank()], precision=precision)
    assert [(r.metric, r.flagged) for r in rows] == [(f"model_state_bytes_per_rank.{p}", False) for p in ("params", "grads", "optimizer")]
    zero_split = {"model_state_bytes_per_rank": {"params": 500, "grads": 500, "optimizer": 3000}}  # same 4000 in total
    assert flagged(prediction=zero_split, summary={}, ranks=[rank()], precision=precision) == [
        f"model_state_bytes_per_rank.{p}" for p in ("params", "grads", "optimizer")
    ]


def test_the_bubble_is_compared_when_both_sides_have_one():
    prediction = {"bubble_fraction": 0.2}
    assert flagged(prediction=prediction, summary={"bubble_fraction": 0.21}, ranks=[]) == []
    assert flagged(prediction=prediction, summary={"bubble_fraction": 0.3}, ranks=[]) == ["bubble_fraction"]
    assert agreement(prediction=prediction, summary={"bubble_fraction": None}, ranks=[]) == []


def test_rel_gap_is_signed_on_the_row_and_absolute_on_the_flag():
    kwargs = {
        "prediction": {"comm_bytes_per_step": {"all_reduce": 1000}},
        "summary": {"comm_bytes_per_step": {"all_reduce": 800}},
        "ranks": [],
    }
    (row,) = agreement(**kwargs)
    assert row.rel_gap == pytest.approx(-0.2)
    assert prediction_flags(**kwargs)[0]["rel_gap"] == pytest.approx(0.2)


def test_wire_bytes_are_held_against_their_prediction_once_they_are_measured():
    prediction = {"comm_bytes_per_step": {"all_reduce": 1000}, "wire_bytes_per_step": {"all_reduce": 1500}}
    summary = {"comm_bytes_per_step": {"all_reduce": 1000}}
    assert [r.metric for r in agreement(prediction=prediction, summary=summary, ranks=[])] == ["comm_bytes_per_step.all_reduce"]
    summary["wire_bytes_per_step"] = {"all_reduce": 1000}  # e.g. measured over a smaller group than predicted
    assert flagged(prediction=prediction, summary=summary, ranks=[]) == ["wire_bytes_per_step.all_reduce"]
    summary["wire_bytes_per_step"] = {"all_reduce": 1500}
    assert flagged(prediction=prediction, summary=summary, ranks=[]) == []


def test_activations_are_held_against_the_measured_split():
    prediction = {"activation_bytes_per_rank": 1000}
    ranks = [{"memory_breakdown": {"activations": 900}}, {"memory_breakdown": {"activations": 1050}}]
    (row,) = agreement(prediction=prediction, summary={}, ranks=ranks)
    assert (row.metric, row.measured, row.flagged) == ("activation_bytes_per_rank", 1050, False)  # the max over ranks
    assert flagged(prediction=prediction, summary={}, ranks=[{"memory_breakdown": {"activations": 1200}}]) == ["activation_bytes_per_rank"]
    assert agreement(prediction=prediction, summary={}, ranks=[{"rank": 0}]) == []  # no split measured: no row


def test_a_failed_gradient_check_is_flagged_and_a_passed_one_is_not():
    check = {"passed": False, "tolerance": 1e-5, "max_rel_err": 1.0, "worst_param": "layers.0.attention.wq.weight", "params_checked": 39}
    (flag,) = prediction_flags(prediction={}, summary={"gradient_check": check}, ranks=[])
    assert flag == {"metric": "gradient_check.max_rel_err", "predicted": 1e-5, "measured": 1.0, "rel_gap": pytest.approx(99999.0)}
    assert Flag.model_validate(flag)
    passed = {**check, "passed": True, "max_rel_err": 2e-7}
    assert flagged(prediction={}, summary={"gradient_check": passed}, ranks=[]) == []
    assert [r.metric for r in agreement(prediction={}, summary={"gradient_check": passed}, ranks=[])] == ["gradient_check.max_rel_err"]


# ---- checks with a verdict of their own: loss, replicas; and no flag without a measurement ----


def loss_summary(drift: float, precision_steps: int = 5) -> dict:
    """A worker's summary of a run whose loss left the reference by `drift` (relative) at one step."""
    reference = [4.0 - 0.1 * i for i in range(precision_steps)]
    values = list(reference)
    values[2] *= 1 + drift
    return summarize(
        ranks=[{"rank": 0, "step_times_s": [0.1, 0.1]}],
        tokens_per_step=512,
        samples_per_step=4,
        flops_per_token=None,
        device_name=None,
        world_size=1,
        loss={"values": values, "reference": reference},
    )


def test_a_loss_drift_of_1e_3_injected_into_one_step_is_flagged_at_fp32():
    (flag,) = prediction_flags(prediction={}, summary=loss_summary(1e-3), ranks=[], precision="fp32")
    assert flag["metric"] == "loss_max_rel_diff_vs_reference"
    assert flag["predicted"] == LOSS_TOLERANCE["fp32"] and flag["measured"] == pytest.approx(1e-3)


@pytest.mark.parametrize(("drift", "precision", "is_flagged"), [(1e-6, "fp32", False), (1e-3, "bf16", False), (3e-2, "bf16", True)])
def test_the_loss_is_held_to_its_recipes_tolerance(drift, precision, is_flagged):
    metrics = flagged(prediction={}, summary=loss_summary(drift), ranks=[], precision=precision)
    assert metrics == (["loss_max_rel_diff_vs_reference"] if is_flagged else [])


def test_every_run_with_a_reference_gets_a_loss_row_even_without_a_prediction():
    rows = agreement(prediction={}, summary=loss_summary(0.0), ranks=[])
    assert [r.metric for r in rows] == ["loss_max_rel_diff_vs_reference"] and not rows[0].flagged
    assert agreement(prediction={}, summary={"loss_max_rel_diff_vs_reference": None}, ranks=[]) == []


def test_an_untraced_run_gets_no_byte_or_bubble_flag():
    prediction = {"comm_bytes_per_step": {"all_reduce": 1000}, "wire_bytes_per_step": {"all_reduce": 1000}, "bubble_fraction": 0.2}
    ranks = [{"rank": r, "step_times_s": [0.1], "profiled_steps": 0} for r in range(2)]
    summary = summarize(ranks=ranks, tokens_per_step=1, samples_per_step=1, flops_per_token=None, device_name=None, world_size=2)
    assert summary["not_measured"] == list(UNTRACED_FIELDS) and summary["comm_bytes_per_step"] == {}
    assert flagged(prediction=prediction, summary=summary, ranks=ranks) == []
    # Traced, the same missing all-reduce is a real gap: flagged.
    traced = [{**r, "profiled_steps": 3} for r in ranks]
    summary = summarize(ranks=traced, tokens_per_step=1, samples_per_step=1, flops_per_token=None, device_name=None, world_size=2)
    assert summary["not_measured"] == []
    assert flagged(prediction=prediction, summary=summary, ranks=traced) == ["comm_bytes_per_step.all_reduce"]


def test_a_failed_replica_check_is_a_flag_naming_the_parameter_and_the_ranks():
    check = {
        "passed": False,
        "tolerance": 1e-5,
        "max_rel_diff": 0.7,
        "worst_param": "layers.0.feed_forward.w1.weight",
        "worst_ranks": [0, 1],
        "copies_compared": 78,
    }
    (row,) = [r for r in agreement(prediction={}, summary={"replica_check": check}, ranks=[]) if r.metric.startswith("replica")]
    assert row.flagged and "layers.0.feed_forward.w1.weight on ranks 0, 1" in row.label
    assert flagged(prediction={}, summary={"replica_check": {**check, "passed": True, "max_rel_diff": 0.0}}, ranks=[]) == []
