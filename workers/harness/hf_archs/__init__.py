"""The rank side's builders, keyed by the same `model_type` as the core's architectures
(`parallab.core.families.hf_archs`): each architecture that runs otherwise than the shared build
has its module here; the others build with the default `Builder` (SDPA, logits as the head gives
them). A test holds the two registries to the same keys."""

from __future__ import annotations

from workers.harness.hf_archs import gemma2
from workers.harness.hf_archs.base import Builder

DEFAULT = Builder()
BUILDERS: dict[str, Builder] = {
    "llama": DEFAULT,
    "mistral": DEFAULT,
    "qwen2": DEFAULT,
    "mixtral": DEFAULT,
    "deepseek_v2": DEFAULT,
    "gemma2": gemma2.BUILDER,
    "phi3": DEFAULT,
}
"""Every architecture's builder, by model_type."""
