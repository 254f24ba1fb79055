"""A Hugging Face `config.json` as a workload's model: the `hf` family's shape fields read from it.

`read_hf_config` maps the dict a model's `config.json` holds onto `ModelConfig`'s fields (family
`hf`, its `model_type`, vocab_size, hidden_size, ffn_hidden_size, num_layers, num_heads,
num_kv_heads, head_dim, tie_embeddings, attention_bias, norm_eps, rope_theta, and an
architecture's own: Mixtral's and DeepSeek-V2's experts, DeepSeek-V2's latent attention) for the
`model_type`s the family builds exactly. Which keys each model_type reads, defaults, holds and
ignores is its architecture's (`parallab.core.families.hf_archs`, one module each: `Keys`); this
module reads any config with them. A model_type the family does not build is refused naming the
key, a near neighbour with its own reason (`hf_archs.REFUSED`: DeepSeek-V3's router).

What a config does not decide: `seq_len`, the batch and the recipe are the workload's. A config's
`max_position_embeddings` (and Mistral's `sliding_window`) is the most tokens a sequence may
have: a preset's longer `seq_len` is cut to it, one asked for explicitly is refused above it
(`HFShape.seq_limit`, checked at resolution).

Every key of the file falls in one of four classes, and the class decides what happens to it:

- **read** (`READ`): a shape key, mapped onto its field and held to that field's bounds (a
  10⁶-layer config is refused naming `num_hidden_layers`); `REQUIRED` ones must be there (a
  config saved by `transformers` always has them), the others default as the library's config
  class defaults them (`Keys`);
- **must hold** (`Keys.must_hold`): keys whose other values would build another model than
  the family's (`hidden_act` not SiLU, `mlp_bias`, Llama's `attention_bias` on o_proj too, a used
  sliding window, dropout, ...): accepted only at the value the family builds, refused otherwise
  naming the key;
- **ignored** (`METADATA`, `Keys.ignored`): what neither a tensor nor the training step
  depends on — names, token ids, the checkpoint's dtype, library versions, generation and
  inference settings, the initialiser's range (the family initialises with its own), and
  `rope_scaling` / a `rope_parameters.rope_type` (they change the rotary frequencies only: not a
  tensor, not a FLOP, not a byte; the run uses plain rotary positions at `rope_theta`);
- **anything else is refused**, naming the key: an unknown key may change the model
  (`quantization_config`, a new attention variant), and a silently ignored one would make the run
  another model than the file's.

The document itself is bounded before any of this (`document_problem`): a JSON object, at most
`MAX_CONFIG_BYTES` as JSON and nested at most `MAX_CONFIG_DEPTH` levels — a real config is two
levels deep and a few KiB. Every refusal is a `SpecProblem` located at `workload.hf_config.<key>`;
the shape rules that tie fields together (heads divisible by KV heads) are `resolve_job`'s, which
locates them at the config's key too when the config set the field.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from parallab.core.bounds import MAX_JSON_DEPTH, json_problem
from parallab.core.families.hf_archs import ARCHS, REFUSED
from parallab.core.families.hf_archs import SUPPORTED as SUPPORTED  # the config input's help and the form name them from here
from parallab.core.families.hf_archs.base import COMMON_MUST_HOLD
from parallab.core.model import ModelConfig
from parallab.core.problems import Loc, SpecError, SpecProblem

MAX_CONFIG_BYTES = 64 * 1024
"""The largest config a workload takes, as JSON (Llama 3's is under 1 KiB; a config with a
per-layer `layer_types` list for 1,024 layers is about 20 KiB)."""
MAX_CONFIG_DEPTH = MAX_JSON_DEPTH
"""The deepest nesting a config may have: any free-form JSON object's in a spec (a real one has 2)."""
LOC: Loc = ("workload", "hf_config")
"""Where a job spec carries a config."""

