"""A Hugging Face `config.json` as the workload's model: the published Llama-3-8B and Qwen2.5-7B
configs resolve to their presets' exact parameter counts and to the same workload (and key) as
the equivalent explicit fields; a bad config is refused naming its key — an unknown model_type,
heads not divisible by KV heads, 10⁶ layers, a 200-level nesting, an oversize file, an unknown key."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from parallab.core.families import param_counts
from parallab.core.hf_config import MAX_CONFIG_BYTES, METADATA, SUPPORTED, read_hf_config
from parallab.core.jobs import ResolvedJob, resolve_job
from parallab.core.model import PRESETS
from parallab.core.problems import SpecError
from parallab.core.spec import JobSpec, key_fields, workload_fields
from tests.core.hf_configs import (
    DEEPSEEK_V2_LITE,
    LLAMA_3_1_8B,
    LLAMA_3_8B,
    MISTRAL_7B_V0_1,
    MISTRAL_7B_V0_3,
    MIXTRAL_8X7B,
    QWEN2_5_7B,
    TINY_DEEPSEEK_V2,
    TINY_MIXTRAL,
    nested,
)

LLAMA_3_8B_PARAMS = 8_030_261_248
QWEN2_5_7B_PARAMS = 7_615_616_512
MIXTRAL_8X7B_PARAMS = 46_702_792_704


def resolve(config: Any, strategy: str = "fsdp", world: int = 8, **workload: Any) -> ResolvedJob:
    spec = {"workload": {"hf_config": config, **workload}, "strategy": {"name": strategy, "world_size": world}}
    return resolve_job(JobSpec.model_validate(spec))


def refusal(config: Any, **workload: Any) -> dict[str, str]:
    """{location: message} of each problem the config's job is refused with."""
    with pytest.raises(SpecError) as caught:
        resolve(config, **workload)
    return {".".join(map(str, p.loc)): p.msg for p in caught.value.problems}


@pytest.mark.parametrize(
    ("config", "preset", "count"), [(LLAMA_3_8B, "llama-3-8b", LLAMA_3_8B_PARAMS), (QWEN2_5_7B, "qwen2.5-7b", QWEN2_5_7B_PARAMS)]
)
def test_a_published_config_is_its_preset_in_the_hf_family_with_the_pinned_count(config, preset, count):
    job = resolve(config)
    assert job.model.family == "hf"
    assert param_counts(job.model).total == count == param_counts(PRESETS[preset].config).total
    expected = PRESETS[preset].config.model_dump()
    got = job.model.model_dump()
    assert {k: v for k, v in got.items() if k not in ("family", "seq_len")} == {
        k: v for k, v in expected.items() if k not in ("family", "seq_len")
    }


def test_the_qwen2_config_has_its_biases_norm_epsilon_and_rotary_base():
    shape = read_hf_config(QWEN2_5_7B)
    assert shape.fields["attention_bias"] is True and shape.fields["num_kv_heads"] == 4
    assert (shape.fields["norm_eps"], shape.fields["rope_theta"]) == (1e-6, 1e6)
    assert shape.seq_limit == ("max_position_embeddings", 131072)  # sliding_window: unused without use_sliding_window


def test_a_config_resolves_to_the_same_workload_and_key_as_the_explicit_fields():
    """The config is resolved away: the stored spec (hence the leaderboard key) is the explicit one's."""
    from_file = resolve(LLAMA_3_8B, model="tiny")
    fields = {k: v for k, v in read_hf_config(LLAMA_3_8B).fields.items()}
    explicit = resolve_job(JobSpec.model_validate({"workload": {"model": "tiny", **fields}, "strategy": {"name": "fsdp", "world_size": 8}}))
    assert from_file.spec == explicit.spec
    assert key_fields(from_file.workload_document()) == key_fields(explicit.workload_document())
    document = from_file.workload_document()
    assert "hf_config" not in document and "hf_config" not in from_file.spec.model_dump(mode="json")["workload"]
    assert resolve_job(from_file.spec) == from_file  # it resubmits as the same job


