"""Qwen2 (`model_type` qwen2): Llama with biases on q, k and v only (Llama's own
`attention_bias` would bias o_proj too), which is what the `attention_bias` field means in every
family; full attention in every layer (its sliding window is refused)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from parallab.core.families.hf_archs.base import HFArch, Keys, is_false

if TYPE_CHECKING:
    from parallab.core.model import ModelConfig


class Qwen2(HFArch):
    model_type = "qwen2"
    title = "Qwen2"
    hf_class = "Qwen2ForCausalLM"
    admits = frozenset({"head_dim", "attention_bias"})
    requires = frozenset({"attention_bias"})
    keys = Keys(
        attention_bias=True,
        kv_heads_default=32,
        max_positions_default=32768,
        must_hold={
            "use_sliding_window": (is_false, "false (the family builds full attention in every layer)"),
            "use_mrope": (is_false, "false (multimodal rotary positions are Qwen2-VL's)"),
        },
        ignored=frozenset({"sliding_window", "max_window_layers"}),  # used only with use_sliding_window
    )

    def own_config(self, cfg: ModelConfig, common: dict[str, Any]) -> dict[str, Any]:
        return common  # Qwen2's config has no bias keys: q, k and v always have one


ARCH = Qwen2()
