"""Recipes on real ranks (torchrun, gloo): every precision, recomputation and accumulation under
ddp, fsdp and tp against the fp32 reference, each within its format's tolerance
(`parallab.core.recipes`, docs/recipes.md), with the memory change the prediction says; the
calibrate job kind; fp8 refused by the device.

The recipe grid runs in ONE 2-rank launch (recipes_driver.py) to keep the suite fast.

Memory: the activation ratios are read from the driver's own MemTracker step, the same
measurement a run's `memory_breakdown.activations` carries.
"""

from __future__ import annotations

import pytest

from parallab.core.hardware import block_signature
from parallab.core.model import PRESETS
from parallab.core.recipes import ACCUMULATION_TOLERANCE, loss_tolerance
from parallab.core.rundir import RunDir
from tests.workers.conftest import make_job, run_driver
from workers.launcher import launch

pytestmark = pytest.mark.slow

STRATEGIES = ("ddp", "fsdp", "tp")
RECIPES = ("fp32", "bf16", "fp16", "selective", "alternate", "full", "accum2")
RATIO_TOLERANCE = 0.25
"""Measured activation ratio (recipe / fp32) against the predicted one, absolute. The prediction
counts bf16 activations as all 2-byte, but autocast keeps RMSNorm's and rotary's intermediates in
fp32 (measured on tiny: ddp 0.69 against 0.54, tp 0.76 against 0.56 — tp's replicated norms are a
larger share of its activations); and it keeps one block's full set at full recomputation's peak
where the recompute frees it block by block (0.19 against 0.34). docs/recipes.md."""


HARNESS_JOBS = [("ddp", 2, {}, {})]
"""What this file reads from `harness_job` (the default DDP run), declared to the `tiny-runs`
group's folded launches (tests/workers/conftest.py)."""


