"""Mistral (`model_type` mistral): Llama module for module (same names, same tensors) with a
sliding attention window. The family builds full causal attention, so a Mistral config is
accepted only where its window covers the whole sequence (the window is then no window at all,
`Keys.window_key`), and it is then Llama's model: its workloads are Llama's (`stored_as`) and the
rank side builds it as `LlamaForCausalLM`."""

from __future__ import annotations

from parallab.core.families.hf_archs.base import HFArch, Keys


class Mistral(HFArch):
    model_type = "mistral"
    title = "Mistral"
    hf_class = "LlamaForCausalLM"
    stored_as = "llama"
    keys = Keys(kv_heads_default=8, max_positions_default=4096 * 32, sliding_window_default=4096, window_key="sliding_window")


ARCH = Mistral()
