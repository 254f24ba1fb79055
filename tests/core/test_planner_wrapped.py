"""What tensor parallelism's DTensors and FSDP2's wrapping cost a calibrated CPU pool beyond their
GEMMs and collectives (parallab.core.planner, parallab.core.hardware): the block as tp runs it, FSDP2's
own work per group, and AdamW's loop over DTensor parameters — each read from the calibration, and
nothing where the profile lacks the entry."""

from __future__ import annotations

import pytest

from parallab.core import planner
from parallab.core.dims.tp import block_collectives, root_collectives, tp_comm
from parallab.core.explain import explain
from parallab.core.hardware import (
    BlockPoint,
    DeviceDescription,
    FsdpOverhead,
    HardwareProfile,
    MatmulPoint,
    TpBlockPoint,
    TpRootPoint,
    block_signature,
    load_catalogue,
)
from parallab.core.jobs import resolve_job
from parallab.core.plan_hardware import Hardware, hardware_for
from parallab.core.planner import ADAMW_LOOP_OPS, estimate_step_time, fsdp_overhead_seconds, layout, optimizer_seconds
from parallab.core.spec import JobSpec

CPU = DeviceDescription(kind="cpu", name="cpu", memory_bytes=8 << 30, cores=2)
BLOCKS = [
    BlockPoint(precision="fp32", recompute=mode, tokens=tokens, seconds=seconds)
    for mode in ("none", "selective", "full")
    for tokens, seconds in ((128, 0.02), (512, 0.05))
]
TP_BLOCKS = [
    TpBlockPoint(tp=2, sequence_parallel=True, precision="fp32", recompute="selective", tokens=128, seconds=0.16),
    TpBlockPoint(tp=2, sequence_parallel=True, precision="fp32", recompute="selective", tokens=512, seconds=0.28),
]


def job(strategy: str, options: dict | None = None, **workload):
    spec = {"workload": {"model": "small", **workload}, "strategy": {"name": strategy, "world_size": 4, "options": options or {}}}
    return resolve_job(JobSpec.model_validate(spec))


def profile(**update) -> HardwareProfile:
    base = HardwareProfile(
        device=CPU,
        world_size=4,
        matmul=[MatmulPoint(precision="fp32", m=128, n=256, k=256, flops_per_s=1e10)],
        memory_bandwidth=1e9,
        op_overhead_s=1e-5,
        dtensor_op_overhead_s=1e-4,
        blocks=BLOCKS,
        block_model=block_signature(job("ddp").model),
    )
    return base.model_copy(update=update)


def cpu(p: HardwareProfile):
    return hardware_for(load_catalogue().get("cpu"), profile=p)


HYBRID = {"tp": 2, "sequence_parallel": True}


def test_the_block_as_tp_runs_it_is_read_from_the_calibration_at_the_ranks_tokens():
    """hybrid dp2 × tp2 with SP, selective, accumulation 2: 2 sequences (256 tokens) a forward, a
    third of the way from 128 to 512: 0.16 + 0.12/3 a block, in place of the whole block's split."""
    j = job("hybrid", HYBRID, activation_checkpointing="selective", grad_accumulation_steps=2)
    lay = layout(j)
    assert (lay.tp, lay.tokens) == (2, 256)
    measured = cpu(profile(tp_blocks=TP_BLOCKS))
    assert planner.measured_block_seconds(j, measured, lay) == pytest.approx(0.16 + 0.12 / 3)
    split = cpu(profile())
    assert planner.measured_block_seconds(j, split, lay) != pytest.approx(0.16 + 0.12 / 3)
    assert estimate_step_time(j, measured).step_s > estimate_step_time(j, split).step_s


def test_a_tp_block_of_another_degree_sequence_split_or_recomputation_is_not_used():
    hw = cpu(profile(tp_blocks=TP_BLOCKS))
    split = cpu(profile())
    for other in (
        job("hybrid", {"tp": 2}, activation_checkpointing="selective"),  # no SP
        job("hybrid", HYBRID),  # no recomputation
    ):
        lay = layout(other)
        assert planner.measured_block_seconds(other, hw, lay) == pytest.approx(planner.measured_block_seconds(other, split, lay))


