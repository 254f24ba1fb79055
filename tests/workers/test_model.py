"""The workload model and data in one process: parameter counts, determinism, MoE routing, AC."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from parallab.core.families import param_counts
from parallab.core.model import PRESETS, ModelConfig
from workers.harness.data import global_batch, micro_batch, sequence_positions
from workers.harness.model import MoE, apply_activation_checkpointing, build_model


def replace(cfg: ModelConfig, **fields: Any) -> ModelConfig:
    """`cfg` with `fields` changed, validated like any config."""
    return ModelConfig.model_validate({**cfg.model_dump(), **fields})


TINY = PRESETS["tiny"].config
TINY_MOE = replace(TINY, num_experts=4, top_k=2)
SMALL = PRESETS["small"].config


@pytest.mark.parametrize(
    "cfg", [TINY, TINY_MOE, SMALL, replace(SMALL, num_experts=8, top_k=1)], ids=["tiny", "tiny-moe", "small", "small-moe"]
)
def test_parameter_count_matches_param_counts(cfg):
    model = build_model(cfg, seed=0)
    counts = param_counts(cfg)
    assert sum(p.numel() for p in model.parameters()) == counts.total
    assert model.tok_embeddings.weight.numel() == counts.embedding


def test_same_seed_same_weights_and_other_seed_differs():
    a, b, c = build_model(TINY, seed=3), build_model(TINY, seed=3), build_model(TINY, seed=4)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
    assert not torch.equal(a.layers["0"].attention.wq.weight, c.layers["0"].attention.wq.weight)


def test_global_batch_is_deterministic_and_shifted():
    x1, y1 = global_batch(TINY, global_batch_size=8, seed=0, step=5)
    x2, y2 = global_batch(TINY, global_batch_size=8, seed=0, step=5)
    x3, _ = global_batch(TINY, global_batch_size=8, seed=0, step=6)
    assert x1.shape == (8, TINY.seq_len) and torch.equal(x1, x2) and torch.equal(y1, y2)
    assert not torch.equal(x1, x3)
    assert torch.equal(x1[:, 1:], y1[:, :-1])


def test_micro_batches_partition_the_batch_in_accum_then_rank_order():
    rows = torch.arange(16)[:, None]
    parts = [micro_batch(rows, accum_steps=2, micro_step=a, dp_degree=4, dp_rank=r) for a in range(2) for r in range(4)]
    assert torch.equal(torch.cat(parts), rows)
    # the reference's micro-step a (dp 1) is exactly the union of every rank's micro-step a
    assert torch.equal(micro_batch(rows, accum_steps=2, micro_step=1), torch.cat(parts[4:]))


@pytest.mark.parametrize("zigzag", [False, True])
@pytest.mark.parametrize("n", [2, 4])
def test_sequence_positions_cover_the_sequence_once(n, zigzag):
    parts = [sequence_positions(64, ring_size=n, ring_rank=r, zigzag=zigzag) for r in range(n)]
    assert sorted(torch.cat(parts).tolist()) == list(range(64))
    if zigzag:
        assert parts[0].tolist()[:8] == list(range(8)) and parts[0].tolist()[-8:] == list(range(64 - 8, 64))


def test_forward_gives_logits_and_loss():
    model = build_model(TINY, seed=0)
    x, y = global_batch(TINY, global_batch_size=2, seed=0, step=0)
    logits = model(x)
    assert logits.shape == (2, TINY.seq_len, TINY.vocab_size)
    loss = model(x, labels=y)
    assert loss.ndim == 0 and abs(loss.item() - torch.log(torch.tensor(256.0)).item()) < 0.1


@pytest.mark.parametrize("mode", ["full", "selective", "alternate"])
def test_activation_checkpointing_changes_nothing_numerically(mode):
    """fp32 recomputation re-runs the same kernels on the same inputs: bitwise equal to none."""
    x, y = global_batch(TINY_MOE, global_batch_size=2, seed=0, step=0)
    grads = []
    for m in ("none", mode):
        model = build_model(TINY_MOE, seed=0, aux_loss_coef=0.01)
        apply_activation_checkpointing(model, m)
        model(x, labels=y).backward()
        grads.append([p.grad for p in model.parameters()])
        # a recompute in backward must not count routed tokens twice
        assert int(model.layers["0"].feed_forward.stat_routed.sum()) == 2 * TINY.seq_len * 2
    for a, b in zip(*grads, strict=True):
        assert torch.equal(a, b)


def test_checkpointing_modes_set_each_blocks_recomputation():
    model = build_model(TINY, seed=0)
    for mode, expect in (
        ("none", ["none"] * 4),
        ("full", ["full"] * 4),
        ("selective", ["selective"] * 4),
        ("alternate", ["full", "none"] * 2),
    ):
        apply_activation_checkpointing(model, mode)
        assert [b.recompute for b in model.blocks()] == expect
    with pytest.raises(ValueError, match="unknown activation checkpointing mode 'some'"):
        apply_activation_checkpointing(model, "some")


def test_recomputation_keeps_fewer_activations_the_more_it_recomputes():
    """MemTracker's activation peak of one step: none > selective (keeps only the matmul outputs) > full."""
    from torch.distributed._tools.mem_tracker import MemTracker

    x, y = global_batch(TINY, global_batch_size=8, seed=0, step=0)
    peaks = {}
    for mode in ("none", "selective", "full"):
        model = build_model(TINY, seed=0)
        apply_activation_checkpointing(model, mode)
        tracker = MemTracker()
        tracker.track_external(model)
        with tracker:
            model(x, labels=y).backward()
        snapshot = tracker.get_tracker_snapshot("peak")
        peaks[mode] = sum(v for stats in snapshot.values() for k, v in stats.items() if str(k).endswith("ACT"))
    assert peaks["none"] > peaks["selective"] > peaks["full"] > 0
    assert peaks["full"] < 0.4 * peaks["none"]