READ: dict[str, str] = {  # every model_type's (an architecture adds its own: `Keys.reads`)
    "vocab_size": "vocab_size",
    "hidden_size": "hidden_size",
    "intermediate_size": "ffn_hidden_size",
    "num_hidden_layers": "num_layers",
    "num_attention_heads": "num_heads",
    "num_key_value_heads": "num_kv_heads",
    "head_dim": "head_dim",
    "tie_word_embeddings": "tie_embeddings",
    "rms_norm_eps": "norm_eps",
    "rope_theta": "rope_theta",
}
"""Config key → the shape field it sets."""
REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
"""Keys a config must have: the shape itself (every config `transformers` saves has them)."""
MLA_FIELDS = ("kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
"""Multi-head latent attention's fields: 0 (none) unless the config is DeepSeek-V2's."""
LIMITS = ("max_position_embeddings", "sliding_window")
"""Keys that bound the sequence length (`HFShape.seq_limit`), not a field."""

METADATA = frozenset(
    {
        # names, versions, what the checkpoint was saved as
        "model_type",
        "architectures",
        "_name_or_path",
        "_commit_hash",
        "transformers_version",
        "torch_dtype",
        "dtype",
        "use_bfloat16",
        "auto_map",
        "tokenizer_class",
        "prefix",
        "_attn_implementation",
        "_attn_implementation_autoset",
        # token ids
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "sep_token_id",
        "decoder_start_token_id",
        # inference, output and fine-tuning-head settings
        "use_cache",
        "return_dict",
        "output_attentions",
        "output_hidden_states",
        "torchscript",
        "tf_legacy_loss",
        "id2label",
        "label2id",
        "num_labels",
        "problem_type",
        "finetuning_task",
        "task_specific_params",
        "is_decoder",
        "chunk_size_feed_forward",
        # generation settings
        "max_length",
        "min_length",
        "do_sample",
        "early_stopping",
        "num_beams",
        "num_beam_groups",
        "diversity_penalty",
        "temperature",
        "top_k",
        "top_p",
        "typical_p",
        "repetition_penalty",
        "length_penalty",
        "no_repeat_ngram_size",
        "encoder_no_repeat_ngram_size",
        "bad_words_ids",
        "num_return_sequences",
        "output_scores",
        "return_dict_in_generate",
        "forced_bos_token_id",
        "forced_eos_token_id",
        "remove_invalid_values",
        "exponential_decay_length_penalty",
        "suppress_tokens",
        "begin_suppress_tokens",
        # random initialisation (the family's own) and rotary variants (no tensor, no cost)
        "initializer_range",
        "rope_scaling",
    }
)
"""Keys every config may carry that change neither a tensor nor the training step: ignored."""


@dataclass(frozen=True)
class HFShape:
    """What a config says about the workload's model."""

    model_type: str
    fields: dict[str, Any]
    """Shape fields (`ModelConfig`'s names), the structural ones included (family hf, a dense
    SwiGLU MLP), so no preset's value of them is kept."""
    source: dict[str, str]
    """Field → the config key that set it (where a problem with that field is located)."""
    seq_limit: tuple[str, int] | None
    """(key, tokens): the most tokens per sequence the config allows, and the key that says so."""

    def overrides(self, given: dict[str, Any], preset_seq_len: int) -> dict[str, Any]:
        """The shape overrides of a workload with this config: the config's fields under the
        explicitly `given` ones, and the preset's `seq_len` cut to `seq_limit` unless one is given."""
        out = {**self.fields, **given}
        out.setdefault("moe_ffn_hidden_size", out.get("ffn_hidden_size"))  # no expert width of its own: the MLP's
        if "seq_len" not in given and self.seq_limit is not None and preset_seq_len > self.seq_limit[1]:
            out["seq_len"] = self.seq_limit[1]
        return out

    def seq_len_problems(self, seq_len: int) -> list[SpecProblem]:
        """A sequence longer than the config allows, located at the workload's `seq_len`."""
        if self.seq_limit is None or seq_len <= self.seq_limit[1]:
            return []
        key, limit = self.seq_limit
        why = (
            "the model's positions stop there"
            if key == "max_position_embeddings"
            else "beyond it the sliding-window attention differs from the full attention the hf family builds"
        )
        return [SpecProblem(("workload", "seq_len"), f"seq_len {seq_len} is above the config's {key} {limit}: {why}")]

    def loc_of(self, name: str, given: dict[str, Any], loc: Loc = LOC) -> Loc:
        """Where a problem with shape field `name` is located: at the config's key when the config set it."""
        if name in self.source and name not in given:
            return (*loc, self.source[name])
        return ("workload", name)


def _depth_problem(config: dict[str, Any]) -> tuple[str, str] | None:
    """(top-level key, why) for the first value nested deeper than MAX_CONFIG_DEPTH (walked
    without recursion, so no nesting can exhaust the stack)."""
    for key, value in config.items():
        stack: list[tuple[Any, int]] = [(value, 2)]
        while stack:
            item, depth = stack.pop()
            if not isinstance(item, (dict, list)):
                continue
            if depth > MAX_CONFIG_DEPTH:
                return str(key)[:100], f"nested deeper than {MAX_CONFIG_DEPTH} levels (a config.json is a few levels deep)"
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return None


def document_problem(config: Any) -> tuple[str | None, str] | None:
    """(key or None, why) when `config` is not a bounded JSON object: not an object, nested deeper
    than MAX_CONFIG_DEPTH, larger than MAX_CONFIG_BYTES as JSON, or holding what could not be
    stored (a NUL byte, a NaN); None when it is one."""
    if not isinstance(config, dict):
        return None, f"a config.json is a JSON object, not {type(config).__name__}"
    deep = _depth_problem(config)
    if deep is not None:
        return deep
    found = json_problem(config)
    if found is not None:
        path, why = found
        return (str(path[0]) if path else None), why
    size = len(json.dumps(config, ensure_ascii=False).encode())
    if size > MAX_CONFIG_BYTES:
        return None, f"{size:,} bytes as JSON; a config.json may have at most {MAX_CONFIG_BYTES:,}"
    return None


def check_document(config: Any) -> dict[str, Any]:
    """`config`, if `document_problem` finds nothing (a ValueError naming the key otherwise): the
    job spec's `hf_config` validator."""
    problem = document_problem(config)
    if problem is not None:
        key, why = problem
        raise ValueError(f"{key}: {why}" if key else why)
    assert isinstance(config, dict)
    return config


@functools.cache
def _checker(name: str) -> type[BaseModel]:
    """A model of the one shape field `name`, with its bounds (`ModelConfig`'s declaration)."""
    info = ModelConfig.model_fields[name]
    assert info.annotation is not None, "unannotated ModelConfig field"
    return create_model(f"HFConfig_{name}", __config__=ConfigDict(strict=True), value=(info.annotation, info))


def _field_value(key: str, name: str, value: Any, loc: Loc) -> tuple[Any, list[SpecProblem]]:
    """`value` checked as field `name` (strictly: "4096" and true are not integers)."""
    try:
        return _checker(name).model_validate({"value": value}).model_dump()["value"], []
    except ValidationError as exc:
        msg = exc.errors()[0]["msg"]
        return None, [SpecProblem((*loc, key), f"{name} {json.dumps(value)[:40]}: {msg}")]


def _positive_int(key: str, value: Any, loc: Loc) -> tuple[int | None, list[SpecProblem]]:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value, []
    return None, [SpecProblem((*loc, key), f"must be a positive integer, not {json.dumps(value)[:40]}")]


def read_hf_config(config: Any, *, loc: Loc = LOC) -> HFShape:
    """The shape a Hugging Face config describes; SpecError naming each key at fault (see the module)."""
    problem = document_problem(config)
    if problem is not None:
        key, why = problem
        raise SpecError([SpecProblem((*loc, key) if key else loc, why)])
    assert isinstance(config, dict)
    model_type = config.get("model_type")
    arch = ARCHS[model_type].keys if isinstance(model_type, str) and model_type in ARCHS else None
    if isinstance(model_type, str) and model_type in REFUSED:
        raise SpecError([SpecProblem((*loc, "model_type"), f"model_type {model_type!r}: {REFUSED[model_type]}")])
    if arch is None:
        what = "no model_type" if model_type is None else f"model_type {json.dumps(model_type)[:60]}"
        raise SpecError(
            [SpecProblem((*loc, "model_type"), f"{what}: the hf family builds {', '.join(SUPPORTED)} (from their config.json)")]
        )
    assert isinstance(model_type, str)

    problems: list[SpecProblem] = []
    fields: dict[str, Any] = {}
    source: dict[str, str] = {}
    must_hold = {**COMMON_MUST_HOLD, **arch.must_hold}
    reads = {k: v for k, v in {**READ, **arch.reads}.items() if k not in arch.ignored}
    rope_parameters: Any = None
    for key, value in config.items():
        if key in reads or key in LIMITS or key in METADATA or key in arch.ignored:
            continue
        if key == "rope_parameters":
            rope_parameters = value
        elif key in must_hold:
            test, expected = must_hold[key]
            if not test(value):
                problems.append(SpecProblem((*loc, key), f"must be {expected}, not {json.dumps(value)[:60]}"))
        else:
            problems.append(
                SpecProblem(
                    (*loc, str(key)[:100]),
                    f"not a key the hf family knows for model_type {model_type!r}: it might change the model, so it is "
                    "refused rather than ignored (remove it to run the shape without it)",
                )
            )
    for key in (*REQUIRED, *arch.required):
        if config.get(key) is None:
            problems.append(SpecProblem((*loc, key), f"missing: a {model_type} config.json names its {reads[key]} here"))
    for key, name in reads.items():
        value = config.get(key)
        if value is None and key in config:  # null: what null means for this key, else the default
            value = arch.null_reads.get(key)
        if value is None:  # absent or null: the config class's default, if it has one
            value = arch.read_defaults.get(key)
        if value is None:
            continue
        if key in arch.reads and key not in arch.zero_reads:  # a model_type's own shape keys say what it is
            _, bad = _positive_int(key, value, loc)
            if bad:
                problems += bad
                continue
        checked, bad = _field_value(key, name, value, loc)
        problems += bad
        if not bad:
            fields[name], source[name] = checked, key
    if rope_parameters is not None:
        theta = rope_parameters.get("rope_theta") if isinstance(rope_parameters, dict) else None
        if not isinstance(rope_parameters, dict):
            problems.append(SpecProblem((*loc, "rope_parameters"), "must be an object (rope_theta, rope_type)"))
        elif theta is not None and "rope_theta" not in config:
            checked, bad = _field_value("rope_parameters", "rope_theta", theta, loc)
            problems += bad
            if not bad:
                fields["rope_theta"], source["rope_theta"] = checked, "rope_parameters"
    if "num_kv_heads" not in fields and "num_heads" in fields:
        fields["num_kv_heads"] = arch.kv_heads_default or fields["num_heads"]  # the config class's default
        source["num_kv_heads"] = "num_key_value_heads"
    if arch.cross_checks is not None:
        problems += [SpecProblem((*loc, key), why) for key, why in arch.cross_checks(config, fields)]

    limits: list[tuple[str, int]] = []
    positions = config.get("max_position_embeddings", arch.max_positions_default)
    if positions is not None:
        value, bad = _positive_int("max_position_embeddings", positions, loc)
        problems += bad
        if value is not None:
            limits.append(("max_position_embeddings", value))
    if arch.window_key is not None:
        window = config.get(arch.window_key, arch.sliding_window_default)
        if window is not None:
            value, bad = _positive_int(arch.window_key, window, loc)
            problems += bad
            if value is not None:
                limits.append((arch.window_key, value))
    if problems:
        raise SpecError(problems)

    fields.update(
        family="hf",
        model_type=model_type,
        head_dim=fields.get("head_dim"),
        mlp="swiglu",
        num_experts=fields.get("num_experts", 0),
        num_shared_experts=fields.get("num_shared_experts", 0),
        first_dense_layers=fields.get("first_dense_layers", 0),
        **{name: fields.get(name, 0) for name in MLA_FIELDS},
        attention_bias=arch.attention_bias,
        tie_embeddings=fields.get("tie_embeddings", arch.tie_default),
        norm_eps=fields.get("norm_eps", arch.norm_eps_default),
        rope_theta=fields.get("rope_theta", arch.rope_theta_default),
    )
    source.setdefault("attention_bias", "model_type")
    source.setdefault("model_type", "model_type")
    source.setdefault("num_experts", "model_type")
    for name in ("tie_embeddings", "norm_eps", "rope_theta"):
        source.setdefault(name, next(k for k, v in READ.items() if v == name))
    return HFShape(model_type=model_type, fields=fields, source=source, seq_limit=min(limits, key=lambda kv: kv[1]) if limits else None)
