"""tp: Megatron tensor parallelism on the innermost mesh dim. Its formulas live here; the `tp`
strategy (tp alone) and every composed layout use them.

Each rank holds `tp_local` of every tensor. Per step it runs `tp_comm` for the tokens of its
data-parallel replica over the blocks of its pipeline stage; under a pipeline only the first stage
has the embedding's all-reduce and only the last the head's, so the busiest (last) stage does one
end, not two.

An MoE block's experts (and its router and shared experts) stay whole on every tp rank — the
families' plans shard its attention only, as Mixtral's own plan in `transformers` does. Every tp
rank then routes the same replicated rows and computes the same experts: routing, capacity and the
auxiliary loss are the unsplit model's, the block's input gradient is whole on each rank (nothing
to all-reduce), and only the attention's two all-reduces remain. The cost is that each tp rank
holds and computes all the experts: expert parallelism is what splits them. Sequence parallelism
would hand each rank a sequence shard to route (other capacity groups), so it stays dense-only.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

from pydantic import Field

from parallab.core.costs import Tensor, activation_dtype_bytes, state_bytes_per_param, tp_local
from parallab.core.dims.base import (
    LOGITS_GATHER,
    ActivationLayout,
    CommItem,
    Dimension,
    Draft,
    Plan,
    divisible,
    residual_stream_bytes,
)
from parallab.core.layout import Layout, MeshAxisName
from parallab.core.model import ModelConfig
from parallab.core.problems import Loc, SpecProblem

TP_ALL_REDUCES_PER_LAYER = 4
"""Megatron-LM (Shoeybi et al. 2019, §3; Korthikanti et al. 2022, §4.2.1): per transformer layer and
training step, one all-reduce of (b, s, h) after the attention and one after the MLP forward
(the row-parallel outputs, operator g), and one each backward (the conjugate operator f at each
block's input) — 4 all-reduces of b·s·h per layer."""


def async_tp_field() -> Any:
    """The `async_tp` option of every strategy with a tp dimension: asked for by torchtitan's
    published rows, predicted only (the ranks refuse it) and timed micro-pipelined
    (`async_tp_items`) where torch.compile and sequence parallelism let inductor fuse it."""
    return Field(
        False,
        description=(
            "tp: async TP (torchtitan's enable_async_tensor_parallel); predicted only — with torch.compile and "
            "sequence parallelism each block's all-gather and reduce-scatter is timed micro-pipelined with its matmuls."
        ),
    )


def norm_elements(cfg: ModelConfig) -> int:
    """Elements of the norm weights sequence parallelism leaves replicated on sequence shards:
    two RMSNorms per block and the final one, h each (a pipeline stage's model copy counts its
    blocks; sequence parallelism is not composed with a pipeline, so the final norm is there)."""
    return (2 * cfg.num_layers + 1) * cfg.hidden_size


def norm_grad_bytes(precision: str, *, fsdp: bool) -> int:
    """Bytes per element of the norms' gradients as SP all-reduces them: the gradient's dtype,
    which is the weight's as the backward sees it — the fp32 master weight (autocast leaves the
    norms in fp32: `state_bytes_per_param`), except under FSDP with a 16-bit recipe, whose
    param_dtype gathers the norm weight in 16 bits (fp8 too: norms are not Float8Linear), so the
    partial sum is made and all-reduced over tp in 16 bits before FSDP's fp32 reduce-scatter.
    Measured by the dry run (`workers.dryrun`)."""
    return 2 if fsdp and precision != "fp32" else state_bytes_per_param(precision)[1]


ASYNC_TP_NOT_MODELLED = (
    "async TP (asked for without torch.compile or sequence parallelism, which inductor's micro-pipeline pass needs: "
    "TP's collectives are timed exposed, as without it)"
)
"""What a prediction of a run that asks for async TP where nothing would be fused says."""
ASYNC_TP_PARTLY_MODELLED = "async TP: the copies' share of the SMs while the GEMM chunks run, and the head's collectives (timed unfused)"
"""What a prediction of async TP leaves out where it is modelled (`async_tp_items`)."""


def split_logits_gather(items: list[CommItem], logits: int, forwards: int) -> list[CommItem]:
    """`tp_items`' all-gather with the head's logits (`logits` bytes a step, one call a forward)
    taken out as its own item labelled `LOGITS_GATHER`, which a prediction under loss parallel
    leaves out; the bytes and calls by op are unchanged."""
    out: list[CommItem] = []
    for item in items:
        if item.op != "all_gather" or item.bytes_per_step < logits or item.calls < forwards:
            out.append(item)
            continue
        out.append(replace(item, bytes_per_step=logits, calls=forwards, label=LOGITS_GATHER))
        if item.calls > forwards:
            out.append(replace(item, bytes_per_step=item.bytes_per_step - logits, calls=item.calls - forwards))
    return out


def async_tp_fused(layout: Layout, *, compiled: bool) -> bool:
    """Whether async TP is timed micro-pipelined: asked for, with sequence parallelism (inductor's
    micro-pipeline pass fuses all-gather → matmul and matmul → reduce-scatter; an all-reduce it
    leaves alone) and torch.compile (the pass is inductor's: eager runs the collectives unfused)."""
    return layout.async_tp and layout.sequence_parallel and layout.tp > 1 and compiled


def async_tp_items(
    items: list[CommItem], cfg: ModelConfig, *, tokens: int, forwards: int, tp: int, act: int, stream: int, float8_gathers: bool
) -> list[CommItem]:
    """`tp_items` under async TP: each split block's collectives that inductor's micro-pipeline pass
    fuses with a matmul become their own items carrying those GEMMs (`CommItem.pipelined`), and
    the rest stays as it was. `tokens`: one forward's tokens (a micro-batch, whole sequence).

    torch's `_fused_all_gather_matmul` (symmetric memory, `_pipelined_all_gather_and_consume`)
    multiplies the local sequence shard first while the first remote shard is copied, then each
    remote shard as it arrives, alternating two streams; `_fused_matmul_reduce_scatter`
    (`_pipelined_produce_and_all2all`) computes the partial for each remote rank while the previous
    one is pulled, its own last, then sums the tp partials (a memory-bound kernel over the whole
    output, `reduce_fn`). So a call of n chunks overlaps its transfer with n − 1 of its n GEMM
    chunks: exposed max(0, comm − (n − 1)/n · GEMMs), plus the sum for a reduce-scatter (the
    planner's arithmetic, `planner.pipelined_exposed`).

    What the pass fuses (`micro_pipeline_tp.py`: an all-gather whose output is a matmul's left
    operand; a reduce-scatter whose input a matmul produces), per block and forward:
    - the all-gather of the block's input with its column-parallel GEMMs (wq, wk, wv; w1, w3),
    - the reduce-scatter of the row-parallel output with its GEMM (wo; w2),
    - in backward the all-gather of that output's gradient with its input-gradient GEMM (wo's, w2's).
    Not fused: the backward reduce-scatter of the block input's gradient — a sum of the
    column-parallel GEMMs' input gradients, no single producer matmul — and the two ends (the
    embedding is no matmul; the head's are left unfused, `ASYNC_TP_PARTLY_MODELLED`) and a
    labelled item (the logits' gather, `split_logits_gather`)."""
    h, f, kv = cfg.hidden_size, cfg.ffn_hidden_size, cfg.kv_dim
    attention, mlp = cfg.num_layers, split_blocks(cfg) - cfg.num_layers
    bsh = tokens * h
    gathered_in = 1 if float8_gathers else stream
    gathered_grad = 1 if float8_gathers else act
    up = [(tokens, h, f // tp)] * (cfg.mlp_matrices - 1)
    fused = [
        ("all_gather", bsh * gathered_in, attention, ((tokens, h, h // tp), (tokens, h, kv // tp), (tokens, h, kv // tp))),
        ("all_gather", bsh * gathered_in, mlp, tuple(up)),
        ("reduce_scatter", bsh * act, attention, ((tokens, h // tp, h),)),
        ("reduce_scatter", bsh * act, mlp, ((tokens, f // tp, h),)),
        ("all_gather", bsh * gathered_grad, attention, ((tokens, h, h // tp),)),
        ("all_gather", bsh * gathered_grad, mlp, ((tokens, h, f // tp),)),
    ]
    out: list[CommItem] = []
    for item in items:
        mine = [(nbytes, count * forwards, gemms) for op, nbytes, count, gemms in fused if op == item.op and count]
        if not mine or item.label:
            out.append(item)
            continue
        calls = item.calls - sum(c for _, c, _ in mine)
        rest = item.bytes_per_step - sum(b * c for b, c, _ in mine)
        out += [replace(item, bytes_per_step=b * c, calls=c, pipelined=gemms) for b, c, gemms in mine]
        if calls > 0 and rest > 0:
            out.append(replace(item, bytes_per_step=rest, calls=calls))
    return out


def tp_comm(
    cfg: ModelConfig,
    tokens: int,
    act: int,
    *,
    sequence_parallel: bool,
    grad_bytes: int,
    stream: int | None = None,
    float8_gathers: bool = False,
) -> dict[str, int]:
    """Megatron TP per step, for `tokens` tokens (b·s) of `act`-byte activations, on a residual
    stream of `stream` bytes per element (`residual_stream_bytes`; None: `act`), with gradients
    of `grad_bytes` per element (`norm_grad_bytes`).

    Without SP, per layer: Megatron's 4 all-reduces of b·s·h (`TP_ALL_REDUCES_PER_LAYER`) — the
    harness prepares each attention and MLP block's input once (PrepareModuleInput), so wq/wk/wv
    and w1/w3 share one input gradient all-reduce per block. The ends, which Megatron's count
    leaves out: the vocab-parallel embedding all-reduces its output (forward, b·s·h), the
    column-parallel head all-reduces its input gradient (backward, b·s·h) and all-gathers its
    logits (forward, b·s·V — the harness takes a plain cross-entropy on replicated logits where
    Megatron fuses a vocab-parallel one). So all_reduce = (4L + 2)·b·s·h, all_gather = b·s·V.
    With SP (Korthikanti et al. 2022), per layer each all-reduce becomes a reduce-scatter plus an
    all-gather of the same buffer: 4 + 4 of b·s·h; the embedding reduce-scatters its output
    (forward) and all-gathers that gradient (backward); the head all-gathers its input
    (reduce-scatter backward) and its logits. And the norms (Korthikanti et al. 2022, §4.2.2):
    their weights are replicated over the TP group but each rank normalises only its sequence
    shard, so each rank's weight gradient is a partial sum that must be all-reduced over tp
    before the optimizer step — h elements per norm, two norms per block and the final one
    (`norm_elements`), in the gradient's dtype (`grad_bytes`), once per optimizer step: the
    partial sums accumulate over micro-steps and the harness reduces them after the last
    backward, one call per norm (`tp_items`).

    Dtypes: the row-parallel outputs (forward) and their gradients (backward, under SP) are
    autocast's `act`; what sits on the residual stream — block inputs and their gradients, the
    embedding's output, the head's input — is `stream`. Per layer that is half of each.

    `float8_gathers` (torchao's Float8 TP styles, fp8 beside SP; predicted only — parallab's ranks
    refuse fp8 with TP): each split block's input is cast to fp8 on its sequence shard before the
    forward all-gather (PrepareFloat8ModuleInput, Float8ColwiseParallel) and each row-parallel
    output's gradient before the backward all-gather (Float8RowwiseParallel), 1 B an element; the
    reduce-scatters and the two ends (embedding, the unconverted head) keep their dtypes.
    """
    stream = act if stream is None else stream
    bsh = tokens * cfg.hidden_size
    logits = tokens * cfg.vocab_size * act
    blocks = split_blocks(cfg)
    residual = (blocks + 2) * bsh * stream  # the split blocks' inputs and the two ends
    outputs = blocks * bsh * act  # the row-parallel outputs
    if not sequence_parallel:
        return {"all_reduce": outputs + residual + latent_input_bytes(cfg, tokens, act, stream), "all_gather": logits}
    norms = norm_elements(cfg) * grad_bytes
    gathered = (2 * blocks * bsh + 2 * bsh * stream) if float8_gathers else outputs + residual
    return {"all_gather": gathered + logits, "reduce_scatter": outputs + residual, "all_reduce": norms}


def latent_input_bytes(cfg: ModelConfig, tokens: int, act: int, stream: int) -> int:
    """What multi-head latent attention's input gradients add over a plain attention's one b·s·h,
    per step (DeepSeek-V2 §2.1; the hf family's plan). Its split modules read three inputs, not
    one prepared one: the query's (the block input, h wide — or the normed query latent,
    q_lora_rank wide), the normed KV latent (kv_lora_rank), and the rotary key every head shares
    (qk_rope_head_dim); each column-parallel one all-reduces its own input gradient, and the
    rotary key's gradient is all-reduced where kv_a_proj_with_mqa emits it. The normed latents
    are the norms' outputs, in the residual stream's dtype (`stream`); the rotary key is the
    projection's output, autocast's `act`. Calls: 2 more per layer (`tp_calls`)."""
    if not cfg.is_mla:
        return 0
    query = cfg.q_lora_rank or cfg.hidden_size
    per_layer = (query + cfg.kv_lora_rank) * stream + cfg.qk_rope_head_dim * act - cfg.hidden_size * stream
    return cfg.num_layers * tokens * per_layer


def split_blocks(cfg: ModelConfig) -> int:
    """The attention and MLP blocks tensor parallelism splits: two per dense layer, the attention
    alone per MoE layer (its experts stay whole: module docstring). Each split block costs one
    row-parallel output in forward and one input gradient in backward — Megatron's
    `TP_ALL_REDUCES_PER_LAYER` = 4 per dense layer, 2 per MoE layer."""
    return 2 * cfg.num_layers - cfg.moe_layers


def block_collectives(tokens: int, hidden: int, *, act: int, stream: int, sequence_parallel: bool) -> list[tuple[str, int, int]]:
    """(op, bytes per call, calls) of one dense block's forward and backward under tp, on `tokens`
    tokens (b·s, the whole sequence) — `tp_comm`'s per-layer share: without SP the 4 all-reduces of
    b·s·h (the two row-parallel outputs forward in `act`, the two prepared inputs' gradients backward
    in `stream`); with SP each becomes a reduce-scatter, and the two inputs' gathers forward
    (`stream`) and the two outputs' gradients' gathers backward (`act`) are all-gathers. What the
    calibration times alone to take the collectives out of the block it measures under tp."""
    bsh = tokens * hidden
    if not sequence_parallel:
        return [("all_reduce", bsh * act, 2), ("all_reduce", bsh * stream, 2)]
    return [
        ("all_gather", bsh * stream, 2),
        ("all_gather", bsh * act, 2),
        ("reduce_scatter", bsh * act, 2),
        ("reduce_scatter", bsh * stream, 2),
    ]


def root_collectives(tokens: int, hidden: int, vocab: int, *, act: int, stream: int, sequence_parallel: bool) -> list[tuple[str, int, int]]:
    """(op, bytes per call, calls) of the two ends' forward and backward under tp (`tp_comm`'s ends):
    the vocab-parallel embedding's output and the column-parallel head's input gradient on the
    residual stream — all-reduced, or under SP reduce-scattered and all-gathered each way — and
    the head's logits gathered forward."""
    bsh, logits = tokens * hidden * stream, ("all_gather", tokens * vocab * act, 1)
    if not sequence_parallel:
        return [("all_reduce", bsh, 2), logits]
    return [("reduce_scatter", bsh, 2), ("all_gather", bsh, 2), logits]


def tp_calls(cfg: ModelConfig, *, sequence_parallel: bool) -> dict[str, int]:
    """Calls per accumulation micro-step of each op of `tp_comm` (the counts its docstring gives);
    under SP the norms' gradient all-reduces are per optimizer step, not here (`tp_items`)."""
    blocks = split_blocks(cfg)
    if not sequence_parallel:
        latent = 2 * cfg.num_layers if cfg.is_mla else 0  # the query's, the latent's and the rotary key's, not one
        return {"all_reduce": 2 * blocks + 2 + latent, "all_gather": 1}
    return {"all_gather": 2 * blocks + 3, "reduce_scatter": 2 * blocks + 2}


def tp_items(comm: dict[str, int], cfg: ModelConfig, *, micro_steps: int, sequence_parallel: bool, n: int) -> list[CommItem]:
    """`tp_comm`'s ops as calls: each sits between the matmuls that need it, so none hides under
    compute; under SP the norms' gradients are all-reduced once per step, one call per norm."""
    calls = tp_calls(cfg, sequence_parallel=sequence_parallel)
    if sequence_parallel:
        calls = {**calls, "all_reduce": 2 * cfg.num_layers + 1}
        micro = {op: micro_steps if op != "all_reduce" else 1 for op in comm}
    else:
        micro = dict.fromkeys(comm, micro_steps)
    return [CommItem(op, nbytes, calls[op] * micro[op], n) for op, nbytes in comm.items()]


def shape_rules(model: ModelConfig, tp: int, *, sequence_parallel: bool, loc: Loc) -> list[SpecProblem]:
    """What the model's shape must allow: whole heads and K/V heads per rank, an even split of any
    dense MLP (an all-MoE model has none to split), no tied head (the vocab-parallel embedding and
    the column-parallel head would each distribute the one matrix, untying it), and no sequence
    parallelism beside experts (each rank would route a sequence shard: module docstring); `loc`
    is where the options live, for the last."""
    if tp == 1:
        return []
    out = divisible(("workload", "num_heads"), "heads", model.num_heads, "tp", tp)
    if model.moe_layers < model.num_layers:
        out += divisible(("workload", "ffn_hidden_size"), "ffn hidden size", model.ffn_hidden_size, "tp", tp)
    if sequence_parallel and model.is_moe:
        msg = f"sequence parallel with tp={tp} would route each rank's sequence shard apart; an MoE model runs tp without it"
        out.append(SpecProblem((*loc, "sequence_parallel"), msg))
    if sequence_parallel and model.is_mla:
        msg = f"sequence parallel with tp={tp} is not composed with multi-head latent attention (its latents are whole on every rank)"
        out.append(SpecProblem((*loc, "sequence_parallel"), msg))
    if model.kv_heads != model.num_heads:  # else the heads' own rule says it
        out += divisible(("workload", "num_kv_heads"), "kv heads", model.kv_heads, "tp", tp)
    if model.tie_embeddings:
        out.append(SpecProblem(("workload", "tie_embeddings"), f"tied embeddings are not composed with tensor parallelism (tp={tp})"))
    return out


class TensorParallel(Dimension):
    splits_head: ClassVar[bool] = True
    name = MeshAxisName.TP.value
    title = "Megatron column/row tensor parallel (+ sequence parallel)"
    fp8: ClassVar[bool] = False  # torchao's Float8 TP styles are not wired into the plan

    def asked_not_modelled(self, layout: Layout, *, compiled: bool = False) -> tuple[str, ...]:
        if not layout.async_tp:
            return ()
        return (ASYNC_TP_PARTLY_MODELLED,) if async_tp_fused(layout, compiled=compiled) else (ASYNC_TP_NOT_MODELLED,)

    def rules(self, draft: Draft) -> list[SpecProblem]:
        tp, model = draft.layout.tp, draft.model
        out = shape_rules(model, tp, sequence_parallel=draft.layout.sequence_parallel, loc=draft.loc)
        if draft.layout.sequence_parallel:
            out += divisible(("workload", "seq_len"), "sequence length", model.seq_len, "tp", tp)
            if draft.layout.pp > 1:
                loc = (*draft.loc, "sequence_parallel")
                out.append(
                    SpecProblem(
                        loc,
                        f"sequence parallel with pp={draft.layout.pp} is not composed yet: its stage outputs are sequence shards",
                        predictable=True,
                    )
                )
        return out

    def local_shape(self, t: Tensor, shape: tuple[int, ...], layout: Layout) -> tuple[int, ...]:
        return tp_local(t, layout.tp)

    def comm(self, plan: Plan) -> list[CommItem]:
        lay = plan.layout
        if lay.tp == 1:
            return []
        sp, model = lay.sequence_parallel, plan.model
        act = activation_dtype_bytes(plan.precision)
        stage_model = model.model_copy(update={"num_layers": lay.most_layers(model.num_layers)})
        stream = residual_stream_bytes(plan.precision, fsdp=lay.fsdp_shards > 1)
        grad = norm_grad_bytes(plan.precision, fsdp=lay.fsdp_shards > 1)
        fp8 = plan.precision == "fp8"  # predicted only: the ranks refuse fp8 with tp (`recipes.not_runnable_here`)
        comm = tp_comm(stage_model, plan.tokens_per_rank, act, sequence_parallel=sp, grad_bytes=grad, stream=stream, float8_gathers=fp8)
        # one end per stage: the busiest (last) has the head, not the embedding — whose output is
        # all-reduced, or under SP reduce-scattered forward and its gradient all-gathered backward
        ends = ("reduce_scatter", "all_gather") if sp else ("all_reduce",)
        if lay.pp > 1:
            bsh = plan.tokens_per_rank * model.hidden_size * stream
            for op in ends:
                comm[op] -= bsh
        forwards = plan.job.accum_steps * lay.microbatches  # every pipeline micro-batch runs the stage's TP
        items = tp_items(comm, stage_model, micro_steps=forwards, sequence_parallel=sp, n=lay.tp)
        if lay.pp > 1:
            items = [replace(i, calls=i.calls - forwards) if i.op in ends else i for i in items]
        items = split_logits_gather(items, plan.tokens_per_rank * model.vocab_size * act, forwards)
        if async_tp_fused(lay, compiled=bool(plan.job.workload.compile)):
            tokens = plan.tokens_per_rank // forwards
            items = async_tp_items(
                items, stage_model, tokens=tokens, forwards=forwards, tp=lay.tp, act=act, stream=stream, float8_gathers=fp8
            )
        return items

    def activations(self, plan: Plan, layouts: list[ActivationLayout]) -> list[ActivationLayout]:
        lay = plan.layout
        if lay.tp == 1:
            return layouts
        return [replace(a, tp=lay.tp, sequence_parallel=lay.sequence_parallel) for a in layouts]


DIMENSION = TensorParallel()
