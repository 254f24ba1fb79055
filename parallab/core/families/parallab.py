"""The `parallab` family: the decoder `workers.harness.model` builds from a `ModelConfig`.

Per block: RMSNorm, attention (q, k, v with optional biases — k and v kv_heads × head_dim wide
under grouped-query attention — and o), RMSNorm, then an MLP (SwiGLU: w1, w3 h→f and w2 f→h;
GELU: w1 and w2) or, past the first `first_dense_layers` blocks of an MoE model, an MoE MLP (router
h→E, E experts stacked (E, h, f)/(E, f, h), and the shared experts as one MLP of width
num_shared_experts·f). Around the blocks: the token embedding, a final RMSNorm and the LM head,
which may be the embedding's own matrix (tied).

Its TP plan is Megatron's (Shoeybi et al. 2019): q/k/v and w1/w3 column-parallel, o and w2
row-parallel, each attention and MLP input prepared once; the embedding vocab-parallel, the head
column-parallel with gathered logits. MoE blocks get the attention part only (tensor parallelism
runs dense models). Its parameter and FLOP counts are the decoder's closed form
(`base.decoder_param_counts`, `ModelFamily.flops_per_token`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from parallab.core.families.base import ModelFamily, Param, TPStyle

if TYPE_CHECKING:
    from parallab.core.model import ModelConfig


def _mlp_params(cfg: ModelConfig, module: str, width: int) -> list[Param]:
    h = cfg.hidden_size
    out = [Param(f"{module}.w1", "weight", (width, h))]
    if cfg.mlp == "swiglu":
        out.append(Param(f"{module}.w3", "weight", (width, h)))
    return out + [Param(f"{module}.w2", "weight", (h, width))]


def _mlp_plan(cfg: ModelConfig) -> dict[str, TPStyle]:
    plan: dict[str, TPStyle] = {"feed_forward": "input", "feed_forward.w1": "colwise", "feed_forward.w2": "rowwise"}
    if cfg.mlp == "swiglu":
        plan["feed_forward.w3"] = "colwise"
    return plan


class ParallabFamily(ModelFamily):
    name = "parallab"
    blocks = "layers"
    first_stage = ("tok_embeddings",)
    last_stage = ("norm", "output")
    attention = "attention"

    def root_params(self, cfg: ModelConfig) -> list[Param]:
        v, h = cfg.vocab_size, cfg.hidden_size
        out = [Param("tok_embeddings", "weight", (v, h)), Param("norm", "weight", (h,))]
        return out if cfg.tie_embeddings else [*out, Param("output", "weight", (v, h))]

    def block_params(self, cfg: ModelConfig, layer: int) -> list[Param]:
        h, kv = cfg.hidden_size, cfg.kv_dim
        out = [Param("attention_norm", "weight", (h,)), Param("ffn_norm", "weight", (h,))]
        for name, width in (("wq", h), ("wk", kv), ("wv", kv)):
            out.append(Param(f"attention.{name}", "weight", (width, h)))
            if cfg.attention_bias:
                out.append(Param(f"attention.{name}", "bias", (width,)))
        out.append(Param("attention.wo", "weight", (h, h)))
        if not cfg.block_is_moe(layer):
            return out + _mlp_params(cfg, "feed_forward", cfg.ffn_hidden_size)
        e, f = cfg.num_experts, cfg.ffn_hidden_size
        out.append(Param("feed_forward.router", "weight", (e, h)))
        experts = [("w1", (e, h, f)), ("w3", (e, h, f)), ("w2", (e, f, h))]
        out += [Param("feed_forward", w, s, expert=True) for w, s in experts if cfg.mlp == "swiglu" or w != "w3"]
        if cfg.num_shared_experts:
            out += _mlp_params(cfg, "feed_forward.shared", cfg.num_shared_experts * f)
        return out

    def root_plan(self, cfg: ModelConfig) -> dict[str, TPStyle]:
        return {"tok_embeddings": "embedding", "norm": "norm", "output": "head"}

    def block_plan(self, cfg: ModelConfig, layer: int) -> dict[str, TPStyle]:
        plan: dict[str, TPStyle] = {
            "attention_norm": "norm",
            "attention": "input",
            "attention.wq": "colwise",
            "attention.wk": "colwise",
            "attention.wv": "colwise",
            "attention.wo": "rowwise",
            "ffn_norm": "norm",
        }
        return plan if cfg.block_is_moe(layer) else {**plan, **_mlp_plan(cfg)}


FAMILY = ParallabFamily()
