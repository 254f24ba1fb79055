"""The workload model's shape: its config and the presets (its tensors and its parameter and FLOP
counts are its family's: `parallab.core.families`).

`ModelConfig` is the one place a shape field is declared — with its bounds, its description and
the CLI flag that sets it. The job spec's overrides, the form's inputs, `parallab plan`'s and
`bench`'s flags and `GET /api/v1/plan`'s parameters are all derived from its fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from parallab.core.families import hf_archs
from parallab.core.families.module import module_problems

_UNSET: Any = object()


def shape_field(
    description: str, *, cli: str, key: bool = True, neutral: Any = _UNSET, neutral_as: str | None = None, **bounds: Any
) -> Any:
    """A shape field: `cli` is its flag in `parallab plan`/`bench`; `key` whether runs that differ
    in it may not be ranked together (it is part of the leaderboard's workload key). `neutral`: for
    a field added after runs were stored, the value every such run had (`neutral_as`: the value of
    that other field) — the workload key leaves the field out while it holds it, so stored keys
    stay valid."""
    extra: dict[str, Any] = {"cli": cli, "workload_key": key}
    if neutral is not _UNSET:
        extra["neutral"] = neutral
    if neutral_as is not None:
        extra["neutral_as"] = neutral_as
    return Field(description=description, json_schema_extra=extra, **bounds)


Mlp = Literal["swiglu", "gelu"]
Family = Literal["parallab", "hf", "module"]


class ModelConfig(BaseModel):
    """A decoder-only transformer's shape, built by its `family` (`parallab.core.families`): RMSNorm,
    rotary positions, multi-head or grouped-query attention, a SwiGLU or GELU MLP or an MoE MLP
    (top-k routed experts, shared experts, dense first layers), tied or untied embeddings. The
    `hf` family builds the SwiGLU subset as Hugging Face's Llama (Qwen2 with q/k/v biases, Mixtral
    with routed experts), and with `kv_lora_rank` DeepSeek-V2 (multi-head latent attention, shared
    experts, dense first layers, experts `moe_ffn_hidden_size` wide)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False, protected_namespaces=())

    family: Family = shape_field(
        "Model family: parallab (our own decoder) or hf (a Hugging Face transformers model of the same shape built offline "
        "from its config with random weights: Llama, Qwen2 with attention_bias, Mixtral with num_experts, DeepSeek-V2 with "
        "kv_lora_rank; the worker needs "
        "parallab[hf]) or module (a lab's own nn.Module from the entry point `module`, which the worker's allow-list must "
        "name; docs/models.md).",
        cli="--family",
        default="parallab",
        neutral="parallab",
    )
    module: str | None = shape_field(
        "The module family's entry point, package.module:function (it gets this shape and returns the model and its spec); "
        "only entry points on the worker's allow-list (PARALLAB_ALLOWED_MODULES, package.module:callable) run.",
        cli="--module",
        default=None,
        neutral=None,
        min_length=3,
        max_length=200,
    )
    model_type: str | None = shape_field(
        "The hf family's architecture, a Hugging Face config's model_type (llama, mistral, qwen2, mixtral, deepseek_v2, "
        "gemma2, phi3); default: the one the shape implies (DeepSeek-V2 with kv_lora_rank, Mixtral with num_experts, "
        "Qwen2 with attention_bias, else Llama).",
        cli="--model-type",
        default=None,
        neutral=None,
        min_length=1,
        max_length=40,
    )
    vocab_size: int = shape_field("Tokens in the (synthetic) vocabulary (V).", cli="--vocab", ge=2, le=1 << 21)
    hidden_size: int = shape_field("Width of the residual stream (h).", cli="--hidden", ge=2, le=1 << 16)
    num_layers: int = shape_field("Transformer blocks (L).", cli="--layers", ge=1, le=1024)
    num_heads: int = shape_field("Attention heads (A); the head dim is hidden_size / num_heads.", cli="--heads", ge=1, le=1024)
    head_dim: int | None = shape_field(
        "Width of each attention head where it is not hidden_size / num_heads (Gemma's 256; the hf family only); "
        "default: hidden_size / num_heads.",
        cli="--head-dim",
        ge=2,
        le=4096,
        default=None,
        neutral=None,
    )
    num_kv_heads: int | None = shape_field(
        "Key/value heads (grouped-query attention: K and V are kv_heads × head_dim wide); default: num_heads (multi-head).",
        cli="--kv-heads",
        ge=1,
        le=1024,
        default=None,
        neutral_as="num_heads",
    )
    ffn_hidden_size: int = shape_field("Inner width of each MLP (and of each expert).", cli="--ffn-hidden", ge=1, le=1 << 18)
    mlp: Mlp = shape_field(
        "MLP kind: swiglu (three matrices, SiLU gate: Llama) or gelu (two matrices: GPT).", cli="--mlp", default="swiglu", neutral="swiglu"
    )
    tie_embeddings: bool = shape_field(
        "The LM head reuses the token embedding's matrix.", cli="--tie-embeddings", default=False, neutral=False
    )
    attention_bias: bool = shape_field(
        "Biases on the q, k and v projections (Qwen2).", cli="--attention-bias", default=False, neutral=False
    )
    seq_len: int = shape_field("Tokens per sequence (T).", cli="--seq-len", ge=2, le=1 << 20)
    num_experts: int = shape_field("Experts per MoE layer; 0 means a dense MLP in every block.", cli="--experts", ge=0, le=1024, default=0)
    top_k: int = shape_field("Experts each token is routed to.", cli="--top-k", ge=1, le=64, default=2)
    num_shared_experts: int = shape_field(
        "Experts every token passes through besides its routed ones (one MLP of num_shared_experts × ffn_hidden_size).",
        cli="--shared-experts",
        ge=0,
        le=64,
        default=0,
        neutral=0,
    )
    first_dense_layers: int = shape_field(
        "Leading blocks with a dense MLP in an MoE model.", cli="--first-dense-layers", ge=0, le=1024, default=0, neutral=0
    )
    moe_ffn_hidden_size: int | None = shape_field(
        "Inner width of each routed and shared expert where it differs from the dense MLP's ffn_hidden_size "
        "(DeepSeek-V2's moe_intermediate_size; the hf family with kv_lora_rank only); default: ffn_hidden_size.",
        cli="--moe-ffn-hidden",
        ge=1,
        le=1 << 18,
        default=None,
        neutral_as="ffn_hidden_size",
    )
    kv_lora_rank: int = shape_field(
        "Multi-head latent attention (DeepSeek-V2, the hf family): width of the compressed key/value latent "
        "(kv_a_proj_with_mqa h → rank + qk_rope_head_dim, RMSNorm, kv_b_proj rank → heads·(qk_nope_head_dim + v_head_dim)); "
        "0: plain q, k, v projections of hidden_size / num_heads per head.",
        cli="--kv-lora-rank",
        ge=0,
        le=1 << 16,
        default=0,
        neutral=0,
    )
    q_lora_rank: int = shape_field(
        "MLA: rank of the query's compression (q_a_proj h → rank, RMSNorm, q_b_proj); 0: one q_proj (DeepSeek-V2-Lite).",
        cli="--q-lora-rank",
        ge=0,
        le=1 << 16,
        default=0,
        neutral=0,
    )
    qk_nope_head_dim: int = shape_field(
        "MLA: each head's query/key width without rotary positions.", cli="--qk-nope-head-dim", ge=0, le=4096, default=0, neutral=0
    )
    qk_rope_head_dim: int = shape_field(
        "MLA: each head's query/key width with rotary positions (the key's part is one, shared by every head).",
        cli="--qk-rope-head-dim",
        ge=0,
        le=4096,
        default=0,
        neutral=0,
    )
    v_head_dim: int = shape_field("MLA: each head's value width.", cli="--v-head-dim", ge=0, le=4096, default=0, neutral=0)
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

    @model_validator(mode="before")
    @classmethod
    def _multi_head_by_default(cls, data: Any) -> Any:
        """No num_kv_heads: multi-head attention, as many K/V heads as query heads (stored as a
        number). Experts as wide as the dense MLP are stored as no expert width of their own
        (None), however they were given: one model, one workload."""
        if not isinstance(data, dict):
            return data
        if data.get("num_kv_heads") is None and "num_heads" in data:
            data = {**data, "num_kv_heads": data["num_heads"]}
        if data.get("moe_ffn_hidden_size") is not None and data.get("moe_ffn_hidden_size") == data.get("ffn_hidden_size"):
            data = {**data, "moe_ffn_hidden_size": None}
        heads, hidden = data.get("num_heads"), data.get("hidden_size")
        if isinstance(heads, int) and isinstance(hidden, int) and heads and data.get("head_dim") == hidden // heads and not hidden % heads:
            data = {**data, "head_dim": None}  # the width hidden_size / num_heads gives: no width of its own
        if data.get("model_type") is not None and data.get("family") == "hf":
            data = {**data, "model_type": hf_archs.stored_model_type(data)}  # the implied architecture: none of its own
        return data

    @property
    def head_width(self) -> int:
        """Each head's width: `head_dim`, else hidden_size / num_heads."""
        return self.head_dim or self.hidden_size // self.num_heads

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    @property
    def kv_dim(self) -> int:
        """Width of the K (and of the V) projection: kv_heads × head_width."""
        return self.kv_heads * self.head_width

    @property
    def is_mla(self) -> bool:
        """Multi-head latent attention (DeepSeek-V2): keys and values from a compressed latent."""
        return self.kv_lora_rank > 0

    @property
    def qk_head_dim(self) -> int:
        """Each head's query/key width (what QKᵀ contracts): head_dim, or MLA's nope + rope parts."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim if self.is_mla else self.head_width

    @property
    def value_head_dim(self) -> int:
        """Each head's value width (what PV produces and o_proj reads): head_dim, or MLA's v_head_dim."""
        return self.v_head_dim if self.is_mla else self.head_width

    @property
    def expert_ffn(self) -> int:
        """Inner width of each routed and shared expert (moe_ffn_hidden_size, else ffn_hidden_size)."""
        return self.moe_ffn_hidden_size or self.ffn_hidden_size

    @property
    def mlp_matrices(self) -> int:
        """Weight matrices per MLP (and per expert): 3 for SwiGLU (w1, w3, w2), 2 for GELU (w1, w2)."""
        return 3 if self.mlp == "swiglu" else 2

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def block_is_moe(self, layer: int) -> bool:
        """Whether block `layer` has the MoE MLP (the first `first_dense_layers` are dense)."""
        return self.is_moe and layer >= self.first_dense_layers

    @property
    def moe_layers(self) -> int:
        return self.num_layers - self.first_dense_layers if self.is_moe else 0


SHAPE_FIELDS: tuple[str, ...] = tuple(ModelConfig.model_fields)
"""Every shape field, in declaration order (the form's and the CLI's order)."""


def _mla_problems(cfg: ModelConfig) -> list[tuple[str, str]]:
    """Multi-head latent attention's widths only with kv_lora_rank, which only the hf family builds
    (as DeepSeek-V2, whose module holds its other rules)."""
    widths = ("q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
    if not cfg.is_mla:
        return [(name, f"{name} is multi-head latent attention's: it needs kv_lora_rank") for name in widths if getattr(cfg, name)]
    if cfg.family != "hf":
        return [("kv_lora_rank", f"multi-head latent attention is built by the hf family (DeepSeek-V2), not the {cfg.family} family")]
    return []


def shape_problems(cfg: ModelConfig) -> list[tuple[str, str]]:
    """(field, message) for each rule that ties shape fields together (the hf family's
    architectures hold their own: `parallab.core.families.hf_archs`)."""
    out: list[tuple[str, str]] = []
    if cfg.hidden_size % cfg.num_heads:
        out.append(("num_heads", f"hidden_size {cfg.hidden_size} is not divisible by num_heads {cfg.num_heads}"))
    elif cfg.head_width % 2:
        width = f"head dim ({cfg.head_dim})" if cfg.head_dim else f"head dim (hidden_size / num_heads = {cfg.head_width})"
        out.append(("head_dim" if cfg.head_dim else "num_heads", f"{width} must be even for rotary positions"))
    kv = cfg.kv_heads
    if cfg.num_heads % kv:
        out.append(("num_kv_heads", f"num_heads {cfg.num_heads} is not divisible by num_kv_heads {kv}"))
    if cfg.num_experts and cfg.top_k > cfg.num_experts:
        out.append(("top_k", f"top_k {cfg.top_k} must be between 1 and num_experts {cfg.num_experts}"))
    if not cfg.num_experts and (cfg.num_shared_experts or cfg.first_dense_layers):
        field = "num_shared_experts" if cfg.num_shared_experts else "first_dense_layers"
        out.append((field, f"{field} needs an MoE model (num_experts is 0)"))
    out += _mla_problems(cfg)
    if cfg.family == "hf":
        out += hf_archs.shape_problems(cfg)
    else:
        for name in ("model_type", "head_dim"):
            if getattr(cfg, name) is not None:
                out.append((name, f"{name} is the hf family's (a Hugging Face architecture), not the {cfg.family} family's"))
        if cfg.moe_ffn_hidden_size not in (None, cfg.ffn_hidden_size):
            out.append(
                (
                    "moe_ffn_hidden_size",
                    "experts narrower or wider than the dense MLP are DeepSeek-V2's (the hf family with kv_lora_rank and "
                    "num_experts); other models' experts are ffn_hidden_size wide",
                )
            )
    out += module_problems(cfg)
    if cfg.num_experts and cfg.first_dense_layers >= cfg.num_layers:
        out.append(
            ("first_dense_layers", f"first_dense_layers {cfg.first_dense_layers} leaves no MoE block of num_layers {cfg.num_layers}")
        )
    return out


@dataclass(frozen=True)
class Preset:
    """A named model shape and the recipe defaults that go with it."""

    config: ModelConfig
    global_batch_size: int = 8
    """Sequences per optimizer step unless the spec says otherwise."""
    moe_experts: int = 4
    """Experts the `moe` strategy uses when the preset is dense and the spec names none."""
    source: str = ""
    """Where the architecture is published (empty: a synthetic shape). A published architecture
    scaled down keeps its own MLP ratio (`model_with`)."""


def _cfg(**fields: Any) -> ModelConfig:
    return ModelConfig.model_validate(fields)


LLAMA3 = "Llama Team 2024, The Llama 3 Herd of Models (Table 3); meta-llama/Meta-Llama-3.1 config.json"


def _llama3(**fields: Any) -> ModelConfig:
    """Llama 3's family traits: a 128,256-token vocabulary, 8 KV heads, rotary base 500,000, untied head."""
    return _cfg(vocab_size=128256, num_kv_heads=8, seq_len=8192, rope_theta=500_000.0, **fields)


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
    # Full multi-head K/V (8.8e9 parameters): not Llama 3's shape, kept so stored runs keep theirs.
    "llama-8b": Preset(
        _cfg(vocab_size=128256, hidden_size=4096, num_layers=32, num_heads=32, ffn_hidden_size=14336, seq_len=4096, rope_theta=500_000.0),
        moe_experts=8,
    ),
    # Published architectures: parameter counts pinned against the module (tests/workers/test_families.py).
    "llama-2-7b": Preset(
        _cfg(vocab_size=32000, hidden_size=4096, num_layers=32, num_heads=32, ffn_hidden_size=11008, seq_len=4096),
        moe_experts=8,
        source="Touvron et al. 2023, Llama 2; meta-llama/Llama-2-7b-hf config.json",
    ),
    "llama-3-8b": Preset(_llama3(hidden_size=4096, num_layers=32, num_heads=32, ffn_hidden_size=14336), moe_experts=8, source=LLAMA3),
    "llama-3-70b": Preset(_llama3(hidden_size=8192, num_layers=80, num_heads=64, ffn_hidden_size=28672), moe_experts=8, source=LLAMA3),
    "llama-3-405b": Preset(_llama3(hidden_size=16384, num_layers=126, num_heads=128, ffn_hidden_size=53248), moe_experts=8, source=LLAMA3),
    "mixtral-8x7b": Preset(
        _cfg(
            vocab_size=32000,
            hidden_size=4096,
            num_layers=32,
            num_heads=32,
            num_kv_heads=8,
            ffn_hidden_size=14336,
            num_experts=8,
            top_k=2,
            seq_len=4096,
            rope_theta=1e6,
        ),
        moe_experts=8,
        source="Jiang et al. 2024, Mixtral of Experts (Table 1); mistralai/Mixtral-8x7B-v0.1 config.json",
    ),
    "qwen2.5-7b": Preset(
        _cfg(
            vocab_size=152064,
            hidden_size=3584,
            num_layers=28,
            num_heads=28,
            num_kv_heads=4,
            ffn_hidden_size=18944,
            attention_bias=True,
            seq_len=4096,
            rope_theta=1e6,
            norm_eps=1e-6,
        ),
        moe_experts=8,
        source="Qwen Team 2024, Qwen2.5 technical report; Qwen/Qwen2.5-7B config.json",
    ),
    "deepseek-v2-lite": Preset(
        _cfg(
            family="hf",
            vocab_size=102400,
            hidden_size=2048,
            num_layers=27,
            num_heads=16,
            ffn_hidden_size=10944,
            num_experts=64,
            top_k=6,
            num_shared_experts=2,
            first_dense_layers=1,
            moe_ffn_hidden_size=1408,
            kv_lora_rank=512,
            qk_nope_head_dim=128,
            qk_rope_head_dim=64,
            v_head_dim=128,
            seq_len=4096,
            norm_eps=1e-6,
        ),
        moe_experts=64,
        source="DeepSeek-AI 2024, DeepSeek-V2 (appendix B: DeepSeek-V2-Lite); deepseek-ai/DeepSeek-V2-Lite config.json",
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


SCALED_FFN_MULTIPLE = 8
"""What a scaled-down published MLP width is rounded up to: every tensor-parallel degree up to 8 divides it."""


def scaled_width(cfg: ModelConfig, width: int, hidden_size: int, multiple: int = SCALED_FFN_MULTIPLE) -> int:
    """`width`'s ratio to `cfg`'s hidden size at another hidden size, rounded up to a multiple of
    `multiple` (exact fractions: no float)."""
    scaled = -(-width * hidden_size // cfg.hidden_size)
    return multiple * -(-scaled // multiple)


def scaled_ffn(cfg: ModelConfig, hidden_size: int) -> int:
    """`cfg`'s MLP ratio f/h at another width, rounded up to a multiple of 8."""
    return scaled_width(cfg, cfg.ffn_hidden_size, hidden_size)


MLA_WIDTHS: dict[str, int] = {"kv_lora_rank": 8, "q_lora_rank": 8, "qk_nope_head_dim": 2, "qk_rope_head_dim": 2, "v_head_dim": 2}
"""Multi-head latent attention's widths, each with what its scaled-down value is rounded up to
(the rotary part stays even)."""


def model_with(preset: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """The preset's shape with the given fields replaced (None values are ignored), as raw fields.

    New query heads without KV heads of their own keep the preset's grouping (multi-head stays
    multi-head; 32 over 8 becomes 64 over 16) where that ratio gives whole heads.
    A hidden size that differs from the preset's without an ffn size of its own gets an MLP width
    of that hidden size, not the preset's: overriding the width alone must describe a consistent
    model. A published architecture keeps its own ratio f/h (`scaled_ffn`: "Llama-3-8B's
    architecture" at h = 256 is still 3.5·h wide, as its heads and KV heads stay 32 and 8); a
    synthetic preset gets Llama's SwiGLU rule (`swiglu_ffn`), or 4h for a GELU MLP (GPT's rule).
    A resolved workload names both, so it resolves as it was.
    """
    base = PRESETS[preset]
    fields = base.config.model_dump()
    given = {k: v for k, v in overrides.items() if v is not None and k in SHAPE_FIELDS}
    heads = given.get("num_heads")
    if "num_kv_heads" not in given and isinstance(heads, int) and (heads * base.config.kv_heads) % base.config.num_heads == 0:
        given["num_kv_heads"] = heads * base.config.kv_heads // base.config.num_heads  # the preset's query heads per K/V head
    hidden = given.get("hidden_size", fields["hidden_size"])
    if "ffn_hidden_size" not in given and hidden != fields["hidden_size"] and isinstance(hidden, int):
        if base.source:
            given["ffn_hidden_size"] = scaled_ffn(base.config, hidden)
            if base.config.moe_ffn_hidden_size and "moe_ffn_hidden_size" not in given:
                given["moe_ffn_hidden_size"] = scaled_width(base.config, base.config.moe_ffn_hidden_size, hidden)
            for name, multiple in MLA_WIDTHS.items():  # latent attention keeps its ratios to h too
                if fields[name] and name not in given:
                    given[name] = scaled_width(base.config, fields[name], hidden, multiple)
        else:
            given["ffn_hidden_size"] = 4 * hidden if given.get("mlp", fields["mlp"]) == "gelu" else swiglu_ffn(hidden)
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


# The counts are the family's; kept importable from here for code written against this module.
from parallab.core.families import ParamCounts as ParamCounts  # noqa: E402
from parallab.core.families import model_flops_per_token as model_flops_per_token  # noqa: E402
from parallab.core.families import param_counts as param_counts  # noqa: E402
