"""Phi-3 (`model_type` phi3): Llama's decoder with q, k and v fused into one qkv_proj (heads·d +
2·kv_heads·d rows, in that order) and the MLP's gate and up fused into gate_up_proj (2f rows, gate
first) — the same parameters as Llama's, under other names and two tensors fewer per block.

Its sliding window (Phi-3-mini-4k's 2,047) bounds `seq_len` as Mistral's does (the family builds
full causal attention); dropout must be off; `original_max_position_embeddings` is read by the
long-context rotary scaling only, which is ignored as every `rope_scaling` is. Tensor parallelism
is refused: a column split of a fused projection would hand a rank a mix of q, k and v rows (the
library's own plan gathers them whole, which is not the Megatron split the prediction counts).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from parallab.core.families.base import Param, TPStyle
from parallab.core.families.hf_archs.base import HFArch, Keys, equals_or_null, is_false, is_zero

if TYPE_CHECKING:
    from parallab.core.model import ModelConfig


class Phi3(HFArch):
    model_type = "phi3"
    title = "Phi-3"
    hf_class = "Phi3ForCausalLM"
    admits = frozenset()
    unsupported_dims = {"tp": "tensor parallelism (Phi-3's fused qkv_proj and gate_up_proj)"}
    keys = Keys(
        max_positions_default=4096,
        window_key="sliding_window",
        norm_eps_default=1e-5,
        must_hold={
            "attention_bias": (is_false, "false"),
            "resid_pdrop": (is_zero, "0 (the family trains without dropout)"),
            "embd_pdrop": (is_zero, "0 (the family trains without dropout)"),
            "partial_rotary_factor": (equals_or_null(1.0), "1.0 (rotary positions over the whole head)"),
        },
        ignored=frozenset({"original_max_position_embeddings"}),
    )

    def own_config(self, cfg: ModelConfig, common: dict[str, Any]) -> dict[str, Any]:
        """No window, no dropout; the head width is the library's hidden_size / num_heads."""
        out = {k: v for k, v in common.items() if k != "head_dim"}
        return {**out, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "sliding_window": None}

    def attention_params(self, cfg: ModelConfig) -> list[Param]:
        h, q = cfg.hidden_size, cfg.num_heads * cfg.head_width
        return [Param("self_attn.o_proj", "weight", (h, q)), Param("self_attn.qkv_proj", "weight", (q + 2 * cfg.kv_dim, h))]

    def mlp_params(self, cfg: ModelConfig, layer: int) -> list[Param]:
        h, f = cfg.hidden_size, cfg.ffn_hidden_size
        return [Param("mlp.gate_up_proj", "weight", (2 * f, h)), Param("mlp.down_proj", "weight", (h, f))]

    def attention_plan(self, cfg: ModelConfig) -> dict[str, TPStyle]:
        return {}

    def mlp_plan(self, cfg: ModelConfig, layer: int) -> dict[str, TPStyle]:
        return {}


ARCH = Phi3()
