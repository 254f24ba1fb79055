"""How the rank side builds and runs one Hugging Face architecture, where the shared build does
not do for it: the library's attention implementation, the mask its blocks need, and what its
`…ForCausalLM.forward` does to the logits after the head (the wrapper, `workers.harness.hf`,
runs the modules itself, so what the library's forwards add around them is the builder's)."""

from __future__ import annotations

from typing import Any

import torch


class Builder:
    """The default: SDPA with its causal flag standing for the mask, the head's logits as they are."""

    attn_implementation = "sdpa"

    def mask(self, h: torch.Tensor) -> torch.Tensor | None:
        """The attention mask every block gets for a (B, T, ·) residual stream (None: SDPA's causal flag)."""
        return None

    def logits(self, config: Any, logits: torch.Tensor) -> torch.Tensor:
        """What the library's causal LM does to the head's output before its loss (`config`: the library's)."""
        return logits


def causal_mask(h: torch.Tensor) -> torch.Tensor:
    """The library's additive causal mask (1, 1, T, T) for an eager attention: 0 on and below the
    diagonal, the dtype's lowest value above it (what `create_causal_mask` makes without padding)."""
    t = h.shape[1]
    lowest = torch.finfo(h.dtype).min
    return torch.full((t, t), lowest, dtype=h.dtype, device=h.device).triu(1)[None, None]
