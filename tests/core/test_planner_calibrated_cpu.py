"""A calibrated CPU pool's step estimate (parallab.core.planner, parallab.core.hardware): the
workload's own block as the calibration timed it, GEMM curves by shape, and torch's CPU AdamW."""

from __future__ import annotations

import pytest

from parallab.core import planner
from parallab.core.hardware import BlockPoint, DeviceDescription, HardwareProfile, MatmulPoint, block_signature, load_catalogue
from parallab.core.jobs import resolve_job
from parallab.core.plan_hardware import Hardware, hardware_for
from parallab.core.planner import ADAMW_BYTES, ADAMW_LOOP_BYTES, ADAMW_LOOP_OPS, compute_seconds, layout, optimizer_seconds
from parallab.core.spec import JobSpec

CPU = DeviceDescription(kind="cpu", name="cpu", memory_bytes=8 << 30, cores=2)


def job(strategy: str = "ddp", world: int = 4, options: dict | None = None, **workload):
    spec = {"workload": {"model": "small", **workload}, "strategy": {"name": strategy, "world_size": world, "options": options or {}}}
    return resolve_job(JobSpec.model_validate(spec))


def profile(*, blocks: list[BlockPoint] | None = None, model=None, matmul: list[MatmulPoint] | None = None) -> HardwareProfile:
    return HardwareProfile(
        device=CPU,
        world_size=4,
        matmul=matmul or [MatmulPoint(precision="fp32", m=128, n=256, k=256, flops_per_s=1e10)],
        memory_bandwidth=1e9,
        op_overhead_s=1e-5,
        blocks=blocks or [],
        block_model=block_signature(model) if model is not None else None,
    )


BLOCKS = [
    BlockPoint(precision="fp32", recompute=mode, tokens=tokens, seconds=seconds * factor)
    for mode, factor in (("none", 1.0), ("selective", 1.5), ("full", 1.3))
    for tokens, seconds in ((128, 0.02), (512, 0.05))
]


def test_a_measured_block_times_each_block_and_the_head_is_added():
    """ddp on 4 ranks, global batch 8: 2 sequences (256 tokens) a forward, halfway between the
    measured 128 and 512 tokens in 3/8: 0.02 + 3/8 · 0.03 s a block. Dropping the measured block
    (the old path: GEMMs, attention, bytes, ops) gives another figure."""
    j = job()
    hw = hardware_for(load_catalogue().get("cpu"), profile=profile(blocks=BLOCKS, model=j.model))
    lay = layout(j)
    assert lay.tokens == 256 and lay.forwards == 1 and lay.layers == 4
    block = 0.02 + (256 - 128) / (512 - 128) * 0.03
    assert planner.measured_block_seconds(j, hw, lay) == pytest.approx(block)
    root = planner._root_seconds(j, hw, lay)
    assert root > 0
    assert compute_seconds(j, hw) == pytest.approx(4 * block + root)
    unmeasured = hardware_for(load_catalogue().get("cpu"), profile=profile(model=None))
    assert compute_seconds(j, unmeasured) != pytest.approx(4 * block + root)


def test_the_block_of_each_recomputation_and_alternate_as_their_mean():
    small = job().model
    hw = hardware_for(load_catalogue().get("cpu"), profile=profile(blocks=BLOCKS, model=small))
    for mode, factor in (("selective", 1.5), ("full", 1.3)):
        j = job(activation_checkpointing=mode)
        assert planner.measured_block_seconds(j, hw, layout(j)) == pytest.approx(factor * (0.02 + 0.03 / 3))
    j = job(activation_checkpointing="alternate")  # 4 blocks: 2 recomputed whole, 2 not
    assert planner.measured_block_seconds(j, hw, layout(j)) == pytest.approx((1.3 + 1.0) / 2 * (0.02 + 0.03 / 3))


def test_a_block_measured_for_another_model_or_precision_is_not_used():
    j = job()
    other = job(model="tiny").model
    hw = hardware_for(load_catalogue().get("cpu"), profile=profile(blocks=BLOCKS, model=other))
    assert planner.measured_block_seconds(j, hw, layout(j)) is None
    ours = hardware_for(load_catalogue().get("cpu"), profile=profile(blocks=BLOCKS, model=j.model))
    bf16 = job(precision="bf16")  # only fp32 was measured
    assert planner.measured_block_seconds(bf16, ours, layout(bf16)) is None


