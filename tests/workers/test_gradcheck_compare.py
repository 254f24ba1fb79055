"""The gradient check's comparison (`workers.harness.gradcheck.compare`), without torchrun."""

from __future__ import annotations

import torch

from workers.harness.gradcheck import GRADIENT_TOLERANCE, canonical, compare, relative_error, tolerance


def reference() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"tok_embeddings.weight": torch.randn(16, 8, generator=g), "layers.0.attention.wq.weight": torch.randn(8, 8, generator=g)}


def test_equal_gradients_pass_with_error_zero():
    check = compare(reference(), reference(), tol=1e-5)
    assert check.passed and check.max_rel_err == 0 and check.params_checked == 2 and check.method


def test_a_missing_one_over_n_is_an_error_of_n_minus_one():
    ref = reference()
    summed = {k: v * 2 for k, v in ref.items()}  # two ranks' gradients summed, not averaged
    check = compare(summed, ref, tol=1e-5)
    assert not check.passed and abs(check.max_rel_err - 1.0) < 1e-12


def test_a_dropped_shard_and_a_missing_parameter_fail_and_are_named():
    ref = reference()
    dropped = dict(ref)
    dropped["layers.0.attention.wq.weight"] = torch.cat([ref["layers.0.attention.wq.weight"][:4], torch.zeros(4, 8)])
    check = compare(dropped, ref, tol=1e-5)
    assert not check.passed and check.worst_param == "layers.0.attention.wq.weight" and 0.3 < check.max_rel_err < 1
    missing = compare({"tok_embeddings.weight": ref["tok_embeddings.weight"]}, ref, tol=1e-5)
    assert missing.worst_param == "layers.0.attention.wq.weight" and missing.max_rel_err == 1.0


def test_non_finite_gradients_fail_with_a_finite_error():
    ref = reference()
    bad = {k: v.clone() for k, v in ref.items()}
    bad["tok_embeddings.weight"][0, 0] = float("inf")
    assert relative_error(bad["tok_embeddings.weight"], ref["tok_embeddings.weight"]) == 1e30
    assert not compare(bad, ref, tol=1e-5).passed


def test_wrapper_prefixes_are_dropped_and_tolerances_by_precision():
    assert canonical("module.layers.0._checkpoint_wrapped_module.attention.wq.weight") == "layers.0.attention.wq.weight"
    assert tolerance("fp32") == 1e-5 == GRADIENT_TOLERANCE["fp32"] and tolerance("bf16") > tolerance("fp32")


def test_a_16_bit_tolerance_is_twice_its_noise_between_fp32s_and_the_flat_bound():
    assert tolerance("bf16", 0.01) == 0.02 and tolerance("fp16", 1.3e-3) == 2.6e-3
    assert tolerance("bf16", 0.04) == GRADIENT_TOLERANCE["bf16"], "never looser than the flat bound"
    assert tolerance("bf16", 0.0) == GRADIENT_TOLERANCE["fp32"], "never tighter than fp32's"
    assert tolerance("fp32", 0.5) == GRADIENT_TOLERANCE["fp32"] and tolerance("bf16") == GRADIENT_TOLERANCE["bf16"]
