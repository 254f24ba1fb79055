"""A run's model architecture in one line, for the run page and the compare table.

The line is read off the workload block (the result's, else the spec's), so two runs on the same
preset but scaled differently, or on another family, read differently side by side. A block
stored before a shape field existed lacks it; such a run had the field's neutral value (its
`neutral` / `neutral_as` in `parallab.core.model`), so that is what it is described with.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from parallab.core.families import param_counts
from parallab.core.model import PRESETS, SHAPE_FIELDS, ModelConfig, custom_fields, model_with
from parallab.core.spec import KEY_NEUTRAL
from parallab.core.strategies import REGISTRY

MLP_NAMES = {"swiglu": "SwiGLU", "gelu": "GELU"}


def shape_of(workload: dict[str, Any]) -> ModelConfig:
    """The model `workload` describes. A block that names every required shape field is read as
    stored, each absent newer field at its neutral value; one that names only a preset (a queued
    run's spec) is the preset with its overrides. Raises ValueError naming the field when neither
    gives a valid shape."""
    given = {k: workload[k] for k in SHAPE_FIELDS if workload.get(k) is not None}
    required = [k for k, f in ModelConfig.model_fields.items() if f.is_required()]
    preset = workload.get("model")
    if all(k in given for k in required):
        fields = {**{k: v for k, v in KEY_NEUTRAL.items() if k in SHAPE_FIELDS}, **given}
    elif isinstance(preset, str) and preset in PRESETS:
        fields = model_with(preset, given)
    else:
        missing = ", ".join(k for k in required if k not in given)
        raise ValueError(f"workload: no shape fields ({missing}) and no known preset (model {preset!r})")
    try:
        return ModelConfig.model_validate(fields)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "workload"
        raise ValueError(f"{where}: {first['msg']}") from None


def fmt_params(n: int) -> str:
    """A parameter count to three significant figures: 8.03 B, 124 M, 1.05 M, 812 K."""
    for scale, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            value = n / scale
            return f"{value:.3g} {unit}" if value < 100 else f"{value:.0f} {unit}"
    return str(n)


def _heads(cfg: ModelConfig) -> str:
    if cfg.is_mla:
        query = f", query rank {cfg.q_lora_rank}" if cfg.q_lora_rank else ""
        return f"{cfg.num_heads} heads (MLA: latent {cfg.kv_lora_rank}{query})"
    kv = cfg.kv_heads
    if kv == cfg.num_heads:
        return f"{cfg.num_heads} heads (MHA)"
    kind = "MQA" if kv == 1 else "GQA"
    return f"{cfg.num_heads} heads / {kv} KV ({kind})"


def _preset(workload: dict[str, Any], cfg: ModelConfig) -> str | None:
    preset = workload.get("model")
    if not isinstance(preset, str) or not preset:
        return None
    if preset not in PRESETS:
        return f"{preset} (not a preset here)"
    changed = custom_fields(preset, cfg.model_dump())
    return f"{preset} shape" if not changed else f"{preset} shape, custom {', '.join(changed)}"


def describe(workload: dict[str, Any], *, params_total: int | None = None) -> str:
    """One line naming the shape: preset, family, depth, width, heads (GQA when K/V heads are
    fewer), MLP kind and width, experts, vocabulary, tied or not, parameters. `params_total`: the
    count the result stored (its prediction's), else the family's formula gives it. A shape that
    cannot be read says why, naming the field, rather than failing the page."""
    try:
        cfg = shape_of(workload)
    except ValueError as e:
        return f"unknown architecture ({e})"
    parts = [p for p in (_preset(workload, cfg),) if p]
    if cfg.family != "parallab":
        parts.append(f"{cfg.family} family")
    parts += [f"{cfg.num_layers} layers", f"h {cfg.hidden_size}", _heads(cfg)]
    parts.append(f"{MLP_NAMES.get(cfg.mlp, cfg.mlp)} ffn {cfg.ffn_hidden_size}")
    if cfg.is_moe:
        experts = f"{cfg.num_experts} experts top-{cfg.top_k}"
        if cfg.moe_ffn_hidden_size:
            experts += f" of {cfg.moe_ffn_hidden_size}"
        if cfg.num_shared_experts:
            experts += f" (+{cfg.num_shared_experts} shared)"
        if cfg.first_dense_layers:
            experts += f", first {cfg.first_dense_layers} dense"
        parts.append(experts)
    parts.append(f"vocab {cfg.vocab_size}")
    parts.append("tied" if cfg.tie_embeddings else "untied")
    if cfg.attention_bias:
        parts.append("qkv bias")
    total = params_total if isinstance(params_total, int) and not isinstance(params_total, bool) else param_counts(cfg).total
    parts.append(f"{fmt_params(total)} params")
    return " · ".join(parts)


def document_architecture(document: dict[str, Any] | None, spec: dict[str, Any] | None = None) -> str | None:
    """The architecture line of a run: from its result's workload and stored parameter count,
    else from its spec's workload; None when it has neither (nothing to describe), or when its
    job kind trains no model (a collectives sweep, a calibration: the workload only sizes their
    messages and GEMMs, and a model line would read as if one had been trained)."""
    doc, spec = document or {}, spec or {}
    if not _trains(doc.get("strategy") if isinstance(doc.get("strategy"), dict) else spec.get("strategy")):
        return None
    workload = doc.get("workload") if isinstance(doc.get("workload"), dict) else spec.get("workload")
    if not isinstance(workload, dict) or not workload:
        return None
    params = (doc.get("prediction") or {}).get("params_total") if doc.get("workload") else None
    return describe(workload, params_total=params)


def _trains(strategy: Any) -> bool:
    """Whether the strategy block names a job kind that trains a model (an unknown name: assumed so)."""
    name = strategy.get("name") if isinstance(strategy, dict) else None
    descriptor = REGISTRY.get(name) if isinstance(name, str) else None
    return descriptor is None or descriptor.trains
