"""What every Hugging Face architecture the `hf` family builds declares, and the rules they share.

One architecture is one `model_type` of `transformers` (torchtitan adds a model as one folder
registered by name; here one module of this package, registered in its `__init__`). Each owns:

- its config keys (`Keys`): which keys of its `config.json` are shape fields, what its config
  class defaults them to, which keys must hold the value it builds, which it ignores;
- its shape rules (`HFArch.admits`, `requires`, `shape_problems`): which of the workload's
  feature fields it has (Mixtral has no shared experts, Llama no latent attention);
- its parameters and tensor-parallel plan (`attention_params`, `mlp_params`, the plans), which
  the family's closed-form counts read (`norms`: the RMSNorms per block);
- the `transformers` class and config it is built as (`hf_class`, `hf_config`); the rank side
  builds it through the builder registered under the same `model_type` (`workers.harness.hf_archs`).

The rules every architecture shares live here once; an architecture overrides only what differs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from parallab.core.families.base import Param, TPStyle

if TYPE_CHECKING:
    from parallab.core.model import ModelConfig

Check = tuple[Callable[[Any], bool], str]
"""A must-hold key's test and what it must be (the refusal says it)."""


def is_false(value: Any) -> bool:
    return value is False


def is_false_or_null(value: Any) -> bool:
    return value is None or value is False


def is_zero(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0


def is_one_or_null(value: Any) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool) and value == 1)


def is_silu(value: Any) -> bool:
    return value in ("silu", "swish")


def is_empty(value: Any) -> bool:
    return value is None or value == {} or value == []


def equals_or_null(expected: float) -> Callable[[Any], bool]:
    """A test for a number that must be `expected` (or absent: the config class's default)."""
    return lambda value: value is None or (isinstance(value, (int, float)) and not isinstance(value, bool) and value == expected)


def full_attention_only(value: Any) -> bool:
    return value is None or (isinstance(value, list) and all(v == "full_attention" for v in value))


COMMON_MUST_HOLD: dict[str, Check] = {
    "hidden_act": (is_silu, '"silu" (the SwiGLU MLP the hf family builds)'),
    "attention_dropout": (is_zero, "0 (the family trains without dropout)"),
    "is_encoder_decoder": (is_false, "false (a decoder-only model)"),
    "add_cross_attention": (is_false, "false (a decoder-only model)"),
    "pruned_heads": (is_empty, "empty (pruned heads change the attention's tensors)"),
    "layer_types": (full_attention_only, 'every layer "full_attention" (the family builds no sliding-window layer)'),
}
"""Keys every architecture holds to the value it builds (an architecture's own `must_hold` wins)."""
NO_BIAS: dict[str, Check] = {"attention_bias": (is_false, "false"), "mlp_bias": (is_false, "false")}


@dataclass(frozen=True)
class Keys:
    """An architecture's `config.json`: what it reads, what its config class defaults, what it
    refuses or ignores (`parallab.core.hf_config` reads a config with it)."""

    attention_bias: bool = False
    """Biases on q, k and v (Qwen2): the `attention_bias` field."""
    kv_heads_default: int | None = None
    """`num_key_value_heads` when the config has none (None: as many as the query heads)."""
    max_positions_default: int = 2048
    sliding_window_default: int | None = None
    """The attention window when the config names none (None: no window)."""
    must_hold: dict[str, Check] = field(default_factory=dict)
    ignored: frozenset[str] = frozenset()
    window_key: str | None = None
    """The key whose window must cover the sequence (Mistral's `sliding_window`)."""
    reads: dict[str, str] = field(default_factory=dict)
    """Shape keys of this model_type only (Mixtral's experts), as `hf_config.READ`: key → field."""
    read_defaults: dict[str, Any] = field(default_factory=dict)
    """Values of read keys the config lacks (the config class's defaults)."""
    null_reads: dict[str, Any] = field(default_factory=dict)
    """Values of `reads` keys the config sets to null where null means other than the default."""
    zero_reads: frozenset[str] = frozenset()
    """`reads` keys that may be 0 (the others are positive integers)."""
    required: tuple[str, ...] = ()
    """Keys of this model_type a config must have besides `hf_config.REQUIRED`."""
    norm_eps_default: float = 1e-6
    rope_theta_default: float = 10_000.0
    tie_default: bool = False
    """`tie_word_embeddings` when the config has none (Gemma ties its head)."""
    cross_checks: Callable[[dict[str, Any], dict[str, Any]], list[tuple[str, str]]] | None = None
    """Rules between a config's keys and the fields read from it: (key, why) for each broken one."""


