"""The step-time estimate and the ranking (parallab.core.planner; docs/planner.md)."""

from __future__ import annotations

import pytest

from parallab.core import ranking as ranking_module
from parallab.core.hardware import DeviceDescription, HardwareProfile, MatmulPoint, load_catalogue
from parallab.core.jobs import resolve_job
from parallab.core.plan_hardware import USABLE_MEMORY, Hardware, hardware_for
from parallab.core.planner import estimate_step_time, spearman
from parallab.core.prediction import predict
from parallab.core.ranking import candidate_specs, plan_cluster, rejected_by_reason
from parallab.core.spec import JobSpec

CATALOGUE = load_catalogue()
H100x16 = Hardware(spec=CATALOGUE.get("h100"), nodes=2, devices_per_node=8)


def job(strategy: str, world: int, options: dict | None = None, **workload):
    return resolve_job(
        JobSpec.model_validate(
            {"workload": {"model": "llama-1b", **workload}, "strategy": {"name": strategy, "world_size": world, "options": options or {}}}
        )
    )


def test_the_parts_add_up_to_the_step_and_tokens_per_s_divides_it():
    e = estimate_step_time(job("fsdp", 8), H100x16)
    assert e.step_s == pytest.approx(e.compute_s + e.exposed_comm_s + e.bubble_s + e.optimizer_s)
    assert 0 <= e.exposed_comm_s <= e.comm_s + 1e-12
    assert e.tokens_per_s == pytest.approx(job("fsdp", 8).tokens_per_step / e.step_s)
    assert not e.calibrated


def test_the_estimate_moves_the_way_each_recipe_should():
    """At 4 sequences a rank, the batch of the H200 runs in benchmarks/gpu (where bf16 measured 7×
    fp32's speed: llama-1b_fp32.json against llama-1b_bf16.json), the host's launches hidden."""
    batch = {"global_batch_size": 32}
    base = estimate_step_time(job("ddp", 8, **batch), H100x16)
    assert estimate_step_time(job("ddp", 8, precision="bf16", **batch), H100x16).compute_s < base.compute_s / 5  # tensor cores vs fp32
    bf16 = estimate_step_time(job("ddp", 8, precision="bf16", **batch), H100x16)
    compiled = {**batch, "compile": True}
    compiled_bf16 = estimate_step_time(job("ddp", 8, precision="bf16", **compiled), H100x16)
    assert estimate_step_time(job("ddp", 8, precision="fp8", **compiled), H100x16).compute_s < compiled_bf16.compute_s < bf16.compute_s
    full = estimate_step_time(job("ddp", 8, activation_checkpointing="full", **batch), H100x16)
    selective = estimate_step_time(job("ddp", 8, activation_checkpointing="selective", **batch), H100x16)
    assert base.compute_s < selective.compute_s < full.compute_s
    assert full.compute_s == pytest.approx(base.compute_s * 4 / 3, rel=0.1)  # one more forward of 3 (fwd + 2×)


def test_a_pipeline_pays_its_bubble_and_overlap_needs_a_device_that_overlaps():
    pp = estimate_step_time(job("pp", 4, {"microbatches": 4}), H100x16)
    fraction = 3 / (4 + 3)
    assert pp.bubble_s == pytest.approx((pp.compute_s + pp.exposed_comm_s) * fraction / (1 - fraction))
    fsdp = job("fsdp", 8)
    on_gpu = estimate_step_time(fsdp, H100x16)
    no_overlap = Hardware(spec=CATALOGUE.get("h100").model_copy(update={"comm_overlap": 0.0}), nodes=2)
    assert estimate_step_time(fsdp, no_overlap).exposed_comm_s == pytest.approx(on_gpu.comm_s)
    assert on_gpu.exposed_comm_s < on_gpu.comm_s


def test_groups_that_span_nodes_use_the_inter_node_link():
    one_node = Hardware(spec=CATALOGUE.get("h100"), nodes=1)
    two_nodes = Hardware(spec=CATALOGUE.get("h100"), nodes=2)
    within = one_node.comm_seconds("all_reduce", 1 << 28, 1, 8)
    across = two_nodes.comm_seconds("all_reduce", 1 << 28, 1, 16)
    assert across > within * 5  # 50 GB/s NICs against 450 GB/s NVLink


