"""DeepSeek-V2 (`model_type` deepseek_v2): multi-head latent attention (DeepSeek-V2 §2.1) and
DeepSeekMoE blocks after `first_dense_layers` dense ones.

The attention: the query from q_proj, or compressed (q_a_proj, q_a_layernorm, q_b_proj) when
`q_lora_rank` is set; keys and values from one latent, kv_a_proj_with_mqa (h → kv_lora_rank +
qk_rope_head_dim: the latent and the rotary key every head shares), kv_a_layernorm and kv_b_proj
(latent → heads·(qk_nope_head_dim + v_head_dim)); o_proj from heads·v_head_dim. The MoE: the
router (mlp.gate, E×h: a softmax, greedy top-k per token, weights neither renormalised nor scaled:
DeepSeek-V2-Lite's), the routed experts as Mixtral's fused pair `moe_ffn_hidden_size` wide, and
the shared experts as one SwiGLU MLP (mlp.shared_experts, `num_shared_experts`·moe_ffn_hidden_size
wide) every token passes through; the first `first_k_dense_replace` blocks are Llama's MLP. A dense
shape with `kv_lora_rank` is DeepSeek-V2 with every block dense.

Its config's router is held to the one the library builds (`topk_method` greedy, `scoring_func`
softmax, `routed_scaling_factor` 1, `norm_topk_prob` false); the groups greedy routing does not
use and the auxiliary losses' weights the library does not apply are ignored. Tensor parallelism
splits the latent attention by heads and keeps the latents whole (`attention_plan`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from parallab.core.families.base import Param, TPStyle
from parallab.core.families.hf_archs.base import (
    NO_BIAS,
    HFArch,
    Keys,
    expert_params,
    is_false,
    is_false_or_null,
    is_one_or_null,
    swiglu_params,
)

if TYPE_CHECKING:
    from parallab.core.model import ModelConfig


class DeepseekV2(HFArch):
    model_type = "deepseek_v2"
    title = "DeepSeek-V2"
    hf_class = "DeepseekV2ForCausalLM"
    admits = frozenset({"num_experts", "num_shared_experts", "first_dense_layers", "moe_ffn_hidden_size", "kv_lora_rank"})
    requires = frozenset({"kv_lora_rank"})
    keys = Keys(
        reads={
            "kv_lora_rank": "kv_lora_rank",
            "q_lora_rank": "q_lora_rank",
            "qk_nope_head_dim": "qk_nope_head_dim",
            "qk_rope_head_dim": "qk_rope_head_dim",
            "v_head_dim": "v_head_dim",
            "n_routed_experts": "num_experts",
            "num_experts_per_tok": "top_k",
            "n_shared_experts": "num_shared_experts",
            "first_k_dense_replace": "first_dense_layers",
            "moe_intermediate_size": "moe_ffn_hidden_size",
        },
        read_defaults={
            "kv_lora_rank": 512,
            "q_lora_rank": 1536,
            "qk_nope_head_dim": 128,
            "qk_rope_head_dim": 64,
            "v_head_dim": 128,
            "n_routed_experts": 64,
            "n_shared_experts": 2,
            "first_k_dense_replace": 0,
            "moe_intermediate_size": 1407,
        },
        null_reads={"q_lora_rank": 0},
        zero_reads=frozenset({"q_lora_rank", "first_k_dense_replace"}),
        required=("num_experts_per_tok",),
        must_hold={
            "attention_bias": (is_false, "false (DeepSeek-V2's bias is on q_a, kv_a and o: not a shape the hf family builds)"),
            "mlp_bias": NO_BIAS["mlp_bias"],
            "pretraining_tp": (is_one_or_null, "1"),
            "moe_layer_freq": (is_one_or_null, "1 (every block after the first_k_dense_replace dense ones is MoE)"),
            "topk_method": (
                lambda v: v in (None, "greedy"),
                '"greedy" (DeepSeek-V2-Lite\'s router; group-limited routing is not a field of the workload)',
            ),
            "scoring_func": (lambda v: v in (None, "softmax"), '"softmax" (the router DeepSeek-V2 has)'),
            "routed_scaling_factor": (
                lambda v: v in (None, 1, 1.0) and not isinstance(v, bool),
                "1.0 (the routed experts' output unscaled)",
            ),
            "norm_topk_prob": (is_false_or_null, "false (DeepSeek-V2's top-k weights are the softmax's, not renormalised)"),
            "output_router_logits": (is_false_or_null, "false (the run's loss is cross-entropy only)"),
        },
        # head_dim and qk_head_dim the library derives (the rotary width; nope + rope); the groups
        # are unused by greedy routing; the auxiliary losses' weights are unused (the library's model
        # adds none, as Mixtral's without output_router_logits); ep_size is a deployment setting
        ignored=frozenset({"head_dim", "qk_head_dim", "n_group", "topk_group", "aux_loss_alpha", "seq_aux", "ep_size"}),
    )

    def shape_problems(self, cfg: ModelConfig) -> list[tuple[str, str]]:
        """Besides the shared rules: per-head K/V from the latent (no K/V head sharing), rotary on
        an even width, a value width, shared experts in every MoE block."""
        out = super().shape_problems(cfg)
        if cfg.qk_rope_head_dim < 2 or cfg.qk_rope_head_dim % 2:
            out.append(("qk_rope_head_dim", f"must be even and at least 2 for rotary positions, not {cfg.qk_rope_head_dim}"))
        if cfg.v_head_dim < 1:
            out.append(("v_head_dim", "multi-head latent attention needs a value width of at least 1"))
        if cfg.kv_heads != cfg.num_heads:
            out.append(
                (
                    "num_kv_heads",
                    f"multi-head latent attention expands its latent into every head's key and value: num_kv_heads "
                    f"{cfg.kv_heads} must equal num_heads {cfg.num_heads}",
                )
            )
        if cfg.moe_ffn_hidden_size is not None and not cfg.num_experts:
            out.append(("moe_ffn_hidden_size", "an expert width needs experts (num_experts is 0)"))
        if cfg.num_experts and not cfg.num_shared_experts:
            out.append(("num_shared_experts", "DeepSeek-V2's MoE blocks always have shared experts: at least 1"))
        return out

    def own_config(self, cfg: ModelConfig, common: dict[str, Any]) -> dict[str, Any]:
        """Llama's keys less head_dim (the library sets it to the rotary width), the latent
        attention's widths (q_lora_rank None: one q_proj), and the MoE (the first
        `first_k_dense_replace` blocks dense: all of them in a dense model)."""
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

    def attention_params(self, cfg: ModelConfig) -> list[Param]:
        """`DeepseekV2Attention`'s tensors, in its order (see the module)."""
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

    def mlp_params(self, cfg: ModelConfig, layer: int) -> list[Param]:
        if not cfg.block_is_moe(layer):
            return super().mlp_params(cfg, layer)
        return [*expert_params(cfg), *swiglu_params("mlp.shared_experts", cfg.hidden_size, cfg.num_shared_experts * cfg.expert_ffn)]

    def attention_plan(self, cfg: ModelConfig) -> dict[str, TPStyle]:
        """Latent attention split by heads: the query projection (q_proj, or q_b_proj after the
        query latent) and kv_b_proj column-parallel, o_proj row-parallel; the latent projections
        and their norms whole on every rank. No input preparation: the block input feeds the query
        and the whole kv_a_proj_with_mqa, whose gradient arrives whole (its latent's through
        kv_b_proj's own all-reduce, its rotary key's through `rotary_key`), so a prepared input
        would add it tp times. Each column-parallel projection all-reduces its own input gradient
        (`dims.tp.latent_input_bytes`)."""
        query = "self_attn.q_b_proj" if cfg.q_lora_rank else "self_attn.q_proj"
        return {
            query: "colwise",
            "self_attn.kv_a_proj_with_mqa": "rotary_key",
            "self_attn.kv_b_proj": "colwise",
            "self_attn.o_proj": "rowwise",
        }

    def mlp_plan(self, cfg: ModelConfig, layer: int) -> dict[str, TPStyle]:
        return {} if cfg.block_is_moe(layer) else super().mlp_plan(cfg, layer)


ARCH = DeepseekV2()