def test_fields_given_beside_the_config_override_it():
    job = resolve(LLAMA_3_8B, num_layers=2, hidden_size=256, ffn_hidden_size=896)
    assert (job.model.num_layers, job.model.hidden_size, job.model.ffn_hidden_size) == (2, 256, 896)
    assert (job.model.num_heads, job.model.kv_heads, job.model.vocab_size) == (32, 8, 128256)


def test_the_sequence_is_the_workloads_within_the_configs_positions():
    assert resolve(LLAMA_3_8B, model="tiny").model.seq_len == 64  # the preset's
    assert resolve({**LLAMA_3_8B, "max_position_embeddings": 32}, model="tiny").model.seq_len == 32  # cut to the config's
    found = refusal(LLAMA_3_8B, seq_len=16384)
    assert "max_position_embeddings 8192" in found["workload.seq_len"]


def test_rotary_scaling_and_metadata_are_ignored_an_unknown_key_is_refused():
    assert read_hf_config(LLAMA_3_1_8B).fields == read_hf_config(LLAMA_3_8B).fields
    assert {"architectures", "torch_dtype", "transformers_version", "rope_scaling"} <= METADATA
    found = refusal({**LLAMA_3_8B, "quantization_config": {"bits": 4}})
    assert "not a key the hf family knows for model_type 'llama'" in found["workload.hf_config.quantization_config"]


def test_a_mistral_config_is_llama_while_its_window_covers_the_sequence():
    assert read_hf_config(MISTRAL_7B_V0_3).seq_limit == ("max_position_embeddings", 32768)
    job = resolve(MISTRAL_7B_V0_3, model="tiny")
    assert (job.model.family, job.model.attention_bias, job.model.vocab_size, job.model.kv_heads) == ("hf", False, 32768, 8)
    assert resolve(MISTRAL_7B_V0_1, model="tiny").model.seq_len == 64  # a 4,096-token window over 64 tokens: no window
    found = refusal(MISTRAL_7B_V0_1, seq_len=8192)
    assert "sliding_window 4096" in found["workload.seq_len"]


@pytest.mark.parametrize(
    ("change", "key", "words"),
    [
        ({"hidden_act": "gelu"}, "hidden_act", 'must be "silu"'),
        ({"attention_bias": True}, "attention_bias", "o_proj"),
        ({"mlp_bias": True}, "mlp_bias", "must be false"),
        ({"attention_dropout": 0.1}, "attention_dropout", "must be 0"),
        ({"head_dim": 7}, "head_dim", "head dim (7) must be even"),
        ({"hidden_size": "4096"}, "hidden_size", 'hidden_size "4096": Input should be a valid integer'),
        ({"num_hidden_layers": True}, "num_hidden_layers", "valid integer"),
        ({"tie_word_embeddings": "no"}, "tie_word_embeddings", "valid boolean"),
        ({"vocab_size": None}, "vocab_size", "missing"),
    ],
)
def test_a_key_that_would_build_another_model_is_refused_by_name(change, key, words):
    found = refusal({**LLAMA_3_8B, **change})
    assert words in found[f"workload.hf_config.{key}"], found


def test_a_head_dim_of_its_own_is_a_field_and_one_equal_to_the_derived_width_is_none():
    """Llama's config may name head_dim (Llama 3.2's, Qwen3's): heads of that width, q and o
    projections heads·head_dim wide; a head_dim that is hidden_size / num_heads is no width of its own."""
    narrow = resolve({**LLAMA_3_8B, "head_dim": 64}).model
    assert (narrow.head_dim, narrow.head_width, narrow.model_type) == (64, 64, None)
    q_and_o = 2 * 4096 * (4096 - 32 * 64)
    kv = 2 * 4096 * 8 * (128 - 64)
    assert param_counts(narrow).total == LLAMA_3_8B_PARAMS - 32 * (q_and_o + kv)
    assert resolve({**LLAMA_3_8B, "head_dim": 128}).model == resolve(LLAMA_3_8B).model