def test_the_ends_as_tp_runs_them_are_read_from_the_calibration_where_the_rank_holds_both():
    """hybrid tp2 with SP at 256 tokens: halfway in thirds between the measured 128 and 512; a
    pipeline's last stage (no embedding) and a point of another vocabulary keep the head's GEMMs."""
    roots = [
        TpRootPoint(tp=2, sequence_parallel=True, precision="fp32", vocab_size=1024, tokens=128, seconds=0.03),
        TpRootPoint(tp=2, sequence_parallel=True, precision="fp32", vocab_size=1024, tokens=512, seconds=0.06),
    ]
    j = job("hybrid", HYBRID, grad_accumulation_steps=2)
    lay = layout(j)
    assert j.model.vocab_size == 1024 and lay.head
    assert planner._root_seconds(j, cpu(profile(tp_roots=roots)), lay) == pytest.approx(0.03 + 0.03 / 3)
    unmeasured = planner._root_seconds(j, cpu(profile()), lay)
    assert unmeasured != pytest.approx(0.04)
    other = [r.model_copy(update={"vocab_size": 2048}) for r in roots]
    assert planner._root_seconds(j, cpu(profile(tp_roots=other)), lay) == pytest.approx(unmeasured)
    staged = job("layout", {"tp": 2, "pp": 2}, global_batch_size=8)
    staged_lay = layout(staged)
    assert planner._root_seconds(staged, cpu(profile(tp_roots=roots)), staged_lay) == pytest.approx(
        planner._root_seconds(staged, cpu(profile()), staged_lay)
    )


def test_fsdp2s_own_work_is_per_group_and_micro_step_at_the_measured_reshard():
    """fsdp over 4 ranks: 4 blocks and the root are 5 groups; accumulation 2 doubles it; the point
    of the job's reshard_after_forward is the one read."""
    overhead = [FsdpOverhead(reshard_after_forward=False, seconds=0.02), FsdpOverhead(reshard_after_forward=True, seconds=0.05)]
    hw = cpu(profile(fsdp_overhead=overhead))
    keep = job("fsdp", {"reshard_after_forward": False}, grad_accumulation_steps=2)
    assert fsdp_overhead_seconds(keep, hw) == pytest.approx(5 * 2 * 0.02)
    assert fsdp_overhead_seconds(job("fsdp"), hw) == pytest.approx(5 * 0.05)
    assert fsdp_overhead_seconds(job("ddp"), hw) == 0.0
    without = cpu(profile())
    assert estimate_step_time(keep, hw).step_s == pytest.approx(estimate_step_time(keep, without).step_s + 0.2)
    lines = {t["name"]: t["seconds"] for t in explain(keep, hw)["step"]}
    assert lines["compute: FSDP2's copies and hooks"] == pytest.approx(0.2)


def test_a_profile_without_the_wrapped_measurements_defaults_to_none_of_them():
    """A calibration stored before these entries (its JSON lacks them) reads as measured nothing:
    no FSDP2 term, the tp block split from the whole one; a GPU's catalogue entry gets none either."""
    stored = profile().model_dump(mode="json")
    for entry in ("tp_blocks", "tp_roots", "fsdp_overhead"):
        stored.pop(entry)
    old = HardwareProfile.model_validate(stored)
    assert old.tp_blocks == [] and old.tp_roots == [] and old.fsdp_overhead == []
    assert old.fsdp_group_overhead_s(True) == 0.0
    j = job("fsdp")
    assert fsdp_overhead_seconds(j, cpu(old)) == 0.0
    gpu = Hardware(spec=load_catalogue().get("h100"), nodes=1, devices_per_node=4)
    assert fsdp_overhead_seconds(j, gpu) == 0.0


def test_adamw_over_dtensor_parameters_pays_dtensors_dispatch_on_each_op_of_its_loop():
    hw = cpu(profile())
    tensors = planner.tensor_count(job("ddp").model)
    for strategy, options in (("fsdp", None), ("hybrid", HYBRID)):
        j = job(strategy, options)
        plain = cpu(profile(dtensor_op_overhead_s=0.0))
        assert optimizer_seconds(j, hw) - optimizer_seconds(j, plain) == pytest.approx(tensors * ADAMW_LOOP_OPS * 1e-4)
    ddp = job("ddp")
    assert optimizer_seconds(ddp, hw) == pytest.approx(optimizer_seconds(ddp, cpu(profile(dtensor_op_overhead_s=0.0))))


def test_the_blocks_and_the_ends_tp_collectives_are_tp_comms():
    """What the calibration takes out of a block and of the ends timed under tp add up to tp_comm's
    bytes (the norms' gradient all-reduce under SP aside: once a step, after the last backward)."""
    cfg = job("ddp").model
    tokens, h, layers = 256, cfg.hidden_size, cfg.num_layers
    for sp in (False, True):
        calls = block_collectives(tokens, h, act=4, stream=4, sequence_parallel=sp)
        ends = root_collectives(tokens, h, cfg.vocab_size, act=4, stream=4, sequence_parallel=sp)
        comm = tp_comm(cfg, tokens, 4, sequence_parallel=sp, grad_bytes=4)
        for op in {op for op, _, _ in calls}:
            per_layer = sum(b * c for o, b, c in calls if o == op)
            assert layers * per_layer + sum(b * c for o, b, c in ends if o == op) == comm[op]
