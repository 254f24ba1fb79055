"""The workload model's shape: its config, the presets, and its parameter and FLOP counts.

`ModelConfig` is the one place a shape field is declared — with its bounds, its description and
the CLI flag that sets it. The job spec's overrides, the form's inputs, `parallab plan`'s and
`bench`'s flags and `GET /api/v1/plan`'s parameters are all derived from its fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator


def shape_field(description: str, *, cli: str, key: bool = True, **bounds: Any) -> Any:
    """A shape field: `cli` is its flag in `parallab plan`/`bench`; `key` whether runs that differ
    in it may not be ranked together (it is part of the leaderboard's workload key)."""
    return Field(description=description, json_schema_extra={"cli": cli, "workload_key": key}, **bounds)


class ModelConfig(BaseModel):
    """A decoder-only, Llama-style transformer (RMSNorm, rotary positions, SwiGLU MLP or MoE MLP)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    vocab_size: int = shape_field("Tokens in the (synthetic) vocabulary (V).", cli="--vocab", ge=2, le=1 << 21)
    hidden_size: int = shape_field("Width of the residual stream (h).", cli="--hidden", ge=2, le=1 << 16)
    num_layers: int = shape_field("Transformer blocks (L).", cli="--layers", ge=1, le=1024)
    num_heads: int = shape_field("Attention heads (A); the head dim is hidden_size / num_heads.", cli="--heads", ge=1, le=1024)
    ffn_hidden_size: int = shape_field("Inner width of each SwiGLU MLP (and of each expert).", cli="--ffn-hidden", ge=1, le=1 << 18)
    seq_len: int = shape_field("Tokens per sequence (T).", cli="--seq-len", ge=2, le=1 << 20)
    num_experts: int = shape_field("Experts per MoE layer; 0 means a dense MLP in every block.", cli="--experts", ge=0, le=1024, default=0)
    top_k: int = shape_field("Experts each token is routed to.", cli="--top-k", ge=1, le=64, default=2)
    capacity_factor: float = shape_field(
        "Tokens an expert accepts = ceil(capacity_factor · tokens · top_k / num_experts).",
        cli="--capacity-factor",
        gt=0,
        le=64,
        default=1.25,
    )
    norm_eps: float = shape_field("RMSNorm epsilon.", cli="--norm-eps", key=False, gt=0, le=1, default=1e-5)
    rope_theta: float = shape_field("Rotary base frequency.", cli="--rope-theta", key=False, gt=0, le=1e9, default=10_000.0)

    @model_validator(mode="after")
    def _consistent(self) -> ModelConfig:
        problems = shape_problems(self)
        if problems:
            raise ValueError("; ".join(f"{name}: {msg}" for name, msg in problems))
        return self

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0


SHAPE_FIELDS: tuple[str, ...] = tuple(ModelConfig.model_fields)
"""Every shape field, in declaration order (the form's and the CLI's order)."""


def shape_problems(cfg: ModelConfig) -> list[tuple[str, str]]:
    """(field, message) for each rule that ties shape fields together."""
    out: list[tuple[str, str]] = []
    if cfg.hidden_size % cfg.num_heads:
        out.append(("num_heads", f"hidden_size {cfg.hidden_size} is not divisible by num_heads {cfg.num_heads}"))
    elif cfg.head_dim % 2:
        out.append(("num_heads", f"head dim (hidden_size / num_heads = {cfg.head_dim}) must be even for rotary positions"))
    if cfg.num_experts and cfg.top_k > cfg.num_experts:
        out.append(("top_k", f"top_k {cfg.top_k} must be between 1 and num_experts {cfg.num_experts}"))
    return out


@dataclass(frozen=True)
class Preset:
    """A named model shape and the recipe defaults that go with it."""

    config: ModelConfig
    global_batch_size: int = 8
    """Sequences per optimizer step unless the spec says otherwise."""
    moe_experts: int = 4
    """Experts the `moe` strategy uses when the preset is dense and the spec names none."""


def _cfg(**fields: Any) -> ModelConfig:
    return ModelConfig.model_validate(fields)


PRESETS: dict[str, Preset] = {
    # Seconds on 2 CPU cores; every divisibility rule holds for world sizes 1, 2 and 4.
    "tiny": Preset(_cfg(vocab_size=256, hidden_size=64, num_layers=4, num_heads=4, ffn_hidden_size=256, seq_len=64)),
    "small": Preset(_cfg(vocab_size=1024, hidden_size=256, num_layers=4, num_heads=8, ffn_hidden_size=1024, seq_len=128)),
    "gpt2-124m": Preset(
        _cfg(vocab_size=50304, hidden_size=768, num_layers=12, num_heads=12, ffn_hidden_size=2048, seq_len=1024), moe_experts=8
    ),
    "llama-1b": Preset(
        _cfg(vocab_size=32000, hidden_size=2048, num_layers=16, num_heads=32, ffn_hidden_size=8192, seq_len=2048), moe_experts=8
    ),
    "llama-8b": Preset(
        _cfg(vocab_size=128256, hidden_size=4096, num_layers=32, num_heads=32, ffn_hidden_size=14336, seq_len=4096, rope_theta=500_000.0),
        moe_experts=8,
    ),
}


FFN_MULTIPLE = 256
"""What a derived SwiGLU width is rounded up to (Llama's `multiple_of`)."""


def swiglu_ffn(hidden_size: int) -> int:
    """The SwiGLU MLP width for a residual width h: 8/3·h rounded up to a multiple of 256.

    Llama's rule (Shazeer 2020; Touvron et al. 2023): three h×f matrices with f = 8/3·h hold the
    parameters of a GPT-style two-matrix 4h GELU MLP (8h²). Our model is SwiGLU, so 4h — GPT's
    rule for a GELU MLP — would describe a model a third larger than the one meant.
    h = 4096 gives 11008 (Llama-7B's width); `tiny`'s h = 64 gives 256.
    """
    return FFN_MULTIPLE * -(-(8 * hidden_size) // (3 * FFN_MULTIPLE))


def model_with(preset: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """The preset's shape with the given fields replaced (None values are ignored), as raw fields.

    A hidden size that differs from the preset's without an ffn size of its own gets the SwiGLU
    width of that hidden size (`swiglu_ffn`), not the preset's: overriding the width alone must
    describe a consistent model. A resolved workload names both, so it resolves as it was.
    """
    fields = PRESETS[preset].config.model_dump()
    given = {k: v for k, v in overrides.items() if v is not None and k in SHAPE_FIELDS}
    hidden = given.get("hidden_size", fields["hidden_size"])
    if "ffn_hidden_size" not in given and hidden != fields["hidden_size"] and isinstance(hidden, int):
        given["ffn_hidden_size"] = swiglu_ffn(hidden)
    fields.update(given)
    return fields


def custom_fields(preset: str, shape: dict[str, Any], *, defaults: dict[str, Any] | None = None) -> list[str]:
    """The shape fields `shape` sets to other values than the preset (with `defaults` laid over it,
    e.g. the experts a strategy adds) — a model is *custom* when this is not empty. An unknown
    preset makes every given field custom."""
    if preset not in PRESETS:
        return [name for name in SHAPE_FIELDS if shape.get(name) is not None]
    base = {**PRESETS[preset].config.model_dump(), **(defaults or {})}
    return [name for name in SHAPE_FIELDS if shape.get(name) is not None and shape[name] != base[name]]


@dataclass(frozen=True)
class ParamCounts:
    """Parameter counts of a model, split the way the formulas need them."""

    embedding: int
    """Input token embedding (excluded from N in 6N, as in PaLM appendix B)."""
    non_embedding: int
    """Everything else, LM head included (it is a real matmul per token)."""
    active_non_embedding: int
    """Non-embedding parameters one token touches (MoE: top_k of num_experts experts)."""
    per_layer: int

    @property
    def total(self) -> int:
        return self.embedding + self.non_embedding


def param_counts(cfg: ModelConfig) -> ParamCounts:
    """Exact parameter counts of the model the harness builds from `cfg` (workers.harness.model)."""
    h, f = cfg.hidden_size, cfg.ffn_hidden_size
    attention = 4 * h * h  # q, k, v, o projections, no bias
    norms = 2 * h  # two RMSNorm weights per block
    if cfg.is_moe:
        experts = cfg.num_experts * 3 * h * f
        router = h * cfg.num_experts
        layer = attention + norms + experts + router
        active_layer = attention + norms + cfg.top_k * 3 * h * f + router
    else:
        layer = active_layer = attention + norms + 3 * h * f
    head = cfg.vocab_size * h + h  # LM head + final norm
    return ParamCounts(
        embedding=cfg.vocab_size * h,
        non_embedding=cfg.num_layers * layer + head,
        active_non_embedding=cfg.num_layers * active_layer + head,
        per_layer=layer,
    )


def model_flops_per_token(cfg: ModelConfig) -> int:
    """6·N + 12·L·H·Q·T (PaLM appendix B): training FLOPs per token, attention included."""
    counts = param_counts(cfg)
    return 6 * counts.active_non_embedding + 12 * cfg.num_layers * cfg.num_heads * cfg.head_dim * cfg.seq_len
