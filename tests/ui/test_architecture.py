"""A run's model architecture in one line: the description of each kind of shape (multi-head,
grouped-query, GELU, MoE with shared experts, the hf family, a block stored before the newer shape
fields existed), on the run page and as a compare row that marks runs on different shapes."""

from __future__ import annotations

import re

import pytest

from backend.services import compare as compare_service
from backend.services.architecture import describe, document_architecture, fmt_params, shape_of
from parallab.core.families import param_counts
from parallab.core.model import PRESETS
from tests.ui.factories import make_document, store_run

NEWER_FIELDS = (
    "family",
    "num_kv_heads",
    "mlp",
    "tie_embeddings",
    "attention_bias",
    "num_shared_experts",
    "first_dense_layers",
    "moe_ffn_hidden_size",
    "kv_lora_rank",
    "q_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
    "model_type",
    "head_dim",
)


def block(preset: str, **overrides: object) -> dict[str, object]:
    """A resolved workload block as a result stores it: the preset's every shape field, overridden."""
    return {"model": preset, "steps": 10, "precision": "fp32", **PRESETS[preset].config.model_dump(), **overrides}


def test_tiny_is_multi_head_swiglu_with_its_exact_parameter_count():
    line = describe(block("tiny"))
    total = param_counts(PRESETS["tiny"].config).total
    assert line == f"tiny shape · 4 layers · h 64 · 4 heads (MHA) · SwiGLU ffn 256 · vocab 256 · untied · {fmt_params(total)} params"


def test_llama_3_8b_names_its_kv_heads_as_gqa():
    line = describe(block("llama-3-8b"))
    assert line == (
        "llama-3-8b shape · 32 layers · h 4096 · 32 heads / 8 KV (GQA) · SwiGLU ffn 14336 · vocab 128256 · untied · 8.03 B params"
    )


def test_one_kv_head_is_mqa_and_fewer_kv_heads_fewer_parameters():
    mha, mqa = describe(block("tiny", num_kv_heads=4)), describe(block("tiny", num_kv_heads=1))
    assert "4 heads (MHA)" in mha and "4 heads / 1 KV (MQA)" in mqa
    assert mha.rsplit(" · ", 1)[1] != mqa.rsplit(" · ", 1)[1], "K/V heads change the parameter count"


def test_gelu_tied_and_biased_shapes_say_so():
    line = describe(block("small", mlp="gelu", ffn_hidden_size=1024, tie_embeddings=True, attention_bias=True))
    assert "GELU ffn 1024" in line and " · tied · " in line and "qkv bias" in line
    assert "small shape, custom mlp, tie_embeddings, attention_bias" in line


def test_moe_with_shared_experts_and_dense_first_layers():
    line = describe(block("tiny", num_experts=8, top_k=2, num_shared_experts=1, first_dense_layers=1))
    assert "8 experts top-2 (+1 shared), first 1 dense" in line
    plain = describe(block("mixtral-8x7b"))
    assert "8 experts top-2 · " in plain and "shared" not in plain and "46.7 B params" in plain


def test_deepseek_v2_lite_says_latent_attention_and_its_narrow_experts():
    line = describe(block("deepseek-v2-lite"))
    assert "hf family" in line and "16 heads (MLA: latent 512)" in line and "KV" not in line
    assert "SwiGLU ffn 10944 · 64 experts top-6 of 1408 (+2 shared), first 1 dense" in line and "15.7 B params" in line


def test_hf_family_is_named():
    line = describe(block("qwen2.5-7b", family="hf"))
    assert "hf family" in line and "28 heads / 4 KV (GQA)" in line and "qkv bias" in line
    assert "hf family" not in describe(block("qwen2.5-7b")), "the default family is not spelled out"


def test_a_block_stored_before_the_newer_fields_reads_at_their_neutral_values():
    old = {k: v for k, v in block("llama-8b").items() if k not in NEWER_FIELDS}
    cfg = shape_of(old)
    assert (cfg.family, cfg.kv_heads, cfg.mlp, cfg.tie_embeddings, cfg.attention_bias) == ("parallab", 32, "swiglu", False, False)
    assert describe(old) == describe(block("llama-8b"))
    assert "32 heads (MHA)" in describe(old)


