"""The planner's memory model over a step (`parallab.core.memory_curve`): pure, on the phase names the harness marks."""

from __future__ import annotations

from typing import Any

import pytest

from parallab.core import memory_curve as mc
from parallab.core.jobs import Limits, resolve_job
from parallab.core.prediction import predict
from parallab.core.spec import JobSpec

MIB = 1 << 20
PHASES = [
    "step start",
    "zero_grad",
    "after zero_grad",
    "forward tok_embeddings",
    "forward layers.0",
    "forward layers.1",
    "forward norm",
    "forward output",
    "backward output",
    "backward norm",
    "backward layers.1",
    "backward layers.0",
    "backward tok_embeddings",
    "optimizer",
    "after optimizer",
]
INPUTS = mc.CurveInputs(
    params=4 * MIB,
    grads=4 * MIB,
    optimizer=8 * MIB,
    layers=2,
    layer_grad_bytes=MIB,
    root_grads={"tok_embeddings": MIB, "output": MIB},
    activation_per_layer=3 * MIB,
    head=2 * MIB,
    logits_gradient=MIB,
)


def _by_phase(inputs: mc.CurveInputs = INPUTS, **kw: int) -> dict[str, dict[str, int]]:
    return {p.phase: p.categories for p in mc.curve(inputs, PHASES, **kw)}


def test_the_curve_has_the_measured_phases_in_their_order_and_its_categories_sum() -> None:
    points = mc.curve(INPUTS, PHASES)
    assert [p.phase for p in points] == PHASES
    assert all(sum(p.categories.values()) == p.allocated and tuple(p.categories) == mc.CATEGORIES for p in points)


def test_activations_rise_per_layer_through_the_forward_and_fall_through_the_backward() -> None:
    c = _by_phase()
    act = [c[p]["activations"] for p in PHASES]
    assert c["forward layers.0"]["activations"] == 3 * MIB and c["forward layers.1"]["activations"] == 6 * MIB
    assert c["forward output"]["activations"] == 8 * MIB and c["forward norm"]["activations"] == 6 * MIB  # the head's on the last
    assert c["backward layers.1"]["activations"] == 6 * MIB and c["backward layers.0"]["activations"] == 3 * MIB
    assert act[PHASES.index("backward tok_embeddings")] == 0 == act[PHASES.index("optimizer")]
    assert c["backward output"]["temporaries"] == MIB  # the logits' gradient, in the head's backward only
    assert sum(v["temporaries"] for v in c.values()) == MIB


def test_gradients_are_freed_by_zero_grad_and_come_back_layer_by_layer() -> None:
    c = _by_phase()
    assert c["step start"]["grads"] == 4 * MIB and c["after zero_grad"]["grads"] == 0 == c["forward layers.1"]["grads"]
    assert [c[p]["grads"] for p in ("backward output", "backward layers.1", "backward layers.0", "backward tok_embeddings")] == [
        MIB,
        2 * MIB,
        3 * MIB,
        4 * MIB,
    ]
    assert c["optimizer"]["grads"] == 4 * MIB


def test_model_state_is_constant_and_the_optimizers_moments_appear_at_the_first_step() -> None:
    later, first = _by_phase(step=3), _by_phase(step=0)
    assert {v["params"] for v in later.values()} == {4 * MIB} and {v["optimizer"] for v in later.values()} == {8 * MIB}
    assert [first[p]["optimizer"] for p in PHASES] == [0] * PHASES.index("optimizer") + [8 * MIB] * 2
    assert first["step start"]["grads"] == 0  # nothing to hold before the first backward


