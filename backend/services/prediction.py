"""What theory predicts for a job, from its config alone (`parallab plan`, stored with each run).

Everything here counts what the harness's strategies really hold and send (workers/strategies),
tensor by tensor, so a measured run can be held against it:

Model state per rank (`model_state_bytes_per_rank`, the max over ranks) = the rank's local
parameter elements × bytes per element of (params, grads, optimizer): fp32 AdamW 4+4+8; mixed
precision (bf16/fp16) the ZeRO paper's 2+2+12 (K = 12: fp32 master, momentum, variance). Note
that torch autocast — what the harness uses — keeps fp32 params and grads, i.e. 4+4+8: the same
16 bytes per parameter split differently, so flags compare the mixed-precision total only.

- `single`, `ddp`, `ring`: every rank holds all Ψ (ZeRO baseline).
- `fsdp` (FSDP2 `fully_shard` per block + root): at rest — between steps, where model state is
  measured — every parameter, gradient and optimizer state is a dim-0 shard (`torch.chunk`
  semantics, rank 0 holds ceil(d0/N) rows), with `reshard_after_forward` true (ZeRO-3) *and*
  false: false only keeps the gathered parameters alive between a block's forward and its
  backward (ZeRO-2's communication, a higher peak), it does not change the resting state. So
  FSDP's resting state is ZeRO stage 3, (2+2+K)Ψ/N, either way; `zero_stages_bytes_per_rank`
  gives the paper's four rows beside it.
- `tp`: wq/wk/wv/w1/w3 column-parallel (dim 0 / tp), wo/w2 row-parallel (dim 1 / tp), the
  embedding row-parallel over the vocabulary and the LM head column-parallel (both V/tp); the
  RMSNorm weights are replicated.
- `hybrid`: the TP-local tensors, then FSDP's dim-0 shard over dp.
- `pp`: a stage's blocks, + the embedding on the first, + final norm and head on the last; the
  max over stages (per stage in `model_state_bytes_per_stage`).
- `moe`: non-expert parameters (router included) replicated + num_experts/N experts per layer.

Communication per step (`comm_bytes_per_step`, the max over ranks per op, nccl-tests' buffer
convention as measured): see `comm_bytes_per_step`. Gradients travel in fp32 (autocast keeps fp32
grads); activations in the precision's bytes, except ring attention's K/V (always fp32) and the
pipeline's residual stream (fp32 under autocast).

Activations (`activation_bytes_per_rank`) are an estimate, not exact: per block and token the
tensors autograd saves — ≈ 10·h (norm in/out, q, k, v, attention out, residual, ffn norm) + 4·f
(w1, w3, silu, product) elements, attention by a flash-style kernel (no T² term, as torch's
CPU/GPU SDPA) — plus fp32 logits and their gradient where the head lives. Full activation
checkpointing keeps each block's input plus one block's full set; `selective` is counted as none.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from backend.services.validation import ResolvedJob
from backend.workload import ModelConfig, model_flops_per_token, param_counts

# Bytes per parameter of (params, grads, optimizer state).
FP32_ADAM = (4, 4, 8)
MIXED_ADAM = (2, 2, 12)  # K = 12: fp32 master copy, momentum and variance
GB = 1e9


def state_bytes_per_param(precision: str) -> tuple[int, int, int]:
    """(params, grads, optimizer) bytes per parameter: fp32 AdamW, or ZeRO's mixed precision."""
    return FP32_ADAM if precision == "fp32" else MIXED_ADAM


def activation_dtype_bytes(precision: str) -> int:
    return {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}.get(precision, 4)


def zero_stages(psi: int, n: int, precision: str = "bf16") -> dict[str, int]:
    """The ZeRO paper's per-rank model-state bytes: baseline and stages 1–3 for Ψ params on N ranks."""
    p, g, k = state_bytes_per_param(precision)
    return {
        "baseline": (p + g + k) * psi,
        "stage1": p * psi + g * psi + k * psi // n,
        "stage2": p * psi + (g + k) * psi // n,
        "stage3": (p + g + k) * psi // n,
    }


# ---- the model's tensors, as workers.harness.model builds them ----


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple[int, ...]
    layer: int | None  # None: embedding / final norm / head (FSDP's root group)
    tp_dim: int | None  # dim TP shards (None: replicated)
    expert: bool = False


