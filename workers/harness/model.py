"""The workload model: the `parallab` family's decoder built from a `ModelConfig`.

Parameter layout is contractual — the family (`parallab.core.families.parallab`) declares exactly
these tensors, and its formulas count them: token embedding; per block RMSNorm, q/k/v (k and v
kv_heads × head_dim wide, biases when `attention_bias`) and o, RMSNorm, a SwiGLU (w1, w3: h→f; w2:
f→h) or GELU (w1, w2) MLP or an MoE MLP (router h→E, E experts stored stacked, shared experts as
one MLP); final RMSNorm; the LM head, untied or the embedding's own matrix. Rotary positions, no
position table. Under grouped-query attention each K/V head serves num_heads / kv_heads query
heads: K and V are repeated to the query heads before `attn_fn` (torchtitan's `repeat_kv`), so
every attention function sees as many K/V heads as query heads.

Names are chosen for the strategies: blocks live in a `ModuleDict` keyed "0".."L-1" so pipeline
stages can drop blocks without renaming the others (torchtitan's layout), and the three hooks a
strategy may set are plain attributes — `Attention.attn_fn` (ring attention swaps it),
`MoE.dispatch` (expert parallel swaps it) and `Block.recompute` (activation checkpointing).

Activation checkpointing (`apply_activation_checkpointing`, the workload's recipe) sets each
block's `recompute` to "none", "full" (the whole block recomputed in backward) or "selective":
op-level selective recomputation through torch's policy API
(`torch.utils.checkpoint.create_selective_checkpoint_contexts`) that keeps every matmul's output
and recomputes the rest — norms, rotary, SwiGLU's activation and the attention's softmax/dropout
region (the fused SDPA op). Korthikanti et al. 2022 recompute only the attention core because in
their kernel its s² softmax and dropout tensors dominate; a fused SDPA kernel never stores those,
so recomputing SDPA alone would save nothing. The same trade-off in this model — recompute what
costs memory but few FLOPs, keep what costs FLOPs — keeps the matmul outputs (and the outputs of
functional collectives, so recomputation adds no communication).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from parallab.core.families import family_of
from parallab.core.model import ModelConfig

if TYPE_CHECKING:
    from workers.harness.routing import Tape


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return out.type_as(x) * self.weight


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of shape (T, head_dim/2) for the given *global* token positions."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    angles = positions.float()[:, None] * inv_freq[None, :]
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[..., 2i], x[..., 2i+1]); x is (B, T, heads, D)."""
    xf = x.float().unflatten(-1, (-1, 2))
    x1, x2 = xf[..., 0], xf[..., 1]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    out = torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2)
    return out.type_as(x)