def test_fsdp_holds_one_gathered_layer_forward_two_and_its_gradients_backward_and_ddp_its_buckets() -> None:
    fsdp = _by_phase(INPUTS.model_copy(update={"gathered_root": MIB // 2, "gathered_layer": MIB, "unsharded_layer_grads": MIB}))
    assert fsdp["forward layers.0"]["comm_buffers"] == MIB // 2 + MIB
    assert fsdp["backward layers.0"]["comm_buffers"] == MIB // 2 + 3 * MIB
    assert fsdp["forward norm"]["comm_buffers"] == MIB // 2  # the root group only, between the layers
    assert fsdp["step start"]["comm_buffers"] == 0 == fsdp["optimizer"]["comm_buffers"]  # resharded outside the passes
    ddp = _by_phase(INPUTS.model_copy(update={"buckets": 4 * MIB}))
    assert {v["comm_buffers"] for v in ddp.values()} == {4 * MIB}


def test_a_pipeline_stage_holds_its_other_microbatches_beside_the_one_it_computes() -> None:
    stage = INPUTS.model_copy(update={"microbatches": 3})
    phases = ["forward tok_embeddings", "forward layers.2", "forward layers.3", "backward layers.3", "backward layers.2", "optimizer"]
    c = {p.phase: p.categories for p in mc.curve(stage, phases)}
    assert c["forward tok_embeddings"]["activations"] == 2 * 2 * 3 * MIB and c["optimizer"]["activations"] == 0
    assert c["forward layers.2"]["activations"] == (2 * 2 + 1) * 3 * MIB  # 2 earlier micro-batches × 2 layers, + this one's first
    assert c["backward layers.3"]["activations"] == (2 * 2 + 2) * 3 * MIB


def test_the_gap_sentence_names_the_phase_where_measurement_and_model_part_most() -> None:
    predicted = mc.curve(INPUTS, PHASES)
    measured: list[dict[str, Any]] = [{"phase": p.phase, "allocated": p.allocated} for p in predicted]
    assert all(r["gap"] == 0 for r in mc.gaps(measured, predicted))
    k = PHASES.index("backward layers.1")
    measured[k] = {**measured[k], "allocated": measured[k]["allocated"] + 3 * MIB // 2}  # break it on purpose: 1.5 MiB more
    measured.append({"phase": "forward layers.0", "allocated": predicted[4].allocated + MIB})  # a smaller gap elsewhere
    worst = mc.largest_gap(mc.gaps(measured, predicted))
    assert worst is not None and worst["phase"] == "backward layers.1" and worst["gap"] == 3 * MIB // 2
    share = 1.5 / (predicted[k].allocated / MIB) * 100
    assert mc.gap_sentence(worst) == f"largest gap: +1.50 MiB ({share:+.1f} %) in backward layers.1"


def test_classify_reads_the_block_index_off_the_module_path() -> None:
    assert mc.classify("backward lab.blocks.3") == ("backward", "lab.blocks.3", 3)
    assert mc.classify("forward output") == ("forward", "output", None)
    assert mc.classify("optimizer") == ("optimizer", "", None)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "tp", "pp"])
def test_the_prediction_block_carries_the_inputs_per_kind_of_rank(strategy: str) -> None:
    job = resolve_job(
        JobSpec.model_validate({"workload": {"model": "tiny"}, "strategy": {"name": strategy, "world_size": 2}}), Limits(max_world_size=8)
    )
    prediction = predict(job)
    curves = [mc.CurveInputs.model_validate(c) for c in prediction["memory_curve"]]
    assert len(curves) == (2 if strategy == "pp" else 1)
    busiest = prediction["model_state_bytes_per_rank"]
    assert max(c.params for c in curves) == busiest["params"]
    assert (curves[0].buckets > 0) == (strategy == "ddp") and (curves[0].gathered_layer > 0) == (strategy == "fsdp")
    if strategy == "pp":  # the embeddings' gradients on the first stage, the head's on the last
        assert set(curves[0].root_grads) == {"tok_embeddings"} and set(curves[1].root_grads) == {"norm", "output"}
        assert curves[1].head > 0 == curves[0].head
        assert mc.for_rank(prediction["memory_curve"], 1, 2) == curves[1]
    # the layers' and the root's gradients are the rank's gradients
    assert curves[-1].layers * curves[-1].layer_grad_bytes + sum(curves[-1].root_grads.values()) == curves[-1].grads
