"""The `hf` family: a Hugging Face `transformers` causal LM of a `ModelConfig`'s shape, built
offline from its config with random weights (the rank side, `workers.harness.hf`, builds it).

Which model: `LlamaForCausalLM`; `Qwen2ForCausalLM` when `attention_bias` is set — Qwen2 is
Llama with biases on q, k and v only (Llama's own `attention_bias` would bias o_proj too), which
is what the field means in every family; `MixtralForCausalLM` when `num_experts` is set — Llama's
attention with every MLP an MoE block (a top-k softmax router renormalised over the chosen
experts, no shared experts, no dense first layer, no capacity: every routed token is computed).
SwiGLU only (the shape rules refuse a GELU MLP, and for Mixtral shared experts, dense first
layers and q/k/v biases). `DeepseekV2ForCausalLM` when `kv_lora_rank` is set: multi-head latent
attention (DeepSeek-V2 §2.1) — the query from q_proj, or compressed (q_a_proj, q_a_layernorm,
q_b_proj) when `q_lora_rank` is set; keys and values from one latent, kv_a_proj_with_mqa (h →
kv_lora_rank + qk_rope_head_dim: the latent and the rotary key every head shares),
kv_a_layernorm and kv_b_proj (latent → heads·(qk_nope_head_dim + v_head_dim)); o_proj from
heads·v_head_dim — and DeepSeekMoE blocks after `first_dense_layers` dense ones (the first
`first_k_dense_replace` blocks are Llama's MLP, `ffn_hidden_size` wide): the router (mlp.gate, E×h:
a softmax, greedy top-k per token, weights neither renormalised nor scaled: DeepSeek-V2-Lite's),
the routed experts as Mixtral's fused pair `moe_ffn_hidden_size` wide, and the shared experts as
one SwiGLU MLP (mlp.shared_experts, `num_shared_experts`·moe_ffn_hidden_size wide) every token
passes through. A dense shape with `kv_lora_rank` is DeepSeek-V2 with every block dense.

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
latents whole (`_mla_plan`): the rotary key every head shares has its gradient all-reduced where
kv_a_proj_with_mqa emits it (`rotary_key`), since each rank's heads read it.

Parameter and FLOP counts are the decoder's closed form (`base.decoder_param_counts`,
`base.attention_params` for latent attention): the library's tensors are the parallab family's
under other names (Mixtral's fused gate_up_proj is w1 and w3 stacked), so the formulas are
shared, not restated.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from parallab.core.families.base import ModelFamily, Param, TPStyle
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
        if cfg.is_mla:
            return "DeepseekV2ForCausalLM"
        if cfg.is_moe:
            return "MixtralForCausalLM"
        return "Qwen2ForCausalLM" if cfg.attention_bias else "LlamaForCausalLM"

    def hf_config(self, cfg: ModelConfig) -> dict[str, Any]:
        """The keyword arguments of the library's config class (`architecture`'s) for this shape."""
        out: dict[str, Any] = {
            "vocab_size": cfg.vocab_size,
            "hidden_size": cfg.hidden_size,
            "intermediate_size": cfg.ffn_hidden_size,
            "num_hidden_layers": cfg.num_layers,
            "num_attention_heads": cfg.num_heads,
            "num_key_value_heads": cfg.kv_heads,
            "head_dim": cfg.head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": cfg.seq_len,
            "rms_norm_eps": cfg.norm_eps,
            "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
            "tie_word_embeddings": cfg.tie_embeddings,
            "attention_dropout": 0.0,
            "initializer_range": 0.02,
            "use_cache": False,
        }
        if cfg.is_mla:
            return self._deepseek_config(cfg, out)
        if cfg.is_moe:  # Mixtral: routing as trained, no window, no jitter, no router loss in the output
            out.update(
                num_local_experts=cfg.num_experts,
                num_experts_per_tok=cfg.top_k,
                sliding_window=None,
                router_jitter_noise=0.0,
                output_router_logits=False,
            )
        elif not cfg.attention_bias:
            out.update(attention_bias=False, mlp_bias=False)
        return out

    @staticmethod
    def _deepseek_config(cfg: ModelConfig, common: dict[str, Any]) -> dict[str, Any]:
        """DeepSeek-V2's config: Llama's keys less head_dim (the library sets it to the rotary
        width), the latent attention's widths (q_lora_rank None: one q_proj), and the MoE — greedy
        top-k over a softmax, unscaled and unnormalised weights (DeepSeek-V2-Lite's router), experts
        `moe_intermediate_size` wide, the first `first_k_dense_replace` blocks dense (all of them
        in a dense model)."""
        out = {k: v for k, v in common.items() if k != "head_dim"}
        out.update(
            attention_bias=False,
            mlp_bias=False,
            q_lora_rank=cfg.q_lora_rank or None,
            kv_lora_rank=cfg.kv_lora_rank,
            qk_nope_head_dim=cfg.qk_nope_head_dim,
            qk_rope_head_dim=cfg.qk_rope_head_dim,
            v_head_dim=cfg.v_head_dim,
            n_routed_experts=cfg.num_experts,
            num_experts_per_tok=cfg.top_k,
            n_shared_experts=cfg.num_shared_experts,
            moe_intermediate_size=cfg.expert_ffn,
            first_k_dense_replace=cfg.first_dense_layers if cfg.is_moe else cfg.num_layers,
            topk_method="greedy",
            n_group=None,
            topk_group=None,
            routed_scaling_factor=1.0,
            norm_topk_prob=False,
            output_router_logits=False,
        )
        return out

    def root_params(self, cfg: ModelConfig) -> list[Param]:
        v, h = cfg.vocab_size, cfg.hidden_size
        out = [Param("model.embed_tokens", "weight", (v, h)), Param("model.norm", "weight", (h,))]
        return out if cfg.tie_embeddings else [*out, Param("lm_head", "weight", (v, h))]

    def block_params(self, cfg: ModelConfig, layer: int) -> list[Param]:
        h, kv, f = cfg.hidden_size, cfg.kv_dim, cfg.ffn_hidden_size
        out: list[Param] = []
        if cfg.is_mla:
            out += _mla_params(cfg)
        else:
            for name, width in (("q_proj", h), ("k_proj", kv), ("v_proj", kv)):
                out.append(Param(f"self_attn.{name}", "weight", (width, h)))
                if cfg.attention_bias:
                    out.append(Param(f"self_attn.{name}", "bias", (width,)))
            out.append(Param("self_attn.o_proj", "weight", (h, h)))
        if cfg.block_is_moe(layer):
            e, fe = cfg.num_experts, cfg.expert_ffn
            out += [
                Param("mlp.gate", "weight", (e, h)),
                Param("mlp.experts", "gate_up_proj", (e, 2 * fe, h), expert=True),
                Param("mlp.experts", "down_proj", (e, h, fe), expert=True),
            ]
            if cfg.is_mla:  # DeepSeek-V2: the shared experts are one SwiGLU MLP S·f_e wide
                out += _swiglu_params("mlp.shared_experts", h, cfg.num_shared_experts * fe)
        else:
            out += _swiglu_params("mlp", h, f)
        return out + [Param("input_layernorm", "weight", (h,)), Param("post_attention_layernorm", "weight", (h,))]

    def root_plan(self, cfg: ModelConfig) -> dict[str, TPStyle]:
        return {"model.embed_tokens": "embedding", "model.norm": "norm", "lm_head": "head"}

    def block_plan(self, cfg: ModelConfig, layer: int) -> dict[str, TPStyle]:
        plan: dict[str, TPStyle] = {"input_layernorm": "norm", "post_attention_layernorm": "norm"}
        if cfg.is_mla:
            plan.update(_mla_plan(cfg))
        else:
            plan.update(
                {
                    "self_attn": "input_kwarg",
                    "self_attn.q_proj": "colwise",
                    "self_attn.k_proj": "colwise",
                    "self_attn.v_proj": "colwise",
                    "self_attn.o_proj": "rowwise",
                }
            )
        if cfg.block_is_moe(layer):
            return plan
        return {**plan, "mlp": "input", "mlp.gate_proj": "colwise", "mlp.up_proj": "colwise", "mlp.down_proj": "rowwise"}

    def layout_problems(self, cfg: ModelConfig, layout: Layout) -> list[SpecProblem]:
        runs = "ddp, fsdp, tp, pp, moe (ep) or a layout of them"
        out = [
            SpecProblem(("strategy", "name"), f"the hf family does not run {what} yet ({dim}={getattr(layout, dim)}); it runs {runs}")
            for dim, what in UNSUPPORTED_DIMS.items()
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


def _mla_plan(cfg: ModelConfig) -> dict[str, TPStyle]:
    """Multi-head latent attention split by heads: the query projection (q_proj, or q_b_proj after
    the query latent) and kv_b_proj column-parallel, o_proj row-parallel; the latent projections
    and their norms whole on every rank. No input preparation: the block input feeds the query
    and the whole kv_a_proj_with_mqa, whose gradient arrives whole (its latent's through
    kv_b_proj's own all-reduce, its rotary key's through `rotary_key`), so a prepared input would
    add it tp times. Each column-parallel projection all-reduces its own input gradient
    (`dims.tp.latent_input_bytes`)."""
    query = "self_attn.q_b_proj" if cfg.q_lora_rank else "self_attn.q_proj"
    return {query: "colwise", "self_attn.kv_a_proj_with_mqa": "rotary_key", "self_attn.kv_b_proj": "colwise", "self_attn.o_proj": "rowwise"}


def _swiglu_params(module: str, h: int, f: int) -> list[Param]:
    """A library SwiGLU MLP's three matrices (gate and up h → f, down f → h) under `module`."""
    return [
        Param(f"{module}.gate_proj", "weight", (f, h)),
        Param(f"{module}.up_proj", "weight", (f, h)),
        Param(f"{module}.down_proj", "weight", (h, f)),
    ]


def _mla_params(cfg: ModelConfig) -> list[Param]:
    """DeepSeek-V2's attention tensors (`DeepseekV2Attention`, in its order): the query — q_proj,
    or q_a_proj, q_a_layernorm and q_b_proj when it is compressed —, kv_a_proj_with_mqa (the
    latent and the shared rotary key), kv_a_layernorm, kv_b_proj (each head's key without
    rotary part and its value) and o_proj."""
    h, a, rank, q_rank = cfg.hidden_size, cfg.num_heads, cfg.kv_lora_rank, cfg.q_lora_rank
    query = a * cfg.qk_head_dim
    if q_rank:
        q = [
            Param("self_attn.q_a_proj", "weight", (q_rank, h)),
            Param("self_attn.q_a_layernorm", "weight", (q_rank,)),
            Param("self_attn.q_b_proj", "weight", (query, q_rank)),
        ]
    else:
        q = [Param("self_attn.q_proj", "weight", (query, h))]
    return [
        *q,
        Param("self_attn.kv_a_proj_with_mqa", "weight", (rank + cfg.qk_rope_head_dim, h)),
        Param("self_attn.kv_a_layernorm", "weight", (rank,)),
        Param("self_attn.kv_b_proj", "weight", (a * (cfg.qk_nope_head_dim + cfg.v_head_dim), rank)),
        Param("self_attn.o_proj", "weight", (h, a * cfg.v_head_dim)),
    ]


FAMILY = HFFamily()
