"""The `hf` family: a Hugging Face `transformers` causal LM of a `ModelConfig`'s shape, built
offline from its config with random weights (the rank side, `workers.harness.hf`, builds it).

Which model: the architecture registered under the workload's `model_type`
(`parallab.core.families.hf_archs`, one module each: Llama, Mistral, Qwen2, Mixtral, DeepSeek-V2,
Gemma 2, Phi-3), or, without one, the architecture the shape implies. Each architecture owns its
config keys, shape rules, tensors and tensor-parallel plan; this descriptor holds what they share.

Module paths are the library's own, so parameter names are those of its checkpoints: the root
holds `model` (embed_tokens, layers, norm) and `lm_head`; the blocks are `model.layers`, kept as
a container keyed "0".."L-1" (the library's list becomes a dict of the same names). Per block:
self_attn.{q,k,v,o}_proj, input_layernorm, post_attention_layernorm, and mlp.{gate,up,down}_proj
— or, for Mixtral, mlp.gate (the router, E×h) and mlp.experts' two fused 3-D parameters as
transformers 5 declares them: gate_up_proj (E, 2f, h: each expert's gate rows then its up rows)
and down_proj (E, h, f), the expert tensors (stacked on dim 0).

The TP plan is the library's `base_model_tp_plan` (q/k/v and gate/up column-parallel, o and down
row-parallel) plus what makes it Megatron's, as the parallab family's: each attention and MLP
input prepared once (the attention's by keyword, `input_kwarg`: the library's block calls it with
`hidden_states=`), so a block all-reduces its input gradient once per attention and once per MLP
rather than once per column-parallel linear; the embedding vocab-parallel, the head
column-parallel with gathered logits; the norms on a sequence shard under sequence parallelism.
The communication is then the parallab family's, which the prediction counts. An MoE block's
plan is the attention part only, as the parallab family's (and the library's own Mixtral plan):
its router and experts stay whole on every tp rank (`parallab.core.dims.tp`).

Expert parallelism (`moe`, `ep`) runs the library's experts: the rank side puts an adapter over
the library's two fused expert parameters (`workers.harness.hf.HFExperts`, same names) that sends
each routed slot to the rank holding its expert by the parallab family's all-to-all, after the
library's own router. Every slot travels (no capacity, nothing dropped), as the ep dimension's
prediction counts them; there is no load-balancing loss, so `aux_loss_coef` must be 0.

Pipeline stages are cut by `blocks`, `first_stage` and `last_stage` as the parallab family's
are: the first stage holds embed_tokens, the last norm and lm_head, every stage the rotary
embedding (no parameters: each stage recomputes cos/sin), so only the residual stream crosses a
boundary. Mixtral runs under a pipeline too (`routes_per_token`): the library's router picks each
token's experts alone and computes every routed token, and the loss has no auxiliary term, so a
micro-batch routes as the whole batch does — what makes pp dense-only for the parallab family's
MoE (capacity and the load-balancing loss are the batch's) does not hold here.

DeepSeek-V2's router is per token in the same sense (no capacity, no auxiliary loss in the
library's model: its `aux_loss_alpha` is a training recipe the library does not implement), so it
runs under a pipeline too. Tensor parallelism splits its latent attention by heads and keeps the
latents whole (`hf_archs.deepseek_v2`): the rotary key every head shares has its gradient all-reduced where
kv_a_proj_with_mqa emits it (`rotary_key`), since each rank's heads read it.

Parameter and FLOP counts are the decoder's closed form (`base.decoder_param_counts`,
`base.attention_params` for latent attention and heads of their own width): the library's tensors
are the parallab family's under other names (Mixtral's fused gate_up_proj is w1 and w3 stacked,
Phi-3's qkv_proj q, k and v), so the formulas are shared, not restated; an architecture says only
how many RMSNorms a block has (Gemma 2's four).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from parallab.core.families.base import ModelFamily, Param, ParamCounts, TPStyle, decoder_param_counts
from parallab.core.families.hf_archs import arch_of
from parallab.core.problems import SpecProblem

if TYPE_CHECKING:
    from parallab.core.layout import Layout
    from parallab.core.model import ModelConfig

UNSUPPORTED_DIMS: dict[str, str] = {"cp": "context parallelism"}
"""Dimensions the rank side does not apply to this family yet (refused at resolution): ring
attention swaps the parallab attention's `attn_fn`."""


class HFFamily(ModelFamily):
    name = "hf"
    blocks = "model.layers"
    first_stage = ("model.embed_tokens",)
    last_stage = ("model.norm", "lm_head")
    attention = "self_attn"
    routes_per_token = True

    def architecture(self, cfg: ModelConfig) -> str:
        """The `transformers` class this shape is built as."""
        return arch_of(cfg).hf_class

    def hf_config(self, cfg: ModelConfig) -> dict[str, Any]:
        """The keyword arguments of the library's config class (`architecture`'s) for this shape."""
        return arch_of(cfg).hf_config(cfg)

    def root_params(self, cfg: ModelConfig) -> list[Param]:
        v, h = cfg.vocab_size, cfg.hidden_size
        out = [Param("model.embed_tokens", "weight", (v, h)), Param("model.norm", "weight", (h,))]
        return out if cfg.tie_embeddings else [*out, Param("lm_head", "weight", (v, h))]

    def block_params(self, cfg: ModelConfig, layer: int) -> list[Param]:
        return arch_of(cfg).block_params(cfg, layer)

    def root_plan(self, cfg: ModelConfig) -> dict[str, TPStyle]:
        return {"model.embed_tokens": "embedding", "model.norm": "norm", "lm_head": "head"}

    def block_plan(self, cfg: ModelConfig, layer: int) -> dict[str, TPStyle]:
        return arch_of(cfg).block_plan(cfg, layer)

    def param_counts(self, cfg: ModelConfig) -> ParamCounts:
        """The decoder's closed form with the architecture's RMSNorms per block (Gemma 2's four)."""
        return decoder_param_counts(cfg, block_norms=len(arch_of(cfg).norms))

    def layout_problems(self, cfg: ModelConfig, layout: Layout) -> list[SpecProblem]:
        runs = "ddp, fsdp, tp, pp, moe (ep) or a layout of them"
        arch = arch_of(cfg)
        out = [
            SpecProblem(("strategy", "name"), f"the hf family does not run {what} yet ({dim}={getattr(layout, dim)}); it runs {runs}")
            for dim, what in UNSUPPORTED_DIMS.items()
            if getattr(layout, dim) > 1
        ]
        out += [
            SpecProblem(("strategy", "name"), f"{arch.title} does not run {what} ({dim}={getattr(layout, dim)})")
            for dim, what in arch.unsupported_dims.items()
            if getattr(layout, dim) > 1
        ]
        if layout.ep > 1 and layout.aux_loss_coef:
            out.append(
                SpecProblem(
                    ("strategy", "options", "aux_loss_coef"),
                    f"the hf family's MoE has no load-balancing loss (the library's model adds none; the run's loss is "
                    f"cross-entropy only): aux_loss_coef {layout.aux_loss_coef} would not be applied — set it to 0",
                )
            )
        return out


FAMILY = HFFamily()
