"""The prediction, against hand-computed figures for `tiny` and the ZeRO paper's table."""

from __future__ import annotations

import pytest

from parallab.core.families import param_counts
from parallab.core.flags import prediction_flags
from parallab.core.jobs import resolve_job
from parallab.core.prediction import GB, predict, zero_stages
from parallab.core.spec import JobSpec

# tiny: V=256, h=64, L=4, f=256, T=64, global batch 8.
# Ψ = embedding 256·64 + 4 · (4·64² + 2·64 + 3·64·256) + head 256·64 + final norm 64 = 295,488
PSI = 16384 + 4 * 65664 + 16448
BSH = 8 * 64 * 64 * 4  # one (b, s, h) fp32 activation of the whole global batch


def job(strategy: str, n: int, precision: str = "fp32", accum: int = 1, **options):
    workload = {"model": "tiny", "precision": precision, "grad_accumulation_steps": accum}
    spec = JobSpec.model_validate({"workload": workload, "strategy": {"name": strategy, "world_size": n, "options": options}})
    return resolve_job(spec)


def test_tiny_param_count_is_the_hand_count():
    assert param_counts(job("ddp", 2).model).total == PSI == 295_488


def test_ddp_baseline_state_and_one_gradient_all_reduce():
    p = predict(job("ddp", 2))
    assert p["model_state_bytes_per_rank"] == {"params": 4 * PSI, "grads": 4 * PSI, "optimizer": 8 * PSI}
    assert p["comm_bytes_per_step"] == {"all_reduce": 4 * PSI}
    assert p["bubble_fraction"] is None