@pytest.fixture(scope="module")
def recipes(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return run_driver(tmp_path_factory, "recipes_driver.py")


def rel_diff(values: list[float], reference: list[float]) -> float:
    return max(abs(v - r) / abs(r) for v, r in zip(values, reference, strict=True))


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("recipe", RECIPES)
def test_every_recipe_is_within_its_formats_tolerance_of_the_fp32_reference(recipes, strategy, recipe):
    case = recipes["cases"][f"{strategy}/{recipe}"]
    assert len(case["losses"]) == len(recipes["reference"]) == 3
    assert rel_diff(case["losses"], recipes["reference"]) <= loss_tolerance(case["precision"]), case


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_recomputation_is_bitwise_equal_to_none_in_fp32(recipes, strategy):
    """The same kernels on the same inputs: not close, equal."""
    none = recipes["cases"][f"{strategy}/fp32"]["losses"]
    for mode in ("selective", "alternate", "full"):
        assert recipes["cases"][f"{strategy}/{mode}"]["losses"] == none, mode


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_accumulation_matches_no_accumulation_to_fp32_rounding(recipes, strategy):
    """The same sums in another order: a few ulps, not bitwise (docs/recipes.md)."""
    assert (
        rel_diff(recipes["cases"][f"{strategy}/accum2"]["losses"], recipes["cases"][f"{strategy}/fp32"]["losses"]) <= ACCUMULATION_TOLERANCE
    )


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_bf16_and_full_recomputation_shrink_activations_as_predicted(recipes, strategy):
    fp32, bf16, full = (recipes["cases"][f"{strategy}/{r}"] for r in ("fp32", "bf16", "full"))
    # Not the document's total peak: it now holds parameters, gradients and optimizer state too, and
    # autocast's bf16 copies of the weights; on `tiny` those outweigh the activations saved (ddp
    # measured 20.8 MB bf16 against 19.7 MB fp32). The activations are what the recipe changes.
    assert all(case["peak_allocated_bytes"] > case["activation_bytes"] for case in (fp32, bf16, full))
    # activations: smaller in bf16, smaller still with full recomputation, by about the predicted ratio
    assert full["activation_bytes"] < bf16["activation_bytes"] < fp32["activation_bytes"]
    for recipe in (bf16, full):
        measured = recipe["activation_bytes"] / fp32["activation_bytes"]
        predicted = recipe["predicted_activation_bytes"] / fp32["predicted_activation_bytes"]
        assert measured == pytest.approx(predicted, abs=RATIO_TOLERANCE), (recipe, fp32)
    for mode in ("selective", "alternate"):
        assert full["activation_bytes"] < recipes["cases"][f"{strategy}/{mode}"]["activation_bytes"] < fp32["activation_bytes"]


def test_a_training_result_carries_the_step_time_estimate(harness_job):
    doc, _ = harness_job("ddp", 2)
    assert doc.prediction.step_time_s and doc.prediction.step_time_s > 0
    estimate = doc.model_dump()["prediction"]["step_time_estimate"]
    assert estimate["step_s"] == pytest.approx(doc.prediction.step_time_s) and estimate["calibrated"] is False


def test_the_default_ddp_run_has_no_activation_flag(harness_job):
    """The default DDP run's activations (MemTracker at the step's peak) against the prediction,
    which counts the activations alone — the logits' gradient, made in backward, beside them."""
    doc, _ = harness_job("ddp", 2)
    measured = max(r.memory_breakdown["activations"] for r in doc.ranks if r.memory_breakdown)
    prediction = doc.model_dump()["prediction"]
    assert measured == pytest.approx(prediction["activation_bytes_per_rank"], rel=0.10)
    assert prediction["backward_temporary_bytes_per_rank"] > 0
    assert not [f for f in doc.flags if f.metric == "activation_bytes_per_rank"]


def test_the_calibrate_job_measures_gemms_memory_and_collectives(harness_job):
    options = {
        "ops": ["all_reduce", "send_recv"],
        "max_bytes": 65536,
        "iters": 1,
        "warmup_iters": 0,
        "token_counts": [64, 256],
        "tp_degrees": [1, 2],
        "precisions": ["fp32", "bf16", "fp8"],
        "matmul_iters": 1,
    }
    doc, run_dir = harness_job("calibrate", 2, options)
    profile = doc.calibration
    assert profile is not None and profile.world_size == 2 and profile.device.kind == "cpu"
    assert profile.device.name == doc.hardware["device_name"] and profile.device.memory_bytes
    assert {p.precision for p in profile.matmul} == {"fp32", "bf16"}, "fp8 is skipped: no CUDA device"
    assert "skipping fp8: fp8 training needs" in RunDir(run_dir).log.read_text()
    h, f, v = 64, 256, 256  # tiny: every weight GEMM, unsharded and split in two, at both token counts
    shapes = {(p.k, p.n) for p in profile.matmul}
    assert {(h, h), (h, f), (f, h), (h, v), (h, f // 2), (f // 2, h), (h // 2, h)} <= shapes
    assert all(p.flops_per_s > 0 for p in profile.matmul) and len(profile.matmul) == 2 * 2 * len(shapes)
    assert profile.memory_bandwidth > 0 and profile.op_overhead_s > 0 and profile.dtensor_op_overhead_s is not None
    # tiny's own block, at both token counts (whole sequences of 64), each precision and recomputation
    blocks = {(b.precision, b.recompute, b.tokens) for b in profile.blocks}
    assert blocks == {(p, r, t) for p in ("fp32", "bf16") for r in ("none", "selective", "full") for t in (64, 256)}
    assert profile.block_model == block_signature(PRESETS["tiny"].config)
    # the same block as tp = 2 runs it (sequence parallel off and on) and FSDP2's own cost, reshard off and on
    tp_blocks = {(b.tp, b.sequence_parallel, b.precision, b.recompute, b.tokens) for b in profile.tp_blocks}
    assert tp_blocks == {
        (2, sp, p, r, t) for sp in (False, True) for p in ("fp32", "bf16") for r in ("none", "selective", "full") for t in (64, 256)
    }
    roots = {(r.tp, r.sequence_parallel, r.precision, r.tokens) for r in profile.tp_roots}
    assert roots == {(2, sp, p, t) for sp in (False, True) for p in ("fp32", "bf16") for t in (64, 256)}
    assert sorted(o.reshard_after_forward for o in profile.fsdp_overhead) == [False, True]
    assert {p.op for p in profile.collectives} == {"all_reduce", "send_recv"} and {p.op for p in doc.collectives} == {
        "all_reduce",
        "send_recv",
    }
    # the host's speed timed in both ranks around the measurements, as a training run's around its steps
    assert doc.host_speed is not None and doc.host_speed.where == "steps" and doc.host_speed.lanes == 2
    assert len(doc.host_speed.before_ops_per_s) == len(doc.host_speed.after_ops_per_s) == 3


def test_fp8_on_a_cpu_fails_the_run_with_the_devices_reason(tmp_path):
    """One rank is enough: each rank checks the device before it builds anything (`run_training`)."""
    outcome = launch(make_job("single", 1, workload={"precision": "fp8"}), RunDir(tmp_path), timeout_s=300, trace_cap_bytes=1 << 20)
    assert not outcome.ok
    assert (
        "PrecisionUnsupported: fp8 training needs an NVIDIA GPU of compute capability 9.0 or newer (Hopper); no CUDA device here"
        in outcome.log_tail
    )