def model_tensors(cfg: ModelConfig) -> list[Tensor]:
    """Every parameter of the workload model with the dim TP shards (nn.Linear weight is (out, in))."""
    h, f, v = cfg.hidden_size, cfg.ffn_hidden_size, cfg.vocab_size
    out = [Tensor("tok_embeddings.weight", (v, h), None, 0)]
    for i in range(cfg.num_layers):
        out += [Tensor(f"layers.{i}.attention_norm.weight", (h,), i, None),
                Tensor(f"layers.{i}.ffn_norm.weight", (h,), i, None)]
        out += [Tensor(f"layers.{i}.attention.w{x}.weight", (h, h), i, 0) for x in "qkv"]
        out += [Tensor(f"layers.{i}.attention.wo.weight", (h, h), i, 1)]
        if cfg.is_moe:
            e = cfg.num_experts
            out += [Tensor(f"layers.{i}.feed_forward.router.weight", (e, h), i, None)]
            out += [Tensor(f"layers.{i}.feed_forward.{w}", s, i, None, expert=True)
                    for w, s in (("w1", (e, h, f)), ("w3", (e, h, f)), ("w2", (e, f, h)))]
        else:
            out += [Tensor(f"layers.{i}.feed_forward.w1.weight", (f, h), i, 0),
                    Tensor(f"layers.{i}.feed_forward.w3.weight", (f, h), i, 0),
                    Tensor(f"layers.{i}.feed_forward.w2.weight", (h, f), i, 1)]
    out += [Tensor("norm.weight", (h,), None, None), Tensor("output.weight", (v, h), None, 0)]
    return out


def _chunk(shape: tuple[int, ...], dim: int, n: int) -> tuple[int, ...]:
    """Rank 0's piece of `shape` split n ways along `dim` (torch.chunk: ceil)."""
    return tuple(math.ceil(d / n) if i == dim else d for i, d in enumerate(shape))


def _numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def _tp_local(t: Tensor, tp: int) -> tuple[int, ...]:
    return _chunk(t.shape, t.tp_dim, tp) if t.tp_dim is not None and tp > 1 else t.shape


def _fsdp_padded(shape: tuple[int, ...], n: int) -> int:
    """Elements FSDP2's all-gather / reduce-scatter buffer holds for one param (dim 0 padded to N)."""
    return math.ceil(shape[0] / n) * n * _numel(shape[1:])


def _layers_of_stage(cfg: ModelConfig, stage: int, stages: int) -> range:
    per = cfg.num_layers // stages
    return range(stage * per, (stage + 1) * per)


def _stage_tensors(cfg: ModelConfig, stage: int, stages: int) -> list[Tensor]:
    layers = set(_layers_of_stage(cfg, stage, stages))
    keep = []
    for t in model_tensors(cfg):
        if t.layer is not None:
            if t.layer in layers:
                keep.append(t)
        elif t.name.startswith("tok_embeddings"):
            if stage == 0:
                keep.append(t)
        elif stage == stages - 1:
            keep.append(t)
    return keep