@pytest.mark.parametrize("n", [2, 4])
def test_fsdp_state_is_one_nth_and_gathers_twice_when_resharding(n):
    p = predict(job("fsdp", n))
    assert p["model_state_bytes_per_rank"] == {"params": 4 * PSI // n, "grads": 4 * PSI // n, "optimizer": 8 * PSI // n}
    assert p["comm_bytes_per_step"] == {"all_gather": 2 * 4 * PSI, "reduce_scatter": 4 * PSI}
    no_reshard = predict(job("fsdp", n, reshard_after_forward=False))
    assert no_reshard["model_state_bytes_per_rank"] == p["model_state_bytes_per_rank"]  # FSDP2 rests sharded either way
    assert no_reshard["comm_bytes_per_step"] == {"all_gather": 4 * PSI, "reduce_scatter": 4 * PSI}


@pytest.mark.parametrize(
    ("strategy", "n", "options", "per_micro_step"),
    [
        ("ddp", 2, {}, set()),  # no_sync until the last micro-step: one all-reduce a step
        ("fsdp", 2, {}, {"all_gather", "reduce_scatter"}),
        ("hsdp", 4, {"dp_replicate": 2}, {"all_gather", "reduce_scatter", "all_reduce"}),
        ("layout", 4, {"dp_replicate": 2, "tp": 2}, set()),  # one flat all-reduce of the replicas after the last micro-step
    ],
)
def test_sharded_data_parallel_communicates_once_per_accumulation_micro_step(strategy, n, options, per_micro_step):
    """FSDP2 gathers and reduces on every backward (nothing tells it to skip), HSDP all-reduces its
    shards each time too; DDP waits for the last micro-step (no_sync), as does the replicas' flat
    all-reduce beside tp. Two micro-steps of half the rows: twice the bytes, or the same."""
    once, twice = (
        predict(job(strategy, n, **options))["comm_bytes_per_step"],
        predict(job(strategy, n, accum=2, **options))["comm_bytes_per_step"],
    )
    for op in ("all_gather", "reduce_scatter", "all_reduce"):
        if op in per_micro_step:
            assert twice[op] == 2 * once[op], op
    if strategy == "ddp":
        assert twice == once


def test_tp_state_and_megatron_all_reduces():
    p = predict(job("tp", 2))
    # matrices and vocab tables halved, 9 norm weights of 64 replicated
    local = (PSI - 9 * 64) // 2 + 9 * 64
    assert p["model_state_bytes_per_rank"]["params"] == 4 * local
    # Megatron: 2 forward + 2 backward all-reduces of b·s·h per block, + embedding fwd + head bwd; gathered logits
    assert p["comm_bytes_per_step"] == {"all_reduce": (4 * 4 + 2) * BSH, "all_gather": 8 * 64 * 256 * 4}
    sp = predict(job("tp", 2, sequence_parallel=True))
    # + sequence parallel's all-reduce of the 9 norm weights' gradients (each rank saw its sequence shard), fp32
    assert sp["comm_bytes_per_step"] == {"all_gather": 18 * BSH + 8 * 64 * 256 * 4, "reduce_scatter": 18 * BSH, "all_reduce": 9 * 64 * 4}


def test_pp_boundary_traffic_stage_state_and_bubble():
    p = predict(job("pp", 2))  # 4 micro-batches by default (2 × stages)
    assert p["comm_bytes_per_step"] == {"send": BSH, "recv": BSH}
    assert p["bubble_fraction"] == pytest.approx(1 / 5)
    first, last = (s["params"] // 4 for s in p["model_state_bytes_per_stage"])
    assert first == 2 * 65664 + 16384 and last == 2 * 65664 + 16448
    assert p["model_state_bytes_per_rank"]["params"] == 4 * last
    assert predict(job("pp", 4, microbatches=4))["comm_bytes_per_step"] == {"send": 2 * BSH, "recv": 2 * BSH}


def test_ring_kv_hops_and_gradient_all_reduce():
    p = predict(job("ring", 2))
    block = 8 * 32 * 64 * 4  # K or V of the local half sequence, fp32
    per_layer = block * (2 * 1 + 4 * 1 + 2)  # fwd [k,v] × (n−1); bwd [k,v,dk,dv] × (n−1) + [dk,dv]
    assert p["comm_bytes_per_step"] == {"send": 4 * per_layer, "recv": 4 * per_layer, "all_reduce": 4 * PSI}


def test_moe_local_experts_and_all_to_alls():
    j = job("moe", 2)
    cfg = j.model  # 4 experts by default for tiny
    experts = 4 * 3 * 64 * 256 * cfg.num_layers
    psi = param_counts(cfg).total
    p = predict(j)
    assert p["model_state_bytes_per_rank"]["params"] == 4 * (psi - experts // 2)
    rows = 4 * 64 * cfg.top_k  # a rank's 4 sequences, top-2
    assert p["comm_bytes_per_step"] == {"all_to_all": cfg.num_layers * (4 * rows * 64 * 4 + 8 * 4), "all_reduce": 4 * (psi - experts)}


def test_hybrid_is_tp_inside_fsdp_over_dp():
    p = predict(job("hybrid", 4, tp=2))
    tp_local = (PSI - 9 * 64) // 2 + 9 * 64
    assert p["model_state_bytes_per_rank"]["params"] == 4 * tp_local // 2
    assert p["comm_bytes_per_step"]["reduce_scatter"] == 4 * tp_local
    assert p["comm_bytes_per_step"]["all_reduce"] == (4 * 4 + 2) * BSH // 2  # each dp group sees half the batch


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_predicts_what_autocast_runs_and_labels_both_recipes(precision):
    p = predict(job("ddp", 2, precision=precision))
    # autocast keeps fp32 master weights: fp32 params and grads, fp32 AdamW state
    assert p["model_state_bytes_per_rank"] == {"params": 4 * PSI, "grads": 4 * PSI, "optimizer": 8 * PSI}
    assert p["bytes_per_param"] == {"params": 4, "grads": 4, "optimizer": 8}
    assert "autocast" in p["precision_recipe"] and "4+4+8" in p["precision_recipe"]
    # the ZeRO table stays the paper's own recipe, labelled as such
    assert p["zero_stages_bytes_per_rank"]["baseline"] == 16 * PSI and p["zero_stages_bytes_per_rank"]["stage1"] == 4 * PSI + 12 * PSI // 2
    assert "ZeRO" in p["zero_stages_recipe"] and "2+2+12" in p["zero_stages_recipe"]
    assert p["activation_bytes_per_rank"] < predict(job("ddp", 2))["activation_bytes_per_rank"]
    fp32 = predict(job("ddp", 2))
    assert "fp32 AdamW" in fp32["precision_recipe"] and fp32["zero_stages_recipe"] == fp32["precision_recipe"]


def test_zero_paper_table_for_7_5b_at_64_ranks():
    # ZeRO (Rajbhandari et al. 2020), Table 1: Ψ = 7.5B, N = 64, K = 12.
    stages = zero_stages(7_500_000_000, 64, "bf16")
    assert {k: round(v / GB, 1) for k, v in stages.items()} == {"baseline": 120.0, "stage1": 31.4, "stage2": 16.6, "stage3": 1.9}
    # a GPT shape of 7.5B parameters, planned as FSDP (stage 3) on 64 ranks
    spec = JobSpec.model_validate(
        {
            "workload": {
                "model": "tiny",
                "num_layers": 40,
                "hidden_size": 4096,
                "num_heads": 32,
                "vocab_size": 50257,
                "ffn_hidden_size": 8960,
                "seq_len": 1024,
                "global_batch_size": 64,
                "precision": "bf16",
            },
            "strategy": {"name": "fsdp", "world_size": 64},
        }
    )
    p = predict(resolve_job(spec))
    assert p["params_total"] == pytest.approx(7.5e9, rel=1e-3)
    assert sum(p["model_state_bytes_per_rank"].values()) / GB == pytest.approx(1.875, rel=2e-3)
    assert round(p["zero_stages_bytes_per_rank"]["stage2"] / GB, 1) == 16.6


def test_flags_only_beyond_ten_percent():
    prediction = {
        "comm_bytes_per_step": {"all_reduce": 1000, "all_gather": 1000},
        "model_state_bytes_per_rank": {"params": 100, "grads": 100, "optimizer": 200},
        "bubble_fraction": 0.2,
    }
    summary = {"comm_bytes_per_step": {"all_reduce": 1050, "all_gather": 1200, "broadcast": 4}, "bubble_fraction": 0.21}
    ranks = [{"model_state_bytes": {"params": 100, "grads": 130, "optimizer": 200}}]
    flags = prediction_flags(prediction=prediction, summary=summary, ranks=ranks)
    assert {f["metric"] for f in flags} == {"comm_bytes_per_step.all_gather", "model_state_bytes_per_rank.grads"}
    gather = next(f for f in flags if f["metric"].endswith("all_gather"))
    assert gather["rel_gap"] == pytest.approx(0.2) and gather["predicted"] == 1000 and gather["measured"] == 1200
    summary["comm_bytes_per_step"]["broadcast"] = 500  # an unpredicted op above 1% of the total is flagged
    assert "comm_bytes_per_step.broadcast" in {f["metric"] for f in prediction_flags(prediction=prediction, summary=summary, ranks=ranks)}


# ---- bytes on the wire: the buffer × the busbw factor of each op's own process group ----


def test_wire_bytes_of_a_ring_all_reduce_and_of_fsdp_over_four_ranks():
    assert predict(job("ddp", 4))["wire_bytes_per_step"] == {"all_reduce": round(4 * PSI * 2 * 3 / 4)}
    p = predict(job("fsdp", 4))
    assert p["wire_bytes_per_step"] == {op: round(nbytes * 3 / 4) for op, nbytes in p["comm_bytes_per_step"].items()}


def test_point_to_point_sends_its_buffer():
    p = predict(job("pp", 2))
    assert p["wire_bytes_per_step"] == p["comm_bytes_per_step"] == {"send": BSH, "recv": BSH}


def test_hybrid_counts_tp_ops_over_tp_ranks_and_fsdp_ops_over_dp_ranks():
    j = job("hybrid", 8, tp=2)  # dp = 4
    (tensor, tp), (fsdp, dp) = j.descriptor.comm_groups(j)
    assert (tp, dp) == (2, 4)
    p = predict(j)
    assert p["comm_bytes_per_step"] == {op: tensor.get(op, 0) + fsdp.get(op, 0) for op in sorted(set(tensor) | set(fsdp))}
    # TP's all-reduce over 2 ranks: 2·1/2; TP's logits gather over 2: 1/2; FSDP's gathers and scatters over 4: 3/4
    assert p["wire_bytes_per_step"]["all_reduce"] == tensor["all_reduce"]
    assert p["wire_bytes_per_step"]["all_gather"] == round(tensor["all_gather"] / 2) + round(fsdp["all_gather"] * 3 / 4)
    assert p["wire_bytes_per_step"]["reduce_scatter"] == round(fsdp["reduce_scatter"] * 3 / 4)


def test_one_rank_sends_nothing():
    assert predict(job("single", 1))["wire_bytes_per_step"] == {} == predict(job("single", 1))["comm_bytes_per_step"]
