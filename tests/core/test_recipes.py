"""The recipe dimensions: the reference's recipe, micro-batch size, tolerances, and the rules."""

from __future__ import annotations

from parallab.core.jobs import resolve_job
from parallab.core.recipes import (
    ACCUMULATION_TOLERANCE,
    DIMENSION_NAMES,
    LOSS_TOLERANCE,
    loss_tolerance,
    micro_batch_size,
    recipe_of,
    reference_workload,
)
from parallab.core.spec import JobSpec, Workload


def job(strategy: str, world: int, options: dict | None = None, **workload):
    return resolve_job(
        JobSpec.model_validate(
            {"workload": {"model": "tiny", **workload}, "strategy": {"name": strategy, "world_size": world, "options": options or {}}}
        )
    )


def test_the_reference_is_the_same_workload_in_fp32_without_recomputation_or_accumulation():
    wl = {
        "model": "tiny",
        "precision": "bf16",
        "activation_checkpointing": "full",
        "grad_accumulation_steps": 4,
        "seed": 3,
        "global_batch_size": 16,
    }
    ref = reference_workload(wl)
    assert ref == {**wl, "precision": "fp32", "activation_checkpointing": "none", "grad_accumulation_steps": 1, "compile": False}
    Workload.model_validate(ref)


def test_micro_batch_size_is_sequences_per_forward_on_a_rank():
    assert micro_batch_size(job("ddp", 2, global_batch_size=16)) == 8
    assert micro_batch_size(job("ddp", 2, global_batch_size=16, grad_accumulation_steps=2)) == 4
    assert micro_batch_size(job("tp", 2, global_batch_size=16)) == 16
    assert micro_batch_size(job("pp", 2, {"microbatches": 8}, global_batch_size=16)) == 2  # the pipeline cuts the step again
    assert micro_batch_size(job("pp", 2, {"microbatches": 4}, global_batch_size=16, grad_accumulation_steps=2)) == 2


def test_recipe_of_lists_every_dimension():
    recipe = recipe_of(job("fsdp", 2, precision="bf16", activation_checkpointing="selective", global_batch_size=8))
    assert set(recipe) == set(DIMENSION_NAMES)
    assert recipe == {"precision": "bf16", "activation_checkpointing": "selective", "grad_accumulation_steps": 1, "micro_batch_size": 4}


def test_tolerances_widen_as_the_format_narrows():
    assert ACCUMULATION_TOLERANCE < LOSS_TOLERANCE["fp32"] < LOSS_TOLERANCE["fp16"] <= LOSS_TOLERANCE["bf16"] < LOSS_TOLERANCE["fp8"]
    assert loss_tolerance("bf16") == LOSS_TOLERANCE["bf16"]
