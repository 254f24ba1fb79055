"""The `hf` family: a Hugging Face `transformers` causal LM of a `ModelConfig`'s shape, built
offline from its config with random weights (the rank side, `workers.harness.hf`, builds it).

Which model: `LlamaForCausalLM`, or `Qwen2ForCausalLM` when `attention_bias` is set — Qwen2 is
Llama with biases on q, k and v only (Llama's own `attention_bias` would bias o_proj too), which
is what the field means in every family. Dense SwiGLU models only (the shape rules refuse a GELU
MLP or experts for this family).

Module paths are the library's own, so parameter names are those of its checkpoints: the root
holds `model` (embed_tokens, layers, norm) and `lm_head`; the blocks are `model.layers`, kept as
a container keyed "0".."L-1" (the library's list becomes a dict of the same names). Per block:
self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj, input_layernorm, post_attention_layernorm.

The TP plan is the library's `base_model_tp_plan` (q/k/v and gate/up column-parallel, o and down
row-parallel) plus what makes it Megatron's, as the parallab family's: each attention and MLP
input prepared once (the attention's by keyword, `input_kwarg`: the library's block calls it with
`hidden_states=`), so a block all-reduces its input gradient once per attention and once per MLP
rather than once per column-parallel linear; the embedding vocab-parallel, the head
column-parallel with gathered logits; the norms on a sequence shard under sequence parallelism.
The communication is then the parallab family's, which the prediction counts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from parallab.core.families.base import ModelFamily, Param, ParamCounts, TPStyle
from parallab.core.problems import SpecProblem

if TYPE_CHECKING:
    from parallab.core.layout import Layout
    from parallab.core.model import ModelConfig

UNSUPPORTED_DIMS: dict[str, str] = {"cp": "context parallelism", "pp": "pipeline parallelism", "ep": "expert parallelism"}
"""Dimensions the rank side does not apply to this family yet (refused at resolution): ring
attention swaps the parallab attention's `attn_fn`, the pipeline's stages and expert parallelism's
experts are the parallab modules'."""


class HFFamily(ModelFamily):
    name = "hf"
    blocks = "model.layers"
    first_stage = ("model.embed_tokens",)
    last_stage = ("model.norm", "lm_head")
    attention = "self_attn"

    def architecture(self, cfg: ModelConfig) -> str:
        """The `transformers` class this shape is built as."""
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
        if not cfg.attention_bias:
            out.update(attention_bias=False, mlp_bias=False)
        return out

    def root_params(self, cfg: ModelConfig) -> list[Param]:
        v, h = cfg.vocab_size, cfg.hidden_size
        out = [Param("model.embed_tokens", "weight", (v, h)), Param("model.norm", "weight", (h,))]
        return out if cfg.tie_embeddings else [*out, Param("lm_head", "weight", (v, h))]

    def block_params(self, cfg: ModelConfig, layer: int) -> list[Param]:
        h, kv, f = cfg.hidden_size, cfg.kv_dim, cfg.ffn_hidden_size
        out: list[Param] = []
        for name, width in (("q_proj", h), ("k_proj", kv), ("v_proj", kv)):
            out.append(Param(f"self_attn.{name}", "weight", (width, h)))
            if cfg.attention_bias:
                out.append(Param(f"self_attn.{name}", "bias", (width,)))
        out.append(Param("self_attn.o_proj", "weight", (h, h)))
        out += [Param("mlp.gate_proj", "weight", (f, h)), Param("mlp.up_proj", "weight", (f, h)), Param("mlp.down_proj", "weight", (h, f))]
        return out + [Param("input_layernorm", "weight", (h,)), Param("post_attention_layernorm", "weight", (h,))]

    def root_plan(self, cfg: ModelConfig) -> dict[str, TPStyle]:
        return {"model.embed_tokens": "embedding", "model.norm": "norm", "lm_head": "head"}

    def block_plan(self, cfg: ModelConfig, layer: int) -> dict[str, TPStyle]:
        return {
            "input_layernorm": "norm",
            "self_attn": "input_kwarg",
            "self_attn.q_proj": "colwise",
            "self_attn.k_proj": "colwise",
            "self_attn.v_proj": "colwise",
            "self_attn.o_proj": "rowwise",
            "post_attention_layernorm": "norm",
            "mlp": "input",
            "mlp.gate_proj": "colwise",
            "mlp.up_proj": "colwise",
            "mlp.down_proj": "rowwise",
        }

    def param_counts(self, cfg: ModelConfig) -> ParamCounts:
        """Closed form of a dense block: attention 2h² + 2h·kv (+ h + 2kv of q/k/v biases), the
        SwiGLU MLP 3·h·f, two norms 2h; around L blocks the embedding V·h, the final norm h and an
        untied head V·h."""
        h, f, v, kv = cfg.hidden_size, cfg.ffn_hidden_size, cfg.vocab_size, cfg.kv_dim
        block = 2 * h * h + 2 * h * kv + ((h + 2 * kv) if cfg.attention_bias else 0) + 3 * h * f + 2 * h
        blocks = cfg.num_layers * block
        return ParamCounts(
            embedding=v * h,
            non_embedding=blocks + h + (0 if cfg.tie_embeddings else v * h),
            active_non_embedding=blocks + h + v * h,
            per_layer=block,
        )

    def flops_per_token(self, cfg: ModelConfig) -> int:
        """6·N + 12·L·H·Q·T (PaLM appendix B), as for the parallab family (the same dense maths)."""
        n = self.param_counts(cfg).active_non_embedding
        return 6 * n + 12 * cfg.num_layers * cfg.num_heads * cfg.head_dim * cfg.seq_len

    def layout_problems(self, cfg: ModelConfig, layout: Layout) -> list[SpecProblem]:
        out = [
            SpecProblem(
                ("strategy", "name"),
                f"the hf family does not run {what} yet ({dim}={getattr(layout, dim)}); use ddp, fsdp, tp or a layout of them",
            )
            for dim, what in UNSUPPORTED_DIMS.items()
            if getattr(layout, dim) > 1
        ]
        return out


FAMILY = HFFamily()