FEATURES: dict[str, str] = {
    "attention_bias": "q/k/v biases",
    "num_experts": "routed experts (an MoE MLP)",
    "num_shared_experts": "shared experts",
    "first_dense_layers": "dense first layers",
    "moe_ffn_hidden_size": "experts of another width than ffn_hidden_size (DeepSeek-V2's)",
    "kv_lora_rank": "multi-head latent attention (DeepSeek-V2's)",
    "head_dim": "head_dim other than hidden_size / num_heads (a head width of its own)",
}
"""Shape fields an architecture has or has not (off their default: the feature is there)."""


def _on(cfg: ModelConfig, name: str) -> bool:
    """Whether feature `name` is there (a width equal to the one it defaults to is none of its own:
    a shape checked before validation may still hold it)."""
    value = getattr(cfg, name)
    if name == "moe_ffn_hidden_size":
        return value not in (None, cfg.ffn_hidden_size)
    if name == "head_dim":
        return value not in (None, cfg.hidden_size // cfg.num_heads)
    return value not in (None, 0, False)


def swiglu_params(module: str, h: int, f: int) -> list[Param]:
    """A library gated MLP's three matrices (gate and up h → f, down f → h) under `module`."""
    return [
        Param(f"{module}.gate_proj", "weight", (f, h)),
        Param(f"{module}.up_proj", "weight", (f, h)),
        Param(f"{module}.down_proj", "weight", (h, f)),
    ]


def qkvo_params(cfg: ModelConfig) -> list[Param]:
    """Separate q, k, v projections (heads·head_dim and kv_heads·head_dim wide, biased when
    `attention_bias`) and o_proj back to the residual stream."""
    h, kv, q = cfg.hidden_size, cfg.kv_dim, cfg.num_heads * cfg.head_width
    out: list[Param] = []
    for name, width in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
        out.append(Param(f"self_attn.{name}", "weight", (width, h)))
        if cfg.attention_bias:
            out.append(Param(f"self_attn.{name}", "bias", (width,)))
    return [*out, Param("self_attn.o_proj", "weight", (h, q))]


def expert_params(cfg: ModelConfig) -> list[Param]:
    """An MoE block's router (E×h) and its experts as transformers 5 fuses them: gate_up_proj
    (E, 2f, h: each expert's gate rows then its up rows) and down_proj (E, h, f)."""
    e, h, f = cfg.num_experts, cfg.hidden_size, cfg.expert_ffn
    return [
        Param("mlp.gate", "weight", (e, h)),
        Param("mlp.experts", "gate_up_proj", (e, 2 * f, h), expert=True),
        Param("mlp.experts", "down_proj", (e, h, f), expert=True),
    ]


QKVO_PLAN: dict[str, TPStyle] = {
    "self_attn": "input_kwarg",
    "self_attn.q_proj": "colwise",
    "self_attn.k_proj": "colwise",
    "self_attn.v_proj": "colwise",
    "self_attn.o_proj": "rowwise",
}
"""The library's `base_model_tp_plan` for separate projections, its input prepared once (Megatron's)."""
SWIGLU_PLAN: dict[str, TPStyle] = {"mlp": "input", "mlp.gate_proj": "colwise", "mlp.up_proj": "colwise", "mlp.down_proj": "rowwise"}


class HFArch:
    """One `model_type`: Llama's decoder unless a subclass says otherwise (see the module)."""

    model_type: ClassVar[str]
    title: ClassVar[str]
    """The architecture's name in messages ("Mixtral")."""
    hf_class: ClassVar[str]
    """The `transformers` class it is built as (`…ForCausalLM`; its config class is `…Config`)."""
    keys: ClassVar[Keys]
    admits: ClassVar[frozenset[str]] = frozenset({"head_dim"})
    """The `FEATURES` it has; a shape with another one is refused naming the field."""
    requires: ClassVar[frozenset[str]] = frozenset()
    """The `FEATURES` it always has (Qwen2's biases): a shape without one is not this architecture."""
    stored_as: ClassVar[str | None] = None
    """The model_type whose module this one builds exactly, when another's (Mistral with its window
    covering the sequence is Llama's): its workloads are that one's."""
    norms: ClassVar[tuple[str, ...]] = ("input_layernorm", "post_attention_layernorm")
    """Each block's RMSNorms, in the module's order."""
    unsupported_dims: ClassVar[dict[str, str]] = {}
    """Dimensions this architecture does not run, with why (the family refuses them at resolution)."""

    @property
    def config_class(self) -> str:
        return self.hf_class.replace("ForCausalLM", "Config")

    # ---- shape rules ----

    def shape_problems(self, cfg: ModelConfig) -> list[tuple[str, str]]:
        """(field, why) for each shape field this architecture cannot build."""
        out = [
            (name, f"the hf family builds this shape as model_type {self.model_type}: {self.title}, which has no {what}")
            for name, what in FEATURES.items()
            if name not in self.admits and _on(cfg, name)
        ]
        out += [
            (name, f"model_type {self.model_type} ({self.title}) always has {FEATURES[name]}")
            for name in sorted(self.requires)
            if not _on(cfg, name)
        ]
        default = type(cfg).model_fields["capacity_factor"].default
        if cfg.num_experts and "num_experts" in self.admits and cfg.capacity_factor != default:  # a key field that would split runs
            out.append(("capacity_factor", f"{self.title}'s experts take every routed token (no capacity): leave it at {default}"))
        return out

    # ---- the library's config ----

    def hf_config(self, cfg: ModelConfig) -> dict[str, Any]:
        """The keyword arguments of the library's config class for this shape (the common ones;
        an architecture adds or drops its own in `own_config`)."""
        common: dict[str, Any] = {
            "vocab_size": cfg.vocab_size,
            "hidden_size": cfg.hidden_size,
            "intermediate_size": cfg.ffn_hidden_size,
            "num_hidden_layers": cfg.num_layers,
            "num_attention_heads": cfg.num_heads,
            "num_key_value_heads": cfg.kv_heads,
            "head_dim": cfg.head_width,
            "hidden_act": "silu",
            "max_position_embeddings": cfg.seq_len,
            "rms_norm_eps": cfg.norm_eps,
            "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
            "tie_word_embeddings": cfg.tie_embeddings,
            "attention_dropout": 0.0,
            "initializer_range": 0.02,
            "use_cache": False,
            "pad_token_id": None,  # no padding row: the harness's batches have none (Gemma's 0 and Phi-3's 32000 are token ids)
        }
        return self.own_config(cfg, common)

    def own_config(self, cfg: ModelConfig, common: dict[str, Any]) -> dict[str, Any]:
        return {**common, "attention_bias": False, "mlp_bias": False}

    # ---- tensors and plan ----

    def attention_params(self, cfg: ModelConfig) -> list[Param]:
        return qkvo_params(cfg)

    def mlp_params(self, cfg: ModelConfig, layer: int) -> list[Param]:
        return swiglu_params("mlp", cfg.hidden_size, cfg.ffn_hidden_size)

    def block_params(self, cfg: ModelConfig, layer: int) -> list[Param]:
        h = cfg.hidden_size
        return [*self.attention_params(cfg), *self.mlp_params(cfg, layer), *(Param(n, "weight", (h,)) for n in self.norms)]

    def attention_plan(self, cfg: ModelConfig) -> dict[str, TPStyle]:
        return dict(QKVO_PLAN)

    def mlp_plan(self, cfg: ModelConfig, layer: int) -> dict[str, TPStyle]:
        return dict(SWIGLU_PLAN)

    def block_plan(self, cfg: ModelConfig, layer: int) -> dict[str, TPStyle]:
        norms: dict[str, TPStyle] = {name: "norm" for name in self.norms}
        return {**norms, **self.attention_plan(cfg), **self.mlp_plan(cfg, layer)}
