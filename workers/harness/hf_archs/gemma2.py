"""Gemma 2 on the rank side: the library's eager attention (its SDPA path has no soft-cap, and
`Gemma2PreTrainedModel` refuses SDPA), so the blocks get an explicit causal mask, and the logits
soft-capped as `Gemma2ForCausalLM.forward` caps them (tanh(logits / cap) · cap). The embedding's
√hidden_size scale is the library's embedding module's own, so nothing is added for it."""

from __future__ import annotations

from typing import Any

import torch

from workers.harness.hf_archs.base import Builder, causal_mask


class Gemma2Builder(Builder):
    attn_implementation = "eager"

    def mask(self, h: torch.Tensor) -> torch.Tensor | None:
        return causal_mask(h)

    def logits(self, config: Any, logits: torch.Tensor) -> torch.Tensor:
        cap = config.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap


BUILDER = Gemma2Builder()