def test_a_qwen2_sliding_window_is_refused():
    found = refusal({**QWEN2_5_7B, "use_sliding_window": True})
    assert "full attention" in found["workload.hf_config.use_sliding_window"]


# ---- Mixtral: Mistral's attention with MoE blocks ----


def test_a_mixtral_config_reads_its_experts_and_mixtrals_defaults():
    shape = read_hf_config(MIXTRAL_8X7B)
    assert (shape.fields["num_experts"], shape.fields["top_k"], shape.fields["ffn_hidden_size"]) == (8, 2, 14336)
    assert (shape.source["num_experts"], shape.source["top_k"]) == ("num_local_experts", "num_experts_per_tok")
    assert (shape.fields["num_shared_experts"], shape.fields["first_dense_layers"], shape.fields["attention_bias"]) == (0, 0, False)
    assert shape.seq_limit == ("max_position_embeddings", 32768)  # sliding_window null: no window
    # MixtralConfig's defaults where the file is silent: 8 experts, top-2, 8 KV heads, eps 1e-5, base 10⁶
    bare = read_hf_config(
        {
            k: v
            for k, v in MIXTRAL_8X7B.items()
            if k not in ("num_local_experts", "num_experts_per_tok", "num_key_value_heads", "rms_norm_eps", "rope_theta")
        }
    )
    assert {k: bare.fields[k] for k in ("num_experts", "top_k", "num_kv_heads", "norm_eps", "rope_theta")} == {
        "num_experts": 8,
        "top_k": 2,
        "num_kv_heads": 8,
        "norm_eps": 1e-5,
        "rope_theta": 1e6,
    }
    assert read_hf_config({**MIXTRAL_8X7B, "num_local_experts": None}).fields["num_experts"] == 8, "null is the default, not dense"


def test_a_mixtral_window_bounds_the_sequence_as_mistrals_does():
    found = refusal({**TINY_MIXTRAL, "sliding_window": 16}, seq_len=32)
    assert "sliding_window 16" in found["workload.seq_len"]
    assert resolve({**TINY_MIXTRAL, "sliding_window": 16}, model="tiny").model.seq_len == 16


def test_the_router_loss_weight_is_ignored_while_the_router_settings_that_change_the_step_are_refused():
    """router_aux_loss_coef weighs a loss the model adds only with output_router_logits: unused, ignored."""
    assert read_hf_config({**MIXTRAL_8X7B, "router_aux_loss_coef": 0.5}).fields == read_hf_config(MIXTRAL_8X7B).fields
    assert read_hf_config({**MIXTRAL_8X7B, "router_jitter_noise": 0.0}).fields == read_hf_config(MIXTRAL_8X7B).fields
    found = refusal({**MIXTRAL_8X7B, "router_jitter_noise": 0.01, "output_router_logits": True})
    assert "must be 0 (jitter" in found["workload.hf_config.router_jitter_noise"]
    assert "load-balancing loss" in found["workload.hf_config.output_router_logits"]


@pytest.mark.parametrize(
    ("change", "key", "words"),
    [
        ({"num_experts_per_tok": 5}, "num_experts_per_tok", "top_k 5 must be between 1 and num_experts 4"),
        ({"num_local_experts": 0}, "num_local_experts", "must be a positive integer, not 0"),
        ({"num_local_experts": "8"}, "num_local_experts", 'must be a positive integer, not "8"'),
        ({"num_experts_per_tok": 0}, "num_experts_per_tok", "must be a positive integer, not 0"),
        ({"num_local_experts": 2048}, "num_local_experts", "num_experts 2048: Input should be less than or equal to 1024"),
        ({"moe_layer_freq": 2}, "moe_layer_freq", "not a key the hf family knows for model_type 'mixtral'"),
        ({"attention_bias": False}, "attention_bias", "not a key the hf family knows for model_type 'mixtral'"),
    ],
)
def test_a_bad_mixtral_config_is_refused_naming_its_key(change, key, words):
    found = refusal({**TINY_MIXTRAL, **change}, model="tiny")
    assert words in found[f"workload.hf_config.{key}"], found


