"""The cp dimension (the `ring` preset, and every layout with cp; `compose` applies it): context
parallelism with our own ring attention (torch's context_parallel has no CPU path).

The sequence is sharded over the ring (`data.sequence_positions`: contiguous, or zig-zag where
rank i holds chunks i and 2n−1−i so causal work is balanced). Each rank keeps its queries and
passes its K/V block around the ring with `batch_isend_irecv`: at step s it holds the block of
rank (i−s) mod n, attends to it (causal mask from *global* positions), and merges the partial
result with an online softmax (running log-sum-exp). The next block's transfer is started before
the current block's compute, so communication overlaps compute.

Backward (`RingAttention.backward`, flash-attention's formulas with the saved global LSE) goes
round the ring again: the K/V block travels with its dK/dV accumulator; each rank adds its
queries' contribution and passes both on; after n hops the accumulator is back on its owner.

Everything outside attention is replicated (rotary tables from the global positions); each rank's
loss is over its tokens, and `average_grads` averages all gradients over the ring in one all-reduce.
`parallelize`, `shard_sequence` and `average_grads` are the cp step of `compose` (beside FSDP,
every cp rank of a data-parallel group takes the group's rows).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from workers.harness.data import sequence_positions
from workers.harness.model import Transformer
from workers.strategies.base import MicroBatch, flat_all_reduce_, local_grad


def _exchange(send: torch.Tensor, group: dist.ProcessGroup) -> tuple[torch.Tensor, list[dist.Work]]:
    """Start sending `send` to the next rank and receiving the previous rank's into a new buffer."""
    n, r = dist.get_world_size(group), dist.get_rank(group)
    recv = torch.empty_like(send)
    ops = [
        dist.P2POp(dist.isend, send, dist.get_global_rank(group, (r + 1) % n), group),
        dist.P2POp(dist.irecv, recv, dist.get_global_rank(group, (r - 1) % n), group),
    ]
    return recv, dist.batch_isend_irecv(ops)


def _mask(q_pos: torch.Tensor, kv_pos: torch.Tensor, causal: bool) -> torch.Tensor | None:
    return kv_pos[None, :] <= q_pos[:, None] if causal else None


def _block_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """One K/V block: (out, lse) with fully masked rows giving out 0 and lse −inf."""
    s = (q @ k.transpose(-1, -2)) * scale
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)[..., None])
    return p @ v, lse


