"""Gemma 2 (`model_type` gemma2): Llama's attention with a head width of its own (`head_dim`,
256 where hidden_size / num_heads is 288 in Gemma-2-2B), a gated MLP with the tanh-approximated
GELU (GeGLU, same three matrices as SwiGLU), four RMSNorms per block (before and after the
attention and the MLP, each scaling by 1 + weight), an embedding scaled by √hidden_size, the head
tied to it by default, and tanh soft-capping of the attention scores (50) and of the logits (30).

What the family builds of it: every layer full causal attention — Gemma 2 alternates sliding
(4,096-token) and global layers, the same attention while the window covers the sequence, so the
window bounds `seq_len` (`Keys.window_key`), as Mistral's does; the soft-caps at the values every
published Gemma 2 has (held, not fields); the attention scaled by head_dim⁻½, so
`query_pre_attn_scalar` must equal head_dim (Gemma-2-2B's and 9B's; 27B's 144 is refused naming
the key). The rank side runs the library's eager attention (SDPA has no soft-cap) under an
explicit causal mask and caps the logits as `Gemma2ForCausalLM` does (`workers.harness.hf_archs`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from parallab.core.families.hf_archs.base import HFArch, Keys, is_false, is_false_or_null

if TYPE_CHECKING:
    from parallab.core.model import ModelConfig

ATTENTION_SOFTCAP = 50.0
LOGIT_SOFTCAP = 30.0
ACTIVATION = "gelu_pytorch_tanh"
HEAD_DIM_DEFAULT = 256


def _is(expected: Any) -> Any:
    return lambda value: value == expected and not isinstance(value, bool)


def _layer_types(value: Any) -> bool:
    return value is None or (isinstance(value, list) and all(v in ("sliding_attention", "full_attention") for v in value))


def _query_scale(config: dict[str, Any], fields: dict[str, Any]) -> list[tuple[str, str]]:
    """The attention's scale is query_pre_attn_scalar⁻½: the family builds head_dim⁻½."""
    scalar, head_dim = config.get("query_pre_attn_scalar", HEAD_DIM_DEFAULT), fields.get("head_dim")
    if head_dim is None or scalar == head_dim:
        return []
    return [("query_pre_attn_scalar", f"must be head_dim ({head_dim}): the hf family scales Gemma 2's attention by head_dim⁻½")]


class Gemma2(HFArch):
    model_type = "gemma2"
    title = "Gemma 2"
    hf_class = "Gemma2ForCausalLM"
    norms = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm")
    keys = Keys(
        kv_heads_default=4,
        max_positions_default=8192,
        sliding_window_default=4096,
        window_key="sliding_window",
        read_defaults={"head_dim": HEAD_DIM_DEFAULT},
        tie_default=True,
        must_hold={
            "hidden_act": (lambda v: v in (None, ACTIVATION), f'"{ACTIVATION}" (Gemma 2\'s GeGLU MLP)'),
            "hidden_activation": (lambda v: v in (None, ACTIVATION), f'"{ACTIVATION}" (Gemma 2\'s GeGLU MLP)'),
            "attention_bias": (is_false, "false"),
            "attn_logit_softcapping": (_is(ATTENTION_SOFTCAP), f"{ATTENTION_SOFTCAP} (every published Gemma 2's; not a field)"),
            "final_logit_softcapping": (_is(LOGIT_SOFTCAP), f"{LOGIT_SOFTCAP} (every published Gemma 2's; not a field)"),
            "use_bidirectional_attention": (is_false_or_null, "false (a causal decoder)"),
            "layer_types": (_layer_types, '"sliding_attention" or "full_attention" per layer'),
            "query_pre_attn_scalar": (  # and equal to head_dim: `_query_scale`
                lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0,
                "a positive number (head_dim)",
            ),
        },
        ignored=frozenset({"cache_implementation"}),  # a generation setting
        cross_checks=_query_scale,
    )

    def own_config(self, cfg: ModelConfig, common: dict[str, Any]) -> dict[str, Any]:
        """Every layer full attention (no window), the caps and the scale the module says."""
        out = {k: v for k, v in common.items() if k != "hidden_act"}
        return {
            **out,
            "hidden_activation": ACTIVATION,
            "attention_bias": False,
            "query_pre_attn_scalar": cfg.head_width,
            "sliding_window": None,
            "layer_types": ["full_attention"] * cfg.num_layers,
            "attn_logit_softcapping": ATTENTION_SOFTCAP,
            "final_logit_softcapping": LOGIT_SOFTCAP,
        }


ARCH = Gemma2()