def test_the_experts_keys_are_mixtrals_only():
    found = refusal({**LLAMA_3_8B, "num_local_experts": 8})
    assert "not a key the hf family knows for model_type 'llama'" in found["workload.hf_config.num_local_experts"]


# ---- DeepSeek-V2: latent attention, shared experts, dense first layers ----

DEEPSEEK_V2_LITE_PARAMS = 15_706_484_224


def test_the_deepseek_v2_lite_config_is_its_preset_with_the_pinned_count():
    """The published config (q_lora_rank null: one q_proj; yarn rope_scaling ignored as every
    rotary variant is; the router's unused groups and auxiliary-loss weight ignored) is the preset."""
    job = resolve(DEEPSEEK_V2_LITE)
    assert param_counts(job.model).total == DEEPSEEK_V2_LITE_PARAMS == param_counts(PRESETS["deepseek-v2-lite"].config).total
    got, expected = job.model.model_dump(), PRESETS["deepseek-v2-lite"].config.model_dump()
    assert {k: v for k, v in got.items() if k != "seq_len"} == {k: v for k, v in expected.items() if k != "seq_len"}
    assert (job.model.q_lora_rank, job.model.moe_ffn_hidden_size, job.model.first_dense_layers) == (0, 1408, 1)


def test_an_absent_q_lora_rank_is_the_librarys_default_compression():
    """Absent is DeepseekV2Config's default (1536: DeepSeek-V2's compressed query), null is none."""
    config = {k: v for k, v in DEEPSEEK_V2_LITE.items() if k != "q_lora_rank"}
    assert read_hf_config(config).fields["q_lora_rank"] == 1536
    assert read_hf_config(DEEPSEEK_V2_LITE).fields["q_lora_rank"] == 0


def test_a_config_transformers_saves_for_deepseek_reads_back_as_the_same_shape():
    """head_dim (the library's rotary width, not hidden / heads) and qk_head_dim are derived, not read."""
    import transformers

    keys = set(transformers.DeepseekV2Config.__dataclass_fields__)  # the file's keys the class takes (not auto_map, seq_aux, ...)
    saved = json.loads(transformers.DeepseekV2Config(**{k: v for k, v in TINY_DEEPSEEK_V2.items() if k in keys}).to_json_string())
    assert saved["head_dim"] == 8 and saved["qk_head_dim"] == 24
    assert read_hf_config(saved).fields == read_hf_config(TINY_DEEPSEEK_V2).fields


@pytest.mark.parametrize(
    ("change", "key", "words"),
    [
        ({"num_key_value_heads": 8}, "num_key_value_heads", "num_kv_heads 8 must equal num_heads 16"),
        ({"topk_method": "group_limited_greedy", "n_group": 8, "topk_group": 3}, "topk_method", '"greedy"'),
        ({"norm_topk_prob": True}, "norm_topk_prob", "not renormalised"),
        ({"routed_scaling_factor": 16.0}, "routed_scaling_factor", "unscaled"),
        ({"scoring_func": "sigmoid"}, "scoring_func", '"softmax"'),
        ({"n_shared_experts": 0}, "n_shared_experts", "must be a positive integer"),
        ({"num_experts_per_tok": None}, "num_experts_per_tok", "missing"),
        ({"qk_rope_head_dim": 63}, "qk_rope_head_dim", "must be even"),
        ({"first_k_dense_replace": 27}, "first_k_dense_replace", "leaves no MoE block"),
        ({"kv_lora_rank": 1 << 20}, "kv_lora_rank", "less than or equal"),
    ],
)
def test_a_bad_deepseek_config_is_refused_naming_its_key(change, key, words):
    found = refusal({**DEEPSEEK_V2_LITE, **change})
    assert words in found[f"workload.hf_config.{key}"], found


def test_deepseek_v3_is_refused_saying_why():
    found = refusal({**DEEPSEEK_V2_LITE, "model_type": "deepseek_v3"})
    assert "DeepSeek-V3 is not built: its router" in found["workload.hf_config.model_type"]