def test_moe_capacity_drops_and_route_groups():
    torch.manual_seed(0)
    moe = MoE(replace(TINY_MOE, capacity_factor=0.5))
    for p in moe.parameters():
        torch.nn.init.normal_(p, std=0.1)
    x = torch.randn(4, 16, TINY.hidden_size)
    moe(x)
    cap = -(-int(0.5 * 64 * 2) // 4)  # ceil(cf · tokens · k / E) tokens per expert
    assert int(moe.stat_dropped) == int((moe.stat_routed - cap).clamp(min=0).sum()) > 0
    # with two routing groups each group of 2 rows gets its own (halved) capacity
    moe.reset_stats()
    moe.route_groups = 2
    out = moe(x)
    assert out.shape == x.shape and int(moe.stat_routed.sum()) == 64 * 2  # every token, top_k slots


def test_moe_without_drops_equals_dense_mixture():
    """Capacity high enough: each token's output is Σ_k gate_k · expert_k(x), computed naively."""
    torch.manual_seed(0)
    moe = MoE(replace(TINY_MOE, capacity_factor=64.0))  # the bound: ample for every token
    for p in moe.parameters():
        torch.nn.init.normal_(p, std=0.1)
    x = torch.randn(2, 8, TINY.hidden_size)
    out = moe(x).reshape(-1, TINY.hidden_size)
    flat = x.reshape(-1, TINY.hidden_size)
    gate, idx = torch.softmax(moe.router(flat), -1).topk(2, -1)
    expect = torch.zeros_like(flat)
    for t in range(flat.shape[0]):
        for j in range(2):
            e = idx[t, j]
            h = torch.nn.functional.silu(flat[t] @ moe.w1[e]) * (flat[t] @ moe.w3[e])
            expect[t] += gate[t, j] * (h @ moe.w2[e])
    torch.testing.assert_close(out, expect, rtol=1e-5, atol=1e-6)
    assert int(moe.stat_dropped) == 0
