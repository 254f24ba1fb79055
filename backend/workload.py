"""Model shapes and presets — shared by the API (validation, prediction) and the ranks (building).

Pure Python on purpose: backend/ never imports torch, yet the API must check a spec against the
model's shape (heads divisible by the TP degree, ...) and predict its memory before anything runs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any


@dataclass(frozen=True)
class ModelConfig:
    """A decoder-only, Llama-style transformer (RMSNorm, rotary positions, SwiGLU MLP or MoE MLP)."""

    vocab_size: int
    """Tokens in the (synthetic) vocabulary."""
    hidden_size: int
    """Width of the residual stream (h)."""
    num_layers: int
    """Transformer blocks (L)."""
    num_heads: int
    """Attention heads (A); head dim is hidden_size / num_heads."""
    ffn_hidden_size: int
    """Inner width of each SwiGLU MLP (and of each expert)."""
    seq_len: int
    """Tokens per sequence (T)."""
    num_experts: int = 0
    """Experts per MoE layer; 0 means a dense MLP in every block."""
    top_k: int = 2
    """Experts each token is routed to."""
    capacity_factor: float = 1.25
    """Tokens an expert accepts = ceil(capacity_factor * tokens * top_k / num_experts)."""
    moe_default_experts: int = 4
    """Experts used when the `moe` strategy runs a preset whose num_experts is 0."""
    norm_eps: float = 1e-5
    rope_theta: float = 10_000.0

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "ffn_hidden_size", "seq_len"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}")
        if (self.hidden_size // self.num_heads) % 2:
            raise ValueError("head dim (hidden_size / num_heads) must be even for rotary positions")
        if self.num_experts < 0:
            raise ValueError("num_experts must be >= 0")
        if self.num_experts and not 1 <= self.top_k <= self.num_experts:
            raise ValueError(f"top_k {self.top_k} must be between 1 and num_experts {self.num_experts}")
        if self.capacity_factor <= 0:
            raise ValueError("capacity_factor must be positive")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


PRESETS: dict[str, ModelConfig] = {
    # Seconds on 2 CPU cores; every divisibility rule holds for world sizes 1, 2 and 4.
    "tiny": ModelConfig(vocab_size=256, hidden_size=64, num_layers=4, num_heads=4, ffn_hidden_size=256, seq_len=64),
    "small": ModelConfig(vocab_size=1024, hidden_size=256, num_layers=4, num_heads=8, ffn_hidden_size=1024, seq_len=128),
    "gpt2-124m": ModelConfig(vocab_size=50304, hidden_size=768, num_layers=12, num_heads=12, ffn_hidden_size=2048, seq_len=1024, moe_default_experts=8),
    "llama-1b": ModelConfig(vocab_size=32000, hidden_size=2048, num_layers=16, num_heads=32, ffn_hidden_size=8192, seq_len=2048, moe_default_experts=8),
    "llama-8b": ModelConfig(vocab_size=128256, hidden_size=4096, num_layers=32, num_heads=32, ffn_hidden_size=14336, seq_len=4096, rope_theta=500_000.0, moe_default_experts=8),
}

# Global batch (sequences per optimizer step) each preset uses unless the spec says otherwise.
DEFAULT_GLOBAL_BATCH: dict[str, int] = {"tiny": 8, "small": 8, "gpt2-124m": 8, "llama-1b": 8, "llama-8b": 8}

MODEL_FIELDS = ("vocab_size", "hidden_size", "num_layers", "num_heads", "ffn_hidden_size", "seq_len", "num_experts", "top_k", "capacity_factor")


def build_model_config(preset: str, overrides: dict[str, Any] | None = None) -> ModelConfig:
    """The preset with the given fields replaced (None values are ignored)."""
    if preset not in PRESETS:
        raise KeyError(f"unknown model preset {preset!r}; known: {', '.join(PRESETS)}")
    changes = {k: v for k, v in (overrides or {}).items() if v is not None and k in MODEL_FIELDS}
    return replace(PRESETS[preset], **changes)


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
    """Exact parameter counts of the model `workers.harness.model` builds from `cfg`."""
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