def test_deepseek_resolves_under_tensor_parallelism_and_is_refused_with_sequence_parallelism():
    assert resolve(TINY_DEEPSEEK_V2, strategy="tp", world=2).model.is_mla
    tp = {"name": "tp", "world_size": 2, "options": {"sequence_parallel": True}}
    spec = {"workload": {"hf_config": TINY_DEEPSEEK_V2}, "strategy": tp}
    with pytest.raises(SpecError) as caught:
        resolve_job(JobSpec.model_validate(spec))
    found = {".".join(map(str, p.loc)): p.msg for p in caught.value.problems}
    assert "not composed with multi-head latent attention" in found["strategy.options.sequence_parallel"], found
    found = refusal({**TINY_DEEPSEEK_V2, "n_routed_experts": 4, "first_k_dense_replace": 2})
    assert "leaves no MoE block" in found["workload.hf_config.first_k_dense_replace"]


# ---- the refusals the brief lists ----


def test_an_unknown_model_type_is_refused_listing_the_supported_ones():
    found = refusal({**LLAMA_3_8B, "model_type": "gpt_neox"})
    msg = found["workload.hf_config.model_type"]
    assert 'model_type "gpt_neox"' in msg and all(name in msg for name in SUPPORTED)
    assert SUPPORTED == ("llama", "mistral", "qwen2", "mixtral", "deepseek_v2", "gemma2", "phi3")
    assert "no model_type" in refusal({k: v for k, v in LLAMA_3_8B.items() if k != "model_type"})["workload.hf_config.model_type"]


def test_heads_not_divisible_by_kv_heads_is_refused_at_the_configs_key():
    found = refusal({**LLAMA_3_8B, "num_key_value_heads": 6})
    assert found == {"workload.hf_config.num_key_value_heads": "num_heads 32 is not divisible by num_kv_heads 6"}
    # a KV-head count given as a field beside the config is located at that field
    assert "workload.num_kv_heads" in refusal(LLAMA_3_8B, num_kv_heads=6)


def test_a_million_layers_is_refused_by_the_shape_bounds_naming_the_key():
    found = refusal({**LLAMA_3_8B, "num_hidden_layers": 10**6})
    assert found == {"workload.hf_config.num_hidden_layers": "num_layers 1000000: Input should be less than or equal to 1024"}


def test_a_200_level_nesting_is_refused_naming_the_key():
    config = {**LLAMA_3_8B, "rope_scaling": nested(200)}
    with pytest.raises(SpecError) as caught:
        read_hf_config(config)
    (problem,) = caught.value.problems
    assert problem.loc == ("workload", "hf_config", "rope_scaling") and "nested deeper than 32 levels" in problem.msg
    with pytest.raises(ValidationError) as invalid:  # the spec refuses it before resolution
        JobSpec.model_validate({"workload": {"hf_config": config}, "strategy": {"name": "fsdp", "world_size": 8}})
    (error,) = invalid.value.errors()
    assert error["loc"] == ("workload", "hf_config") and "rope_scaling: nested deeper than 32 levels" in error["msg"]


def test_an_oversize_config_is_refused():
    config = {**LLAMA_3_8B, "architectures": ["x" * MAX_CONFIG_BYTES]}
    assert len(json.dumps(config)) > MAX_CONFIG_BYTES
    with pytest.raises(SpecError) as caught:
        read_hf_config(config)
    (problem,) = caught.value.problems
    assert problem.loc == ("workload", "hf_config") and f"at most {MAX_CONFIG_BYTES:,}" in problem.msg
    with pytest.raises(ValidationError) as invalid:
        JobSpec.model_validate({"workload": {"hf_config": config}, "strategy": {"name": "fsdp", "world_size": 8}})
    assert invalid.value.errors()[0]["loc"] == ("workload", "hf_config")


def test_the_config_is_an_input_not_a_workload_field():
    """No flag, no form input and no key of its own: it is resolved into the shape fields."""
    assert "hf_config" not in {f.name for f in workload_fields()}
    assert "hf_config" not in JobSpec.model_validate({"strategy": {"name": "single"}}).model_dump()["workload"]