def test_a_spec_naming_only_a_preset_is_the_preset():
    assert describe({"model": "llama-3-8b"}) == describe(block("llama-3-8b"))


def test_the_stored_parameter_count_is_the_one_shown():
    doc = {"workload": block("tiny"), "prediction": {"params_total": 123_456_789}}
    line = document_architecture(doc)
    assert line is not None and line.endswith("123 M params")
    assert document_architecture(None, {"workload": {"model": "tiny"}}) == describe(block("tiny"))
    assert document_architecture(None, None) is None


@pytest.mark.parametrize("kind", ["collectives", "calibrate"])
def test_a_job_kind_that_trains_nothing_has_no_architecture_line(kind):
    """Its workload only sizes messages or GEMMs: no model line, from the document or the spec."""
    workload = block("tiny")
    assert document_architecture({"strategy": {"name": kind, "world_size": 2}, "workload": workload}) is None
    assert document_architecture(None, {"strategy": {"name": kind, "world_size": 2}, "workload": {"model": "tiny"}}) is None
    trained = {"strategy": {"name": "ddp", "world_size": 2}, "workload": workload}
    assert document_architecture(trained) == describe(workload), "a training run keeps its line"


def test_an_unreadable_shape_says_which_field():
    assert "num_heads" in describe(block("tiny", num_heads=5))
    assert "no known preset" in describe({"model": "nope", "hidden_size": 64})


def test_parameter_counts_read_to_three_figures():
    assert [fmt_params(n) for n in (812, 295_000, 1_048_576, 8_030_261_248, 405_853_388_800)] == [
        "812",
        "295 K",
        "1.05 M",
        "8.03 B",
        "406 B",
    ]


@pytest.fixture(scope="module")
def shaped_runs(session_factory):
    """Two ddp runs on tiny, one with grouped-query attention (2 K/V heads for its 4 query heads)."""
    gqa = make_document(name="gqa")
    gqa = gqa.model_copy(update={"workload": {**gqa.workload, "num_kv_heads": 2}})
    with session_factory() as s:
        return store_run(s, make_document(name="mha")), store_run(s, gqa)


def test_the_run_page_shows_the_architecture(client, shaped_runs):
    mha, gqa = shaped_runs
    text = client.get(f"/runs/{gqa.id}").text
    line = re.search(r'<p class="small" id="run-architecture"[^>]*>Architecture: ([^<]+)</p>', text)
    assert line, "the run page has an architecture line"
    assert "4 heads / 2 KV (GQA)" in line.group(1) and "tiny shape, custom num_kv_heads" in line.group(1)
    assert "4 heads (MHA)" in client.get(f"/runs/{mha.id}").text


def test_compare_shows_both_architectures_and_marks_the_difference(client, session_factory, shaped_runs):
    mha, gqa = shaped_runs
    with session_factory() as s:
        row = next(m for m in compare_service.compare(session=s, run_ids=[mha.id, gqa.id]).rows if m.key == "architecture")
        same = next(m for m in compare_service.compare(session=s, run_ids=[mha.id, mha.id]).rows if m.key == "architecture")
    assert row.differs and "4 heads (MHA)" in row.values[0] and "4 heads / 2 KV (GQA)" in row.values[1]
    assert same.values == [row.values[0]] and not same.differs
    text = client.get("/compare", params={"ids": [mha.id, gqa.id]}).text
    tr = re.search(r'<tr class="([^"]+)" data-metric="architecture">(.*?)</tr>', text, re.S)
    assert tr and tr.group(1) == "differs"
    cells = re.findall(r'<td class="num ([^"]*)">\s*<span class="v">([^<]*)</span>', tr.group(2))
    assert [c for c, _ in cells] == ["baseline", "differs-from-baseline"]
    assert "4 heads (MHA)" in cells[0][1] and "4 heads / 2 KV (GQA)" in cells[1][1]
