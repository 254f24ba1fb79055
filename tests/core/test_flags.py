"""The one gap rule (`parallab.core.flags`): what is flagged, and what is not."""

from __future__ import annotations

import pytest

from parallab.core.flags import FLAG_TOLERANCE, agreement, prediction_flags
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
