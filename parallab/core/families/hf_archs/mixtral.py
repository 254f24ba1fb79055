"""Mixtral (`model_type` mixtral): Mistral's attention with every MLP an MoE block — the library's
top-k softmax router renormalised over the chosen experts, no shared experts, no dense first
layer, no capacity (every routed token is computed). `num_local_experts` → num_experts,
`num_experts_per_tok` → top_k. Its router settings are held to what the rank side computes:
`router_jitter_noise` 0 (noise multiplies the router's input in training) and
`output_router_logits` false (true adds the load-balancing loss to the library's loss, changing
the gradients); `router_aux_loss_coef` is then unused and ignored. An MoE block's TP plan is the
attention part only, as the library's own: its router and experts stay whole on every tp rank."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from parallab.core.families.base import Param, TPStyle
from parallab.core.families.hf_archs.base import HFArch, Keys, expert_params, is_false_or_null, is_zero

if TYPE_CHECKING:
    from parallab.core.model import ModelConfig


class Mixtral(HFArch):
    model_type = "mixtral"
    title = "Mixtral"
    hf_class = "MixtralForCausalLM"
    admits = frozenset({"head_dim", "num_experts"})
    requires = frozenset({"num_experts"})
    keys = Keys(
        kv_heads_default=8,
        max_positions_default=4096 * 32,
        window_key="sliding_window",
        reads={"num_local_experts": "num_experts", "num_experts_per_tok": "top_k"},
        read_defaults={"num_local_experts": 8, "num_experts_per_tok": 2},
        norm_eps_default=1e-5,
        rope_theta_default=1e6,
        must_hold={
            "router_jitter_noise": (is_zero, "0 (jitter multiplies the router's input by noise in training)"),
            "output_router_logits": (
                is_false_or_null,
                "false (true adds the load-balancing loss to the library's loss; the run's loss is cross-entropy only)",
            ),
        },
        ignored=frozenset({"router_aux_loss_coef"}),  # the load-balancing loss's weight: unused without output_router_logits
    )

    def own_config(self, cfg: ModelConfig, common: dict[str, Any]) -> dict[str, Any]:
        """Routing as trained: no window, no jitter, no router loss in the output."""
        return {
            **common,
            "num_local_experts": cfg.num_experts,
            "num_experts_per_tok": cfg.top_k,
            "sliding_window": None,
            "router_jitter_noise": 0.0,
            "output_router_logits": False,
        }

    def mlp_params(self, cfg: ModelConfig, layer: int) -> list[Param]:
        return expert_params(cfg)

    def mlp_plan(self, cfg: ModelConfig, layer: int) -> dict[str, TPStyle]:
        return {}


ARCH = Mixtral()