def causal_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Default attention: (B, heads, T, D) in and out, causal over the full local sequence."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def repeat_kv(x: torch.Tensor, times: int) -> torch.Tensor:
    """(B, T, kv_heads, D) → (B, T, kv_heads·times, D), each K/V head next to its query heads' copies."""
    if times == 1:
        return x
    b, t, heads, d = x.shape
    return x[:, :, :, None, :].expand(b, t, heads, times, d).reshape(b, t, heads * times, d)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        h, kv, bias = cfg.hidden_size, cfg.kv_dim, cfg.attention_bias
        self.head_dim = cfg.head_width
        self.wq = nn.Linear(h, h, bias=bias)
        self.wk = nn.Linear(h, kv, bias=bias)
        self.wv = nn.Linear(h, kv, bias=bias)
        self.wo = nn.Linear(h, h, bias=False)
        self.attn_fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] = causal_sdpa

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        # -1 heads: under tensor parallelism wq/wk/wv are column-sharded and hold heads/tp (kv_heads/tp) heads.
        q = self.wq(x).view(b, t, -1, self.head_dim)
        k = self.wk(x).view(b, t, -1, self.head_dim)
        v = self.wv(x).view(b, t, -1, self.head_dim)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        times = q.shape[2] // k.shape[2]
        k, v = repeat_kv(k, times), repeat_kv(v, times)
        out = self.attn_fn(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return self.wo(out.transpose(1, 2).reshape(b, t, -1))


class FeedForward(nn.Module):
    """SwiGLU (w2(silu(w1 x) · w3 x)) or GELU (w2(gelu(w1 x))) of inner width `width` (default: the config's)."""

    def __init__(self, cfg: ModelConfig, width: int | None = None):
        super().__init__()
        f = width or cfg.ffn_hidden_size
        self.w1 = nn.Linear(cfg.hidden_size, f, bias=False)
        self.w3 = nn.Linear(cfg.hidden_size, f, bias=False) if cfg.mlp == "swiglu" else None
        self.w2 = nn.Linear(f, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.w3 is None:
            return self.w2(F.gelu(self.w1(x)))
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


def expert_ffn(x: torch.Tensor, w1: torch.Tensor, w3: torch.Tensor | None, w2: torch.Tensor) -> torch.Tensor:
    """One expert (SwiGLU, or GELU without w3) on the rows routed to it."""
    if w3 is None:
        return F.gelu(x @ w1) @ w2
    return (F.silu(x @ w1) * (x @ w3)) @ w2


class ExpertLayer(nn.Module):
    """What expert parallelism slices and re-routes, whichever family's MoE holds the experts (the
    parallab `MoE`; the hf family's library experts, `workers.harness.hf.HFExperts`): stacked
    expert weights (dim 0: the expert, `experts()`), the slice this rank holds (`expert_offset`,
    `num_local_experts` of `num_experts`), a way to run rows on the local experts (`run_experts`),
    and `dispatch`, which moves routed rows to their experts and back — `local_dispatch` here,
    an all-to-all under expert parallelism (`workers.strategies.expert_parallel`)."""

    num_experts: int
    num_local_experts: int
    expert_offset: int
    dispatch: Callable[[ExpertLayer, torch.Tensor, torch.Tensor], torch.Tensor]

    def experts(self) -> dict[str, nn.Parameter]:
        """The stacked expert weights by attribute, what expert parallelism slices on dim 0."""
        raise NotImplementedError

    def run_experts(self, xs: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """Rows sorted by local expert, `counts[i]` rows for local expert i."""
        raise NotImplementedError


def local_dispatch(moe: ExpertLayer, xs: torch.Tensor, expert_ids: torch.Tensor) -> torch.Tensor:
    """Every expert is on this rank: group the routed rows by expert, run each, restore the order."""
    order = torch.argsort(expert_ids, stable=True)
    counts = torch.bincount(expert_ids - moe.expert_offset, minlength=moe.num_local_experts)
    out = moe.run_experts(xs[order], counts.tolist())
    return out[torch.argsort(order)]


class MoE(ExpertLayer):
    """Top-k softmax router over E experts with a capacity per expert and Switch's aux loss, plus
    the shared experts every token passes through (`shared`: one MLP of width S·f, or None).

    Routing is per *group* of batch rows (`route_groups`, default 1): each group gets capacity
    ceil(capacity_factor · tokens_in_group · top_k / E); within an expert's queue the slots are
    served first-choice-first, then by token order, and those past capacity are dropped (the
    token keeps only its residual). The aux loss is the mean over groups of
    E · Σ_e f_e · P_e (f_e: share of the group's routed slots sent to e, P_e: mean router prob).
    Under expert parallelism each rank's local batch is one group, so a single process that
    routes the same rows in `dp` groups computes the very same thing (see expert_parallel.py).

    The experts' weights are stacked (E, h, f) so expert parallelism slices the first dim;
    `dispatch` moves routed rows to their experts and back (local here, all-to-all under EP).
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        h, f, e = cfg.hidden_size, cfg.ffn_hidden_size, cfg.num_experts
        self.num_experts, self.top_k, self.capacity_factor = e, cfg.top_k, cfg.capacity_factor
        self.router = nn.Linear(h, e, bias=False)
        self.w1 = nn.Parameter(torch.empty(e, h, f))
        self.w3 = nn.Parameter(torch.empty(e, h, f)) if cfg.mlp == "swiglu" else None
        self.w2 = nn.Parameter(torch.empty(e, f, h))
        self.shared = FeedForward(cfg, cfg.num_shared_experts * f) if cfg.num_shared_experts else None
        self.expert_offset = 0
        self.num_local_experts = e
        self.route_groups = 1
        self.tape: Tape | None = None
        """The gradient check's routing replay (`workers.harness.routing`): records or sets the choices."""
        self.dispatch = local_dispatch
        self.aux_loss: torch.Tensor = torch.zeros(())
        self.reset_stats()

    def experts(self) -> dict[str, nn.Parameter]:
        """The stacked expert weights by attribute (dim 0: the expert), what expert parallelism slices."""
        return {name: w for name in ("w1", "w3", "w2") if isinstance(w := getattr(self, name), nn.Parameter)}

    def reset_stats(self) -> None:
        """Counters over the forwards since the last reset (plain tensors, not buffers: DDP would broadcast buffers)."""
        self.stat_routed = torch.zeros(self.num_experts, dtype=torch.long)
        self.stat_dropped = torch.zeros((), dtype=torch.long)

    def run_experts(self, xs: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """Rows sorted by local expert, `counts[i]` rows for local expert i."""
        w3 = self.w3
        outs = [
            expert_ffn(chunk, self.w1[i], None if w3 is None else w3[i], self.w2[i])
            for i, chunk in enumerate(xs.split(counts))
            if counts[i]
        ]
        return torch.cat(outs) if outs else xs.new_zeros((0, xs.shape[-1]))

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(token, expert, gate, keep) per slot in k-major order, and the aux loss, for one group."""
        t, e, k = x.shape[0], self.num_experts, self.top_k
        probs = torch.softmax(self.router(x).float(), dim=-1)
        gate, idx = probs.topk(k, dim=-1)
        if self.tape is not None and (chosen := self.tape.choose(idx, probs)) is not idx:
            idx, gate = chosen, probs.gather(1, chosen)
        experts = idx.t().reshape(-1)  # slot order: every token's 1st choice, then 2nd, ...
        gates = gate.t().reshape(-1)
        tokens = torch.arange(t, device=x.device).repeat(k)
        onehot = F.one_hot(experts, e)
        position = (onehot.cumsum(0) - 1).gather(1, experts[:, None]).squeeze(1)
        capacity = math.ceil(self.capacity_factor * t * k / e)
        keep = position < capacity
        routed = onehot.sum(0)
        aux = e * ((routed.float() / (t * k)) * probs.mean(0)).sum()
        if torch._C._current_graph_task_id() == -1:  # not a checkpoint recompute inside backward
            if self.stat_routed.device != routed.device:  # counters live on the device: no sync per step
                self.stat_routed, self.stat_dropped = self.stat_routed.to(routed.device), self.stat_dropped.to(routed.device)
            self.stat_routed += routed.detach()
            self.stat_dropped += (~keep).sum().detach()
        return tokens, experts, gates, keep, aux

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        flat = x.reshape(-1, h)
        groups = self.route_groups
        if b % groups:
            raise ValueError(f"batch rows {b} do not split into {groups} routing groups")
        per = b // groups * t
        tok, exp, gate, aux = [], [], [], []
        for g in range(groups):
            tokens, experts, gates, keep, aux_g = self.route(flat[g * per : (g + 1) * per])
            tok.append(tokens[keep] + g * per)
            exp.append(experts[keep])
            gate.append(gates[keep])
            aux.append(aux_g)
        tokens, experts, gates = torch.cat(tok), torch.cat(exp), torch.cat(gate)
        self.aux_loss = torch.stack(aux).mean()
        out = self.dispatch(self, flat[tokens], experts)
        y = flat.new_zeros(flat.shape, dtype=out.dtype).index_add(0, tokens, out * gates[:, None].to(out.dtype))
        y = y.view(b, t, h)
        return y if self.shared is None else y + self.shared(x)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.attention_norm = RMSNorm(cfg.hidden_size, cfg.norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.hidden_size, cfg.norm_eps)
        self.feed_forward: nn.Module = MoE(cfg) if cfg.block_is_moe(layer) else FeedForward(cfg)
        self.recompute = "none"
        """"none", "selective" or "full": what this block recomputes in backward (`apply_activation_checkpointing`)."""

    def _forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin)
        return h + self.feed_forward(self.ffn_norm(h))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if self.recompute == "none" or not torch.is_grad_enabled():
            return self._forward(x, cos, sin)
        if self.recompute == "selective":
            return checkpoint(self._forward, x, cos, sin, use_reentrant=False, context_fn=selective_contexts)
        return checkpoint(self._forward, x, cos, sin, use_reentrant=False)


@dataclass(frozen=True)
class TPPlan:
    """Where tensor parallelism puts its styles on a model: root-module paths → style name, the
    path of the blocks' container, and each block's paths → style (by the block's index)."""

    root: Mapping[str, str]
    blocks: str
    block: Callable[[int], Mapping[str, str]]


@dataclass(frozen=True)
class PipelineSplit:
    """Where pipeline stages cut a model: the path of the blocks' container (keyed "0".."L-1", so
    a stage drops blocks without renaming the rest) and the root-module paths that go with the
    first stage (the embedding) and with the last (final norm, head); every other stage drops them."""

    blocks: str
    first_stage: tuple[str, ...]
    last_stage: tuple[str, ...]


class Transformer(nn.Module):
    """The decoder. `tok_embeddings`, `norm` and `output` may be None in a pipeline stage."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        embedding = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.tok_embeddings: nn.Module | None = embedding
        self.layers = nn.ModuleDict({str(i): Block(cfg, i) for i in range(cfg.num_layers)})
        self.norm: nn.Module | None = RMSNorm(cfg.hidden_size, cfg.norm_eps)
        head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            head.weight = embedding.weight
        self.output: nn.Module | None = head
        self.aux_loss_coef = 0.0
        """Weight of the MoE load-balancing loss added in `forward(..., labels=)`."""
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Deterministic init (call under `torch.manual_seed`): N(0, 0.02), norms at one, biases at zero."""
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                nn.init.ones_(p)
            elif name.endswith(".bias"):
                nn.init.zeros_(p)
            else:
                nn.init.normal_(p, std=0.02)

    def blocks(self) -> list[Block]:
        """The blocks this module holds, in order (a pipeline stage holds some)."""
        return [blk for blk in self.layers.values() if isinstance(blk, Block)]

    def attentions(self) -> list[Attention]:
        """Each held block's attention (the module its family names: context parallelism swaps its `attn_fn`)."""
        name = family_of(self.cfg).attention
        return [m for m in (blk.get_submodule(name) for blk in self.blocks()) if isinstance(m, Attention)]

    def moe_layers(self) -> list[MoE]:
        return [blk.feed_forward for blk in self.blocks() if isinstance(blk.feed_forward, MoE)]

    def expert_layers(self) -> list[ExpertLayer]:
        """The layers expert parallelism slices (`ExpertLayer`): here the MoE layers themselves; a
        model whose experts are another library's puts its adapters in place first."""
        return list(self.moe_layers())

    def tp_plan(self) -> TPPlan:
        """The TP plan its family declares (`parallab.core.families`); a model whose plan comes with
        it rather than from the family (a lab's module: its spec's) overrides this."""
        family, cfg = family_of(self.cfg), self.cfg
        return TPPlan(family.root_plan(cfg), family.blocks, lambda layer: family.block_plan(cfg, layer))

    def pipeline_split(self) -> PipelineSplit:
        """The pipeline split its family declares; a model whose split comes with it (a lab's
        module: its spec's) overrides this."""
        family = family_of(self.cfg)
        return PipelineSplit(family.blocks, family.first_stage, family.last_stage)

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor | None = None, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, T, V), or with `labels` the loss: mean cross-entropy (+ MoE aux loss).

        `tokens` is token ids on the first stage and hidden states (B, T, h) on later pipeline
        stages. `positions` are the global positions of the local tokens (ring attention holds a
        slice of the sequence); by default 0..T-1.
        """
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        if positions is None:
            # From the input, not from h: under sequence parallelism h is a sequence shard.
            positions = torch.arange(tokens.shape[1], device=tokens.device)
        cos, sin = rope_tables(positions, self.cfg.head_width, self.cfg.rope_theta)
        for block in self.layers.values():
            h = block(h, cos, sin)
        if self.norm is not None:
            h = self.norm(h)
        if self.output is None:
            return h
        logits = self.output(h)
        if labels is None:
            return logits
        loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())
        moe = self.moe_layers()
        if moe and self.aux_loss_coef:
            loss = loss + self.aux_loss_coef * sum(m.aux_loss for m in moe)
        return loss


def build_model(cfg: ModelConfig, *, seed: int, aux_loss_coef: float = 0.0, route_groups: int = 1) -> Transformer:
    """The full model on CPU, identical on every rank for a seed; strategies shard it afterwards
    (a run builds through `workers.harness.families`, which picks the model's family).

    `route_groups` (MoE only): the batch rows are routed in that many equal groups, each with its
    own capacity and aux loss — how expert parallelism over `route_groups` ranks routes.
    """
    torch.manual_seed(seed)
    model = Transformer(cfg)
    model.aux_loss_coef = aux_loss_coef if cfg.is_moe else 0.0
    for moe in model.moe_layers():
        moe.route_groups = route_groups
    return model


def build_meta(cfg: ModelConfig) -> Transformer:
    """The model on the meta device: every parameter's name and shape, no memory and no RNG — how
    a full-size preset is counted and held against its family's declaration.

    Runs build on the CPU (`build_model`): their initial weights follow from the seed through the
    constructor's own draws, and the fp32 reference curves stored for a seed depend on them.
    """
    with torch.device("meta"):
        return Transformer(cfg)


def _is_kept(op: Any) -> bool:
    """Ops whose outputs selective recomputation keeps: matmuls and functional collectives."""
    return op in _MATMULS or getattr(op, "namespace", "") == "_c10d_functional"


_MATMULS = frozenset(
    {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default, torch.ops.aten._scaled_mm.default}
)


def _keep_matmuls(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    """The selective policy: keep matmul (and collective) outputs, recompute everything else."""
    return CheckpointPolicy.MUST_SAVE if _is_kept(op) else CheckpointPolicy.PREFER_RECOMPUTE


selective_contexts = functools.partial(create_selective_checkpoint_contexts, _keep_matmuls)
"""The `context_fn` of selective recomputation (the calibrate job times its overhead)."""


def compile_blocks(model: Transformer) -> int:
    """torch.compile every block in place (`nn.Module.compile`), as torchtitan compiles each
    TransformerBlock: the blocks share one code object, so one compiled graph serves them all, and
    in place the parameter names stay the plain model's (the gradient check and the FSDP/TP plans
    read them). Called before the strategy wraps the model, after recomputation and fp8 are set, so
    the compiled code covers both; compilation itself is lazy (the first forward). Returns the count."""
    blocks = list(model.blocks())
    for block in blocks:
        block.compile()
    return len(blocks)


def apply_activation_checkpointing(model: Transformer, mode: str) -> None:
    """Set each block's recomputation: none; selective (op level, see the module docstring) on every
    block; alternate = every other block recomputed whole (torchtitan's layer SAC); full = every block."""
    if mode not in ("none", "selective", "alternate", "full"):
        raise ValueError(f"unknown activation checkpointing mode {mode!r}")
    for i, block in enumerate(model.blocks()):
        if mode == "alternate":
            block.recompute = "full" if i % 2 == 0 else "none"
        else:
            block.recompute = mode
