"""The Hugging Face architectures the `hf` family builds, by `model_type` (one module each; what
each owns: `base`). A workload keeps its config's `model_type` (`ModelConfig.model_type`); the
descriptor, the config reader and the rank side's builders all look it up here.

A shape without one — a preset run with `family: hf`, a run stored before the field — is the
architecture its features imply (`implied_model_type`), and a model_type equal to the implied one
(or building the same module: Mistral's is Llama's) is stored as none, so one model is one workload.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from parallab.core.families.hf_archs import deepseek_v2, gemma2, llama, mistral, mixtral, phi3, qwen2
from parallab.core.families.hf_archs.base import HFArch

if TYPE_CHECKING:
    from parallab.core.model import ModelConfig

ARCHS: dict[str, HFArch] = {m.ARCH.model_type: m.ARCH for m in (llama, mistral, qwen2, mixtral, deepseek_v2, gemma2, phi3)}
"""Every architecture the family builds, by model_type."""
REFUSED: dict[str, str] = {
    "deepseek_v3": (
        "DeepSeek-V3 is not built: its router (sigmoid scores with a score-correction bias, group-limited top-k, "
        "renormalised and scaled weights) is another model's than DeepSeek-V2's, which the hf family builds (deepseek_v2)"
    ),
}
"""`model_type`s refused with their own reason (a neighbour of a supported one)."""
SUPPORTED: tuple[str, ...] = tuple(ARCHS)


def implied_model_type(fields: Mapping[str, Any]) -> str:
    """The architecture a shape without a model_type is built as (the one the hf family built
    before workloads kept their model_type): latent attention is DeepSeek-V2's, experts Mixtral's,
    q/k/v biases Qwen2's, anything else Llama's."""
    if fields.get("kv_lora_rank"):
        return deepseek_v2.ARCH.model_type
    if fields.get("num_experts"):
        return mixtral.ARCH.model_type
    return qwen2.ARCH.model_type if fields.get("attention_bias") else llama.ARCH.model_type


def stored_model_type(fields: Mapping[str, Any]) -> str | None:
    """The model_type a workload with these fields keeps: None where it is the implied one (an
    unknown one is kept, for the shape rules to refuse by name)."""
    given = fields.get("model_type")
    if not isinstance(given, str) or given not in ARCHS:
        return given
    built = ARCHS[given].stored_as or given
    return None if built == implied_model_type(fields) else built


def arch_of(cfg: ModelConfig) -> HFArch:
    """The architecture an hf shape is built as."""
    if cfg.model_type is not None:
        return ARCHS[cfg.model_type]
    features = {"kv_lora_rank": cfg.kv_lora_rank, "num_experts": cfg.num_experts, "attention_bias": cfg.attention_bias}
    return ARCHS[implied_model_type(features)]


def shape_problems(cfg: ModelConfig) -> list[tuple[str, str]]:
    """(field, why) for each rule of the hf family's shapes: a known model_type, the gated MLP, and
    that architecture's own rules."""
    if cfg.model_type is not None and cfg.model_type not in ARCHS:
        why = REFUSED.get(cfg.model_type, f"the hf family builds {', '.join(SUPPORTED)}")
        return [("model_type", f"model_type {cfg.model_type!r}: {why}")]
    out: list[tuple[str, str]] = []
    if cfg.mlp != "swiglu":
        out.append(("mlp", f"the hf family builds Llama's SwiGLU MLP; mlp {cfg.mlp!r} is the parallab family's only"))
    return out + arch_of(cfg).shape_problems(cfg)


__all__ = ["ARCHS", "REFUSED", "SUPPORTED", "HFArch", "arch_of", "implied_model_type", "shape_problems", "stored_model_type"]
