"""Llama (`model_type` llama): separate q, k, v, o projections without biases, a SwiGLU MLP,
two RMSNorms per block — the base every other architecture here departs from (`base.HFArch`)."""

from __future__ import annotations

from parallab.core.families.hf_archs.base import HFArch, Keys, is_false, is_one_or_null


class Llama(HFArch):
    model_type = "llama"
    title = "Llama"
    hf_class = "LlamaForCausalLM"
    keys = Keys(
        must_hold={
            "attention_bias": (is_false, "false (Llama's bias is on o_proj too: not a shape the hf family builds)"),
            "mlp_bias": (is_false, "false"),
            "pretraining_tp": (is_one_or_null, "1"),
        },
    )


ARCH = Llama()
