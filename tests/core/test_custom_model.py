"""A shape the user types is a consistent model: the SwiGLU width follows a new hidden size, the model
is labelled custom, Ψ counts what is described — and stored workloads still resolve as they were."""

from __future__ import annotations

import pytest

from parallab.core.families import param_counts
from parallab.core.jobs import ResolvedJob, resolve_job, workload_custom_fields
from parallab.core.model import PRESETS, SHAPE_FIELDS, swiglu_ffn
from parallab.core.spec import JobSpec, Workload


def job(strategy: str = "ddp", n: int = 2, **workload) -> ResolvedJob:
    return resolve_job(JobSpec.model_validate({"workload": {"model": "tiny", **workload}, "strategy": {"name": strategy, "world_size": n}}))


@pytest.mark.parametrize(("h", "f"), [(64, 256), (128, 512), (768, 2048), (4096, 11008), (8192, 22016)])
def test_swiglu_width_is_eight_thirds_h_rounded_up_to_256(h, f):
    assert swiglu_ffn(h) == f and f % 256 == 0 and f >= 8 * h / 3 > f - 256


def test_a_new_hidden_size_without_an_ffn_gets_its_swiglu_width():
    assert job(hidden_size=128).model.ffn_hidden_size == 512
    assert job(hidden_size=128, ffn_hidden_size=300).model.ffn_hidden_size == 300  # given: kept
    assert job(hidden_size=64).model.ffn_hidden_size == 256  # the preset's own width: the preset's ffn
    assert job(model="small", hidden_size=256).model.ffn_hidden_size == PRESETS["small"].config.ffn_hidden_size == 1024


def test_the_gpt_of_36_layers_and_width_4096_has_the_parameters_it_describes():
    j = job("ddp", 64, num_layers=36, hidden_size=4096, num_heads=32, vocab_size=50257, precision="bf16")
    h, f, v = 4096, 11008, 50257
    # per block: q, k, v, o (4h²), SwiGLU w1, w3, w2 (3hf), two RMSNorm weights (2h); untied embedding
    # and LM head (2Vh) and the final norm (h)
    assert param_counts(j.model).total == 36 * (4 * h * h + 3 * h * f + 2 * h) + 2 * v * h + h == 7_697_510_400
    # num_kv_heads and ffn_hidden_size are derived (multi-head stays multi-head: 32 K/V heads), and differ from tiny's
    assert j.custom_fields == ["vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "ffn_hidden_size"]
    assert j.model_label == "custom (from tiny)"


def test_custom_is_in_the_workload_document_and_ignored_when_it_is_resubmitted():
    custom, preset = job(hidden_size=128), job()
    assert custom.workload_document()["custom"] is True and preset.workload_document()["custom"] is False
    for j in (custom, preset):
        again = resolve_job(JobSpec.model_validate({"workload": j.workload_document(), "strategy": j.strategy_document()}))
        assert again == j
    with pytest.raises(ValueError, match="custom"):
        Workload.model_validate({"model": "tiny", "custom": "yes"})  # only the derived boolean is dropped


def test_a_strategy_default_is_not_a_custom_shape():
    moe = job("moe", 2)
    assert moe.model.num_experts == PRESETS["tiny"].moe_experts and moe.custom_fields == []
    assert job("moe", 2, num_experts=2).custom_fields == ["num_experts"]


def test_a_stored_workload_block_of_a_width_override_resolves_to_the_same_job():
    # a run stored before ffn was derived: hidden 128 with the preset's ffn 256, both in the block
    block = {**PRESETS["tiny"].config.model_dump(), "model": "tiny", "hidden_size": 128, "ffn_hidden_size": 256, "global_batch_size": 8}
    j = resolve_job(JobSpec.model_validate({"workload": block, "strategy": {"name": "ddp", "world_size": 2}}))
    assert j.model.ffn_hidden_size == 256 and resolve_job(j.spec) == j


def test_custom_fields_of_a_spec_block_an_unknown_preset_and_a_partial_block():
    assert workload_custom_fields({"model": "tiny", "hidden_size": 64}) == []
    assert workload_custom_fields({"model": "tiny", "seq_len": 128}, "ddp") == ["seq_len"]
    assert workload_custom_fields({"model": "their-own", "hidden_size": 64}) == ["hidden_size"]
    assert set(workload_custom_fields({"model": "tiny", **{k: 999 for k in ("num_layers", "seq_len")}})) <= set(SHAPE_FIELDS)