def local_param_elements(job: ResolvedJob) -> list[int]:
    """Parameter elements each rank holds (one entry per rank, or per stage for pp)."""
    cfg, n, s = job.model, job.world_size, job.strategy
    tensors = model_tensors(cfg)
    if s in ("single", "ddp", "ring"):
        return [sum(_numel(t.shape) for t in tensors)]
    if s == "fsdp":
        return [sum(_numel(_chunk(t.shape, 0, n)) for t in tensors)]
    if s == "tp":
        return [sum(_numel(_tp_local(t, n)) for t in tensors)]
    if s == "hybrid":
        tp = job.options["tp"]
        return [sum(_numel(_chunk(_tp_local(t, tp), 0, n // tp)) for t in tensors)]
    if s == "pp":
        return [sum(_numel(t.shape) for t in _stage_tensors(cfg, i, n)) for i in range(n)]
    if s == "moe":
        return [sum(_numel(_chunk(t.shape, 0, n)) if t.expert else _numel(t.shape) for t in tensors)]
    return [sum(_numel(t.shape) for t in tensors)]


def model_state_per_rank(job: ResolvedJob) -> dict[str, int]:
    """{params, grads, optimizer} bytes of the rank that holds the most."""
    p, g, k = state_bytes_per_param(job.spec.workload.precision)
    most = max(local_param_elements(job))
    return {"params": p * most, "grads": g * most, "optimizer": k * most}


# ---- communication ----


def _tokens_per_rank(job: ResolvedJob) -> int:
    """Tokens one rank's model replica processes per optimizer step (all micro-steps)."""
    return job.global_batch_size // job.dp_degree * job.model.seq_len


def _tp_comm(cfg: ModelConfig, tokens: int, act: int, *, sequence_parallel: bool) -> dict[str, int]:
    """Megatron TP as `tensor_parallel.parallelize` applies it, per step, for `tokens` tokens.

    Without SP, per block: forward one all-reduce after wo and one after w2 (row-parallel
    outputs); backward one per column-parallel input — wq, wk, wv, w1, w3 each turn their
    replicated input into a DTensor, so each input gradient is all-reduced on its own (5). The
    vocab-parallel embedding all-reduces its output (forward), the head's input gradient is
    all-reduced (backward) and its logits are all-gathered (forward).
    With SP, per block: an all-gather before attention and before the MLP and a reduce-scatter
    after wo and w2, forward; the mirror image backward (4 + 4); the embedding reduce-scatters its
    output (forward) and all-gathers that gradient (backward); the head all-gathers its input
    (reduce-scatter backward) and its logits. The norm weights' gradients (replicated weights on
    a sequence shard) get no collective in the harness, so none is counted.
    """
    bsh = tokens * cfg.hidden_size * act
    logits = tokens * cfg.vocab_size * act
    L = cfg.num_layers
    if not sequence_parallel:
        return {"all_reduce": (7 * L + 2) * bsh, "all_gather": logits}
    return {"all_gather": (4 * L + 2) * bsh + logits, "reduce_scatter": (4 * L + 2) * bsh}


def _fsdp_comm(tensors: list[Tensor], n: int, *, reshard_after_forward: bool,
               param_bytes: int, local: Any = None) -> dict[str, int]:
    """FSDP2 per step: all-gather every group (blocks and root) forward, and again in backward when
    they reshard after forward — the root too, since `fsdp.shard` passes the option explicitly
    (FSDP2's "root never reshards" heuristic applies only to the default); reduce-scatter every
    gradient (fp32). Buffers are dim-0 padded to a multiple of N."""
    local = local or (lambda t: t.shape)
    total = sum(_fsdp_padded(local(t), n) for t in tensors)
    return {"all_gather": total * param_bytes * (2 if reshard_after_forward else 1), "reduce_scatter": total * 4}


def comm_bytes_per_step(job: ResolvedJob) -> dict[str, int]:
    """Bytes per step by op on the busiest rank, in nccl-tests' buffer convention."""
    cfg, n, s, o = job.model, job.world_size, job.strategy, job.options
    precision = job.spec.workload.precision
    act = activation_dtype_bytes(precision)
    psi = param_counts(cfg).total
    tensors = model_tensors(cfg)
    gather_bytes = 2 if precision in ("bf16", "fp16") else 4  # FSDP2's param_dtype on accelerators
    if s == "single" or n == 1:
        return {}
    if s == "ddp":
        return {"all_reduce": psi * 4}
    if s == "fsdp":
        return _fsdp_comm(tensors, n, reshard_after_forward=o["reshard_after_forward"], param_bytes=gather_bytes)
    if s == "tp":
        return _tp_comm(cfg, _tokens_per_rank(job), act, sequence_parallel=o["sequence_parallel"])
    if s == "hybrid":
        tp, dp = o["tp"], n // o["tp"]
        out = _tp_comm(cfg, _tokens_per_rank(job), act, sequence_parallel=o["sequence_parallel"])
        fsdp = _fsdp_comm(tensors, dp, reshard_after_forward=o["reshard_after_forward"], param_bytes=gather_bytes,
                          local=lambda t: _tp_local(t, tp))
        return {op: out.get(op, 0) + fsdp.get(op, 0) for op in sorted(set(out) | set(fsdp))}
    if s == "ring":
        # K/V of the local sequence slice, fp32: forward n−1 hops of [k, v]; backward n−1 hops of
        # [k, v, dk, dv] and a last hop returning [dk, dv] to the owner. Then one gradient all-reduce.
        block = job.global_batch_size * (cfg.seq_len // n) * cfg.hidden_size * 4
        p2p = cfg.num_layers * block * (2 * (n - 1) + 4 * (n - 1) + 2)
        return {"send": p2p, "recv": p2p, "all_reduce": psi * 4}
    if s == "moe":
        # Per MoE layer: counts (E int64), then rows out and back forward, reversed backward. With
        # no drops and even routing a rank sends and receives tokens·top_k rows each way.
        rows = _tokens_per_rank(job) * cfg.top_k
        a2a = cfg.num_layers * (4 * rows * cfg.hidden_size * act + 8 * cfg.num_experts)
        experts = sum(_numel(t.shape) for t in tensors if t.expert)
        return {"all_to_all": a2a, "all_reduce": (psi - experts) * 4}
    if s == "pp":
        # Each micro-batch's residual stream (fp32) crosses each stage boundary forward, its
        # gradient backward; a middle stage sends both ways.
        boundary = job.global_batch_size * cfg.seq_len * cfg.hidden_size * 4
        per_rank = boundary * (2 if n > 2 else 1)
        return {"send": per_rank, "recv": per_rank}
    return {}


# ---- activations, bubble ----


def activation_bytes_per_rank(job: ResolvedJob) -> int:
    """Estimate of the activations one rank holds at its peak (see the module docstring)."""
    cfg, n, s, o = job.model, job.world_size, job.strategy, job.options
    wl = job.spec.workload
    act = activation_dtype_bytes(wl.precision)
    h = cfg.hidden_size
    f = cfg.ffn_hidden_size * (cfg.top_k * cfg.capacity_factor if cfg.is_moe else 1)
    tokens = job.global_batch_size // (job.dp_degree * wl.grad_accumulation_steps) * cfg.seq_len
    layers = cfg.num_layers
    split = 1
    if s == "ring":
        tokens //= n
    elif s in ("tp", "hybrid"):
        split = n if s == "tp" else o["tp"]
    per_token = 6 * h + (4 * h + 4 * f) / split
    if s in ("tp", "hybrid") and o.get("sequence_parallel"):
        per_token = (10 * h + 4 * f) / split
    head = tokens * cfg.vocab_size * 4 * 2
    if s == "pp":
        m = o["microbatches"]
        tokens //= m
        layers //= n
        in_flight = m if o["schedule"] == "gpipe" else min(n, m)
        tokens *= in_flight
        head //= m  # one micro-batch's logits on the last stage at a time
    if wl.activation_checkpointing == "full":
        block = tokens * (h * layers + per_token) * act
    else:
        block = tokens * per_token * layers * act
    return int(block + head)


def bubble_fraction(job: ResolvedJob) -> float | None:
    """(p−1)/(m+p−1) for a pipeline of p stages and m micro-batches; None for other strategies."""
    if job.strategy != "pp":
        return None
    p, m = job.world_size, job.options["microbatches"]
    return (p - 1) / (m + p - 1)


def predict(job: ResolvedJob) -> dict[str, Any]:
    """The `prediction` block of a result document."""
    precision = job.spec.workload.precision
    psi = param_counts(job.model).total
    p, g, k = state_bytes_per_param(precision)
    out: dict[str, Any] = {
        "model_state_bytes_per_rank": model_state_per_rank(job),
        "comm_bytes_per_step": comm_bytes_per_step(job),
        "activation_bytes_per_rank": activation_bytes_per_rank(job),
        "bubble_fraction": bubble_fraction(job),
        "flops_per_token": model_flops_per_token(job.model),
        "params_total": psi,
        "bytes_per_param": {"params": p, "grads": g, "optimizer": k},
        "zero_stages_bytes_per_rank": zero_stages(psi, max(job.dp_degree, 1), precision),
    }
    if job.strategy == "pp":
        out["model_state_bytes_per_stage"] = [
            {"params": p * e, "grads": g * e, "optimizer": k * e} for e in local_param_elements(job)
        ]
    return out