class RingAttention(torch.autograd.Function):
    """softmax(QKᵀ/√d + mask)V over the ring's whole sequence; q, k, v are (B, H, S_local, D)."""

    # `ctx` is autograd's per-call context: it carries what backward needs as plain attributes.
    @staticmethod
    def forward(
        ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: dist.ProcessGroup, positions: list[torch.Tensor], causal: bool
    ) -> torch.Tensor:
        n, r = dist.get_world_size(group), dist.get_rank(group)
        dtype = q.dtype
        with torch.autocast(q.device.type, enabled=False):
            qf, kv = q.float(), torch.stack([k.float(), v.float()])
            scale = q.shape[-1] ** -0.5
            out = lse = None
            for step in range(n):
                pending = _exchange(kv, group) if step < n - 1 else None
                src = (r - step) % n
                mask = _mask(positions[r], positions[src], causal)
                if mask is None or bool(mask.any()):
                    blk_out, blk_lse = _block_forward(qf, kv[0], kv[1], mask, scale)
                    if out is None or lse is None:  # step 0: own block, every query sees at least itself
                        out, lse = blk_out, blk_lse
                    else:
                        new_lse = torch.logaddexp(lse, blk_lse)
                        out = out * torch.exp(lse - new_lse)[..., None] + blk_out * torch.exp(blk_lse - new_lse)[..., None]
                        lse = new_lse
                if pending is not None:
                    recv, reqs = pending
                    for req in reqs:
                        req.wait()
                    kv = recv
        assert out is not None, "step 0 attends to the rank's own block"
        ctx.save_for_backward(qf, k, v, out, lse)
        ctx.group, ctx.positions, ctx.causal, ctx.scale = group, positions, causal, scale
        ctx.dtypes = (q.dtype, k.dtype, v.dtype)
        return out.to(dtype)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        qf, k, v, out, lse = ctx.saved_tensors
        group, positions, causal, scale = ctx.group, ctx.positions, ctx.causal, ctx.scale
        n, r = dist.get_world_size(group), dist.get_rank(group)
        with torch.autocast(qf.device.type, enabled=False):
            do = grad_out.float()
            delta = (do * out).sum(-1, keepdim=True)
            dq = torch.zeros_like(qf)
            # [k, v, dk, dv] travel together; dk/dv accumulate every rank's contribution.
            packed = torch.stack([k.float(), v.float(), torch.zeros_like(qf), torch.zeros_like(qf)])
            for step in range(n):
                src = (r - step) % n
                mask = _mask(positions[r], positions[src], causal)
                if mask is None or bool(mask.any()):
                    kb, vb = packed[0], packed[1]
                    s = (qf @ kb.transpose(-1, -2)) * scale
                    if mask is not None:
                        s = s.masked_fill(~mask, float("-inf"))
                    p = torch.exp(s - lse[..., None])
                    dp = do @ vb.transpose(-1, -2)
                    ds = p * (dp - delta)
                    dq += (ds @ kb) * scale
                    packed = packed.clone()
                    packed[2] += (ds.transpose(-1, -2) @ qf) * scale
                    packed[3] += p.transpose(-1, -2) @ do
                # The last hop only returns the gradients to the block's owner (src = r + 1).
                send = packed if step < n - 1 else packed[2:].contiguous()
                if n > 1:
                    recv, reqs = _exchange(send, group)
                    for req in reqs:
                        req.wait()
                else:
                    recv = send
                if step < n - 1:
                    packed = recv
                else:
                    dkv = recv
        qt, kt, vt = ctx.dtypes
        return dq.to(qt), dkv[0].to(kt), dkv[1].to(vt), None, None, None


def ring_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, group: dist.ProcessGroup, positions: list[torch.Tensor], causal: bool = True
) -> torch.Tensor:
    """Attention of the local queries over the whole ring; `positions[i]` are rank i's global positions."""
    out: torch.Tensor = RingAttention.apply(q, k, v, group, positions, causal)
    return out


def parallelize(model: Transformer, cp: DeviceMesh, device: torch.device, *, zigzag: bool) -> Transformer:
    """Every attention of `model` runs over the ring of `cp` (a 1-D mesh), rank i holding the
    global positions `sequence_positions` gives it (what `shard_sequence` cuts each batch to)."""
    n = cp.size()
    positions = [sequence_positions(model.cfg.seq_len, ring_size=n, ring_rank=i, zigzag=zigzag).to(device) for i in range(n)]
    attn = functools.partial(ring_attention, group=cp.get_group(), positions=positions, causal=True)
    for attention in model.attentions():
        attention.attn_fn = attn
    return model


def shard_sequence(batch: MicroBatch, cp: DeviceMesh, *, zigzag: bool) -> MicroBatch:
    """Every row of `batch`, only this rank's sequence positions (inputs, labels and rotary)."""
    pos = sequence_positions(batch.inputs.shape[1], ring_size=cp.size(), ring_rank=cp.get_local_rank(), zigzag=zigzag)
    return MicroBatch(batch.inputs[:, pos], batch.labels[:, pos], pos)


def average_grads(model: nn.Module, cp: DeviceMesh) -> None:
    """Each rank's loss covers 1/n of the tokens: the gradient of the global mean is the ring
    average, in one flat all-reduce (of the local shards, where FSDP holds the parameters)."""
    grads = [local_grad(p.grad) for p in model.parameters() if p.grad is not None]
    flat_all_reduce_(grads, cp.get_group(), scale=1.0 / cp.size())