def test_a_block_split_by_tp_keeps_the_measured_rest_and_times_its_gemms_split():
    """tp 2: the block's GEMMs at half their width, three passes, plus DTensor's dispatch; the
    rest (what the whole block measured beyond its three passes of whole GEMMs) unchanged."""
    tp = job("tp", 2, global_batch_size=8)
    lay = layout(tp)
    assert lay.tp == 2
    fast = [MatmulPoint(precision="fp32", m=128, n=256, k=256, flops_per_s=1e12)]
    p = profile(blocks=BLOCKS, model=tp.model, matmul=fast).model_copy(update={"dtensor_op_overhead_s": 1e-4})
    hw = hardware_for(load_catalogue().get("cpu"), profile=p)
    measured = p.block_seconds(tp.model, "fp32", "none", lay.tokens)
    whole = planner._block_parts(tp, hw, planner.replace(lay, tp=1))[0]
    split = planner._block_parts(tp, hw, lay)[0]
    assert split < whole
    rest = measured - 3 * whole
    assert rest > 0
    expected = rest + 3 * split + planner.DTENSOR_OPS_PER_LAYER * 3 * 1e-4
    assert planner.measured_block_seconds(tp, hw, lay) == pytest.approx(expected)


def test_block_seconds_below_between_and_beyond_the_measured_tokens():
    small = job().model
    p = profile(blocks=BLOCKS, model=small)
    assert p.block_seconds(small, "fp32", "none", 64) == pytest.approx(0.02)  # flat below
    assert p.block_seconds(small, "fp32", "none", 320) == pytest.approx(0.035)
    # above: the last two points' line (0.02 s at 128, 0.05 s at 512: 0.03 s per 384 tokens), not 0.05 × 2
    assert p.block_seconds(small, "fp32", "none", 1024) == pytest.approx(0.09)


def test_above_the_measured_tokens_a_falling_line_is_held_flat_and_one_point_is_scaled():
    small = job().model
    noisy = [BlockPoint(precision="fp32", recompute="none", tokens=t, seconds=s) for t, s in ((128, 0.06), (512, 0.05))]
    assert profile(blocks=noisy, model=small).block_seconds(small, "fp32", "none", 2048) == pytest.approx(0.05)
    alone = [BlockPoint(precision="fp32", recompute="none", tokens=512, seconds=0.05)]
    assert profile(blocks=alone, model=small).block_seconds(small, "fp32", "none", 1024) == pytest.approx(0.10)


def test_a_gemm_is_read_on_its_own_shapes_curve_and_one_volume_is_averaged():
    """w1 (k=256, n=1024) and w2 (k=1024, n=256) have one volume: each is read on its own curve,
    and a shape not measured on the mean of the points of its volume, not on whichever sorts first."""
    points = [
        MatmulPoint(precision="fp32", m=128, n=1024, k=256, flops_per_s=3e10),
        MatmulPoint(precision="fp32", m=512, n=1024, k=256, flops_per_s=5e10),
        MatmulPoint(precision="fp32", m=128, n=256, k=1024, flops_per_s=1e10),
    ]
    p = profile(matmul=points)
    assert p.matmul_flops("fp32", 128, 1024, 256) == pytest.approx(3e10)
    assert p.matmul_flops("fp32", 256, 1024, 256) == pytest.approx(4e10)  # halfway in log(m)
    assert p.matmul_flops("fp32", 128, 256, 1024) == pytest.approx(1e10)
    assert p.matmul_flops("fp32", 128, 512, 512) == pytest.approx(2e10)  # another shape of that volume: their mean


def test_cpu_ranks_pay_torchs_single_tensor_adamw_and_gpus_the_ideal_bytes():
    j = job()
    hw = hardware_for(load_catalogue().get("cpu"), profile=profile())
    local = planner._local_params(j)
    tensors = planner.tensor_count(j.model)
    assert optimizer_seconds(j, hw) == pytest.approx(local * ADAMW_LOOP_BYTES / 1e9 + tensors * ADAMW_LOOP_OPS * 1e-5)
    gpu = Hardware(spec=load_catalogue().get("h100"), nodes=1, devices_per_node=4)
    assert optimizer_seconds(j, gpu) == pytest.approx(
        local * ADAMW_BYTES / gpu.memory_bandwidth + tensors * ADAMW_LOOP_OPS * gpu.op_overhead_s
    )
