"""The leaderboard's workload key: derived from the core's declarations, hashed as it always was."""

from __future__ import annotations

import pytest

from backend.services.ingest import shape_key, workload_key
from backend.services.leaderboard import workload_label
from parallab.core.spec import KEY_NEUTRAL, KEY_NEUTRAL_AS, WORKLOAD_KEY_FIELDS

# A `tiny` DDP run's workload block, as the worker writes it.
TINY = {
    "model": "tiny",
    "steps": 10,
    "warmup_steps": 2,
    "precision": "fp32",
    "activation_checkpointing": "none",
    "grad_accumulation_steps": 1,
    "lr": 0.001,
    "seed": 0,
    "vocab_size": 256,
    "hidden_size": 64,
    "num_layers": 4,
    "num_heads": 4,
    "ffn_hidden_size": 256,
    "seq_len": 64,
    "num_experts": 0,
    "top_k": 2,
    "capacity_factor": 1.25,
    "norm_eps": 1e-05,
    "rope_theta": 10000.0,
    "global_batch_size": 8,
}


def test_a_known_workload_keeps_its_stored_key() -> None:
    # Computed by the key function before the fields moved into parallab.core: keys already in
    # the database must keep matching new runs of the same workload.
    assert workload_key(TINY) == "62751979ba356666b11be7942c48f4dd"


def test_fields_added_later_keep_stored_keys_at_their_neutral_value() -> None:
    """A run written today carries the architecture fields added after `TINY` was stored (GQA, MLP
    kind, tied head, ...); at the values every stored run had, the key is the stored one."""
    assert set(KEY_NEUTRAL) == {
        "data",
        "compile",
        "family",
        "module",
        "mlp",
        "tie_embeddings",
        "attention_bias",
        "num_shared_experts",
        "first_dense_layers",
        "kv_lora_rank",
        "q_lora_rank",
        "qk_nope_head_dim",
        "qk_rope_head_dim",
        "v_head_dim",
        "model_type",
        "head_dim",
    }
    assert KEY_NEUTRAL_AS == {"num_kv_heads": "num_heads", "moe_ffn_hidden_size": "ffn_hidden_size"}
    today = {**TINY, **KEY_NEUTRAL, "num_kv_heads": TINY["num_heads"], "moe_ffn_hidden_size": None}
    assert workload_key(today) == workload_key({**today, "moe_ffn_hidden_size": TINY["ffn_hidden_size"]})
    assert workload_key(today) == workload_key(TINY) == "62751979ba356666b11be7942c48f4dd"


NEW_VALUES = {
    "family": "hf",
    "num_kv_heads": 2,
    "mlp": "gelu",
    "tie_embeddings": True,
    "attention_bias": True,
    "num_shared_experts": 1,
    "first_dense_layers": 1,
    "compile": True,
    "module": "examples.lab_model:build",
    "moe_ffn_hidden_size": 32,
    "kv_lora_rank": 32,
    "q_lora_rank": 16,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 16,
    "model_type": "gemma2",
    "head_dim": 32,
}
"""A value off the neutral one for each field added later."""


@pytest.mark.parametrize("change", [{"steps": 99}, {"seed": 3}, {"lr": 0.1}, {"warmup_steps": 0}, {"norm_eps": 1e-6}, {"rope_theta": 1.0}])
def test_what_does_not_change_the_measurement_does_not_change_the_key(change) -> None:
    assert workload_key({**TINY, **change}) == workload_key(TINY)


CHANGED: dict[str, object] = {"precision": "bf16", "activation_checkpointing": "full", "data": "text"}
"""A value other than TINY's for each keyed field that is not a number."""


@pytest.mark.parametrize("name", WORKLOAD_KEY_FIELDS)
def test_every_keyed_field_splits_the_group(name) -> None:
    changed = {**TINY, name: NEW_VALUES[name] if name in NEW_VALUES else CHANGED[name] if name in CHANGED else TINY[name] * 2 + 1}
    assert workload_key(changed) != workload_key(TINY)


def test_the_data_field_at_its_default_keeps_the_stored_keys() -> None:
    # A document older than the field and a new one with random data are the same workload.
    assert workload_key({**TINY, "data": "random"}) == workload_key(TINY) == "62751979ba356666b11be7942c48f4dd"
    assert shape_key({**TINY, "data": "random"}) == shape_key(TINY)
    assert shape_key({**TINY, "data": "text"}) != shape_key(TINY)


def test_a_text_or_compiled_workload_says_so_in_its_label_and_the_defaults_stay_unlabelled() -> None:
    assert workload_label({"workload": {**TINY, "data": "text"}}, "tiny").endswith("batch 8 · text data · fp32")
    assert "data" not in workload_label({"workload": {**TINY, "data": "random"}}, "tiny")
    assert workload_label({"workload": {**TINY, "compile": True}}, "tiny", recipe=False).endswith("batch 8 · compiled")
    assert "compiled" not in workload_label({"workload": {**TINY, "compile": False}}, "tiny")