def test_a_calibrated_profile_replaces_the_datasheet():
    cpu = DeviceDescription(kind="cpu", name="cpu", memory_bytes=8 << 30)
    profile = HardwareProfile(
        device=cpu, world_size=2, matmul=[MatmulPoint(precision="fp32", m=64, n=64, k=64, flops_per_s=1e9)], memory_bandwidth=1e9
    )
    hw = hardware_for(CATALOGUE.get("cpu"), profile=profile)
    assert hw.calibrated and hw.per_node == 2 and hw.matmul_flops("fp32", 8, 8, 8) == 1e9 and hw.memory_bandwidth == 1e9
    assert hw.memory_budget == int((8 << 30) // 2 * USABLE_MEMORY)  # CPU ranks share the host
    slow = estimate_step_time(job("ddp", 2, model="tiny"), hw)
    fast = estimate_step_time(
        job("ddp", 2, model="tiny"),
        hardware_for(
            CATALOGUE.get("cpu"),
            profile=profile.model_copy(update={"matmul": [MatmulPoint(precision="fp32", m=64, n=64, k=64, flops_per_s=1e11)]}),
        ),
    )
    assert fast.compute_s < slow.compute_s


def test_predict_stores_the_estimate_beside_memory():
    j = job("fsdp", 8)
    assert "step_time_s" not in predict(j)
    prediction = predict(j, H100x16)
    assert prediction["step_time_s"] == pytest.approx(estimate_step_time(j, H100x16).step_s)
    assert prediction["step_time_estimate"]["compute_s"] > 0


def test_llama_8b_on_two_h100_nodes_ranks_what_fits_and_says_why_the_rest_dont():
    ranking = plan_cluster({"model": "llama-8b"}, H100x16)
    assert ranking.world_size == 16 and ranking.workload["global_batch_size"] == 16
    assert len(ranking.fits) > 10 and ranking.rejected
    tps = [r.tokens_per_s for r in ranking.fits]
    assert tps == sorted(tps, reverse=True)
    profile = H100x16.device_profile  # a profiled GPU's budget is the allocator's: its memory less the CUDA context
    budget = 80 * 10**9 - profile.allocator.context_bytes if profile is not None else 80 * 10**9 * USABLE_MEMORY
    assert all(r.memory_per_rank_bytes <= budget for r in ranking.fits)
    assert {"ddp", "fsdp", "tp", "pp", "ring", "hybrid"} <= {r.strategy for r in ranking.fits + ranking.rejected}
    assert all(r.mesh["dp"] * r.mesh["tp"] * r.mesh["pp"] * r.mesh["cp"] * r.mesh["ep"] == 16 for r in ranking.fits)
    reasons = {g["field"]: g for g in rejected_by_reason(ranking.rejected)}
    assert "memory" in reasons and "needs" in reasons["memory"]["reason"]  # ddp: 16 bytes per parameter on every rank
    refused = {g["field"] for g in rejected_by_reason(ranking.invalid)}
    assert "workload.global_batch_size" in refused and "workload.global_batch_size" not in reasons  # not configurations: apart
    assert "workload.precision" in refused  # fp8 under tensor parallelism, refused by the spec
    ddp_fp32 = next(r for r in ranking.rejected if r.strategy == "ddp" and r.precision == "fp32" and r.grad_accumulation_steps == 1)
    assert any(reason.startswith("memory: needs") for reason in ddp_fp32.reasons)


def test_fp8_is_rejected_where_the_device_cannot_run_it():
    a100 = plan_cluster(
        {"model": "llama-1b"},
        Hardware(spec=CATALOGUE.get("a100"), nodes=1),
        precisions=("fp8",),
        checkpointing=("none",),
        accumulation=(1,),
    )
    assert not a100.fits
    resolved = [r for r in a100.rejected if r.micro_batch_size is not None]  # tp/hybrid (and batch splits) are refused by the spec first
    assert resolved and all(
        any("compute capability 9.0" in reason and "has compute capability 8.0" in reason for reason in r.reasons) for r in resolved
    )


def test_candidates_cover_every_strategy_option_and_recipe_but_not_another_model():
    specs = candidate_specs({"model": "small"}, 4, precisions=("fp32",), checkpointing=("none",), accumulation=(1,))
    names = {s["strategy"]["name"] for s in specs}
    assert names == {"ddp", "fsdp", "tp", "pp", "ring", "hybrid", "hsdp"}  # no moe on a dense preset, no 3d on 4 ranks
    assert {s["strategy"]["options"].get("microbatches") for s in specs if s["strategy"]["name"] == "pp"} == {4, 8, 16}
    assert (
        candidate_specs({"model": "small"}, 1, precisions=("fp32",), checkpointing=("none",), accumulation=(1,))[0]["strategy"]["name"]
        == "single"
    )


@pytest.mark.parametrize(
    ("xs", "ys", "rho"),
    [
        ([1, 2, 3, 4], [10, 20, 30, 40], 1.0),
        ([1, 2, 3, 4], [4, 3, 2, 1], -1.0),
        ([1, 2, 3, 4, 5], [2, 1, 4, 3, 5], 0.8),  # 1 − 6·Σd²/(n(n²−1)) with Σd² = 4
        ([1, 2, 2, 3], [1, 2, 3, 4], 0.9486832980505138),  # ties share their average rank
    ],
)
def test_spearman(xs, ys, rho):
    assert spearman(xs, ys) == pytest.approx(rho)


def test_spearman_needs_three_pairs_and_some_spread():
    assert spearman([1, 2], [1, 2]) is None
    assert spearman([1, 1, 1], [1, 2, 3]) is None


def test_cpu_ranks_that_outnumber_the_cores_hand_the_bubble_to_busy_stages():
    def hw(cores: int) -> Hardware:
        cpu = DeviceDescription(kind="cpu", name="cpu", memory_bytes=8 << 30, cores=cores)
        points = [MatmulPoint(precision="fp32", m=64, n=64, k=64, flops_per_s=1e9)]
        return hardware_for(CATALOGUE.get("cpu"), profile=HardwareProfile(device=cpu, world_size=4, matmul=points, memory_bandwidth=1e9))

    pipeline = job("pp", 4, {"microbatches": 4}, model="small")
    shared = estimate_step_time(pipeline, hw(cores=2))  # 2 ranks per core: κ(1 − b) = 2 · 4/7 ≥ 1
    assert hw(cores=2).ranks_per_core == 2 and shared.bubble_s == 0
    own = estimate_step_time(pipeline, hw(cores=4))  # a core each: the bubble is idle time
    assert own.bubble_s == pytest.approx((own.compute_s + own.exposed_comm_s) * 3 / 4)


def check_no_invalid_misfit(ranking) -> None:
    """A combination the spec refuses is never counted among those that do not fit."""
    assert all(row.valid and row.micro_batch_size is not None for row in ranking.rejected), [
        r.reasons for r in ranking.rejected if not r.valid
    ][:3]
    assert ranking.invalid and all(not row.valid for row in ranking.invalid)


def _valid_as_ever(monkeypatch) -> None:
    """The old count: every refused combination a misfit."""
    evaluate = ranking_module.evaluate

    def every_row_valid(raw, hw, *args, **kw):
        row = evaluate(raw, hw, *args, **kw)
        row.valid = True
        return row

    monkeypatch.setattr(ranking_module, "evaluate", every_row_valid)


@pytest.mark.parametrize("breakage", [None, _valid_as_ever], ids=["kept-apart", "counted-as-misfits"])
def test_combinations_the_batch_cannot_split_into_are_not_misfits(monkeypatch, breakage):
    """llama-8b on 16 H100s at global batch 16: accumulation 2 and 4 under dp 16 do not split the
    batch; those are kept apart, and the closest misfit is a real configuration."""
    if breakage is not None:
        breakage(monkeypatch)
    ranking = plan_cluster({"model": "llama-8b"}, H100x16, strategies=["ddp", "fsdp"], checkpointing=("none",))
    if breakage is None:
        check_no_invalid_misfit(ranking)
        assert {g["field"] for g in rejected_by_reason(ranking.invalid)} == {"workload.global_batch_size"}
        body = ranking.as_dict()
        assert body["invalid"] == len(ranking.invalid) and body["closest"] is None  # something fits
    else:
        with pytest.raises(AssertionError):
            check_no_invalid_misfit(ranking)
