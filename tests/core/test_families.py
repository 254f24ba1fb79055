"""The `parallab` family's architecture options, pure: their rules name the field, the textbook
formulas follow them, and the planner plans the published shapes (no torch here; the module side
is tests/workers/test_families.py)."""

from __future__ import annotations

import pytest

from parallab.core.costs import numel
from parallab.core.families import family_of, model_flops_per_token, model_tensors, param_counts
from parallab.core.jobs import ResolvedJob, resolve_job
from parallab.core.model import PRESETS
from parallab.core.prediction import predict
from parallab.core.problems import SpecError
from parallab.core.spec import JobSpec


def job(strategy: str = "ddp", n: int = 2, options: dict | None = None, **workload) -> ResolvedJob:
    spec = {"workload": {"model": "tiny", **workload}, "strategy": {"name": strategy, "world_size": n, "options": options or {}}}
    return resolve_job(JobSpec.model_validate(spec))


def refused(strategy: str = "ddp", n: int = 2, options: dict | None = None, **workload) -> dict[tuple, str]:
    with pytest.raises(SpecError) as exc:
        job(strategy, n, options, **workload)
    return {tuple(p.loc): p.msg for p in exc.value.problems}


VARIANTS = [
    {},
    {"num_kv_heads": 2},
    {"num_kv_heads": 1, "mlp": "gelu", "attention_bias": True},
    {"tie_embeddings": True},
    {"num_experts": 4, "top_k": 2},
    {"num_experts": 4, "num_shared_experts": 2, "first_dense_layers": 1, "mlp": "gelu", "tie_embeddings": True},
]


@pytest.mark.parametrize("workload", VARIANTS, ids=lambda w: ",".join(f"{k}={v}" for k, v in w.items()) or "tiny")
def test_the_parameter_formula_counts_the_declared_tensors(workload):
    cfg = job(**workload).model
    assert param_counts(cfg).total == sum(numel(t.shape) for t in model_tensors(cfg))


def test_gqa_k_and_v_are_kv_heads_times_head_dim_wide_and_flops_follow():
    cfg = PRESETS["llama-3-8b"].config
    h, f, v, layers, kv = 4096, 14336, 128256, 32, 8 * 128
    assert (cfg.kv_heads, cfg.head_width, cfg.kv_dim) == (8, 128, kv)
    block = 2 * h * h + 2 * h * kv + 3 * h * f + 2 * h
    assert param_counts(cfg).total == layers * block + 2 * v * h + h
    # 6N (N: blocks, final norm and the head's matmul) + 12·L·h·T: QKᵀ and PV over every query head
    assert model_flops_per_token(cfg) == 6 * (layers * block + h + v * h) + 12 * layers * h * cfg.seq_len


def test_a_tied_head_is_counted_once_but_still_multiplies():
    untied, tied = job().model, job(tie_embeddings=True).model
    assert param_counts(untied).total - param_counts(tied).total == untied.vocab_size * untied.hidden_size
    assert model_flops_per_token(tied) == model_flops_per_token(untied)


def test_shared_experts_are_active_for_every_token_and_dense_first_layers_have_no_experts():
    base = job(num_experts=4).model
    shared = job(num_experts=4, num_shared_experts=1).model
    dense_first = job(num_experts=4, first_dense_layers=1).model
    mlp = 3 * base.hidden_size * base.ffn_hidden_size
    active = param_counts(shared).active_non_embedding - param_counts(base).active_non_embedding
    assert active == param_counts(shared).total - param_counts(base).total == base.num_layers * mlp
    assert param_counts(base).total - param_counts(dense_first).total == 4 * mlp + base.hidden_size * 4 - mlp
    assert [t.name for t in model_tensors(dense_first) if t.expert][0].startswith("layers.1.")


def test_heads_not_divisible_by_kv_heads_is_refused_naming_the_field():
    assert refused(num_kv_heads=3) == {("workload", "num_kv_heads"): "num_heads 4 is not divisible by num_kv_heads 3"}
    assert refused(model="llama-3-8b", num_kv_heads=6) == {("workload", "num_kv_heads"): "num_heads 32 is not divisible by num_kv_heads 6"}


def test_new_query_heads_keep_the_presets_grouping():
    assert job().model.num_kv_heads == 4 and job(num_kv_heads=4).model == job().model  # multi-head: as many as heads
    assert job(num_heads=8).model.num_kv_heads == 8  # multi-head stays multi-head
    assert job(model="llama-3-8b", num_heads=64).model.num_kv_heads == 16  # 4 query heads per K/V head
    assert job(model="llama-3-8b", num_heads=64, num_kv_heads=2).model.num_kv_heads == 2  # given: kept


@pytest.mark.parametrize("strategy", ["tp", "layout"])
def test_tp_needs_whole_kv_heads_per_rank(strategy):
    options = {"tp": 4} if strategy == "layout" else {}
    assert refused(strategy, 4, options, num_kv_heads=2) == {("workload", "num_kv_heads"): "kv heads (2) is not divisible by 4 (tp=4)"}
    halves = {"tp": 2} if strategy == "layout" else {}
    assert job(strategy, 2, halves, num_kv_heads=2).model.kv_heads == 2  # one K/V head per rank


@pytest.mark.parametrize(
    ("strategy", "options", "n", "what"), [("tp", {}, 2, "tensor parallelism (tp=2)"), ("pp", {}, 2, "one stage (pp=2)")]
)
def test_a_tied_head_is_refused_where_it_would_be_split_or_separated(strategy, options, n, what):
    problems = refused(strategy, n, options, tie_embeddings=True)
    assert list(problems) == [("workload", "tie_embeddings")] and problems[("workload", "tie_embeddings")].endswith(what)
    assert job("fsdp", 2, tie_embeddings=True).model.tie_embeddings


@pytest.mark.parametrize("field", ["num_shared_experts", "first_dense_layers"])
def test_moe_options_need_experts(field):
    assert refused(**{field: 1}) == {("workload", field): f"{field} needs an MoE model (num_experts is 0)"}


def test_the_planner_plans_llama_3_8b_at_its_true_size_and_fsdp_8_holds_16_psi_over_8():
    j = resolve_job(
        JobSpec.model_validate({"workload": {"model": "llama-3-8b", "precision": "bf16"}, "strategy": {"name": "fsdp", "world_size": 8}})
    )
    prediction = predict(j)
    psi = prediction["params_total"]
    assert psi == 8_030_261_248 and j.model.kv_heads == 8
    assert sum(prediction["model_state_bytes_per_rank"].values()) == 16 * psi // 8


def test_the_family_names_the_modules_strategies_use():
    family = family_of(PRESETS["tiny"].config)
    assert (family.blocks, family.first_stage, family.last_stage, family.attention) == (
        "layers",
        ("tok_embeddings",),
        ("norm", "output"),
        "attention",
    )
    plan = family.block_plan(PRESETS["tiny"].config, 0)
    assert plan["attention.wk"] == "colwise" and plan["attention.wo"] == "rowwise" and plan["feed_forward.w2"] == "rowwise"
    assert "feed_forward.w3" not in family.block_plan(job(mlp="gelu").model, 0)
    assert "feed_forward.w1" not in family.block_plan(job(num_experts=4).model, 0)  # tensor parallelism runs dense blocks


def test_a_published_architecture_scales_down_keeping_its_ratios():
    """`--layers 2 --hidden 256` on llama-3-8b: 32 heads over 8 KV heads and f = 3.5·h still."""
    full = PRESETS["llama-3-8b"].config
    small = job(model="llama-3-8b", num_layers=2, hidden_size=256)
    cfg = small.model
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.kv_heads) == (2, 256, full.num_heads, full.kv_heads)
    assert cfg.ffn_hidden_size * full.hidden_size == full.ffn_hidden_size * cfg.hidden_size
    assert small.model_label == "custom (from llama-3-8b)"
    qwen = job(model="qwen2.5-7b", num_layers=2, hidden_size=224).model  # 28 heads of 8: f/h = 18944/3584 rounded up to 8s
    assert qwen.attention_bias and qwen.kv_heads == 4 and qwen.ffn_hidden_size % 8 == 0
    assert 0 <= qwen.ffn_hidden_size - 18944 * 224 / 3584 < 8
    # a synthetic preset keeps Llama's SwiGLU rule (tiny at h = 4096: 11008, not 4·4096)
    assert job(hidden_size=4096, num_heads=32).model.ffn_hidden_size == 11008


def test_expert_parallel_all_to_all_runs_in_moe_blocks_only():
    every = predict(job("moe", 2, num_experts=4))["comm_bytes_per_step"]["all_to_all"]
    first_dense = predict(job("moe", 2, num_experts=4, first_dense_layers=1))["comm_bytes_per_step"]["all_to_all"]
    layers = PRESETS["tiny"].config.num_layers
    assert first_dense * layers == every * (layers - 1)


# ---- the hf family: the same shape fields, Hugging Face's module paths (pure: no transformers here) ----

HF_VARIANTS = [
    {"num_layers": 2, "num_kv_heads": 2},
    {"num_kv_heads": 1, "attention_bias": True},
    {"tie_embeddings": True, "num_layers": 3},
    {"model": "llama-3-8b"},
    {"num_layers": 2, "num_kv_heads": 2, "num_experts": 4, "top_k": 2},
    {"model": "mixtral-8x7b"},
    {"model": "deepseek-v2-lite"},
    {"model": "deepseek-v2-lite", "q_lora_rank": 384},
    {"model": "deepseek-v2-lite", "num_layers": 3, "hidden_size": 256, "num_experts": 8},
]


@pytest.mark.parametrize("workload", HF_VARIANTS, ids=lambda w: ",".join(f"{k}={v}" for k, v in w.items()))
def test_the_hf_parameter_formula_counts_the_declared_tensors(workload):
    cfg = job("single", 1, family="hf", **workload).model
    assert family_of(cfg).name == "hf"
    assert param_counts(cfg).total == sum(numel(t.shape) for t in model_tensors(cfg))


def test_the_hf_count_by_hand_and_at_llama_3_8b():
    """2 blocks of 2·64² + 2·64·32 (q, o; k, v over 2 KV heads) + 3·64·256 + 2·64, embedding and
    head 256·64 each, final norm 64: 155,968 — what `transformers` builds (tests/workers/test_hf_family.py).
    Llama-3-8B's shape as hf is its published 8,030,261,248, as the parallab family counts it."""
    h, kv, f, v = 64, 32, 256, 256
    assert (
        param_counts(job("single", 1, family="hf", num_layers=2, num_kv_heads=2).model).total
        == (2 * (2 * h * h + 2 * h * kv + 3 * h * f + 2 * h) + 2 * v * h + h)
        == 155_968
    )
    llama = job("fsdp", 8, model="llama-3-8b", family="hf").model
    assert param_counts(llama).total == 8_030_261_248 == param_counts(PRESETS["llama-3-8b"].config).total
    assert model_flops_per_token(llama) == model_flops_per_token(PRESETS["llama-3-8b"].config)


def test_the_hf_mixtral_count_by_hand_and_at_mixtral_8x7b():
    """Mixtral at tiny's width, 2 blocks of 4 experts top-2: attention 2·64² + 2·64·32, norms 2·64,
    router 4·64, experts 4·3·64·256 per block; embedding and head 256·64 each, final norm 64:
    451,392. A token multiplies 2 of the 4 experts. Mixtral-8x7B as hf is its published
    46,702,792,704 and the parallab family's FLOPs (the same closed form, other module names)."""
    h, kv, f, v, e, k = 64, 32, 256, 256, 4, 2
    cfg = job("single", 1, family="hf", num_layers=2, num_kv_heads=2, num_experts=e, top_k=k).model
    shared = 2 * h * h + 2 * h * kv + 2 * h + e * h
    counts = param_counts(cfg)
    assert counts.total == 2 * (shared + e * 3 * h * f) + 2 * v * h + h == 451_392
    assert counts.active_non_embedding == 2 * (shared + k * 3 * h * f) + h + v * h
    assert model_flops_per_token(cfg) == 6 * counts.active_non_embedding + 12 * 2 * 4 * 16 * cfg.seq_len
    mixtral = job("fsdp", 8, model="mixtral-8x7b", family="hf").model
    assert param_counts(mixtral).total == 46_702_792_704 == param_counts(PRESETS["mixtral-8x7b"].config).total
    assert model_flops_per_token(mixtral) == model_flops_per_token(PRESETS["mixtral-8x7b"].config)
    experts = [t for t in model_tensors(cfg) if t.expert]
    assert [t.name for t in experts[:2]] == ["model.layers.0.mlp.experts.gate_up_proj", "model.layers.0.mlp.experts.down_proj"]
    assert [t.shape for t in experts[:2]] == [(e, 2 * f, h), (e, h, f)] and len(experts) == 4
    plan = family_of(cfg).block_plan(cfg, 0)
    assert not [p for p in plan if p.startswith("mlp")], "the MoE block is left whole: attention part only"


DEEPSEEK = {"num_layers": 2, "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16}
"""Multi-head latent attention at tiny's width (hidden 64, 4 heads): a 32-wide latent, query/key 16 + 8, value 16."""
DEEPSEEK_MOE = {**DEEPSEEK, "num_experts": 4, "top_k": 2, "num_shared_experts": 1, "first_dense_layers": 1, "moe_ffn_hidden_size": 32}


def test_the_hf_deepseek_count_by_hand_and_at_deepseek_v2_lite():
    """DeepSeek-V2 at tiny's width, written out from the paper's §2.1 (not from the family's code):
    q h·A(d_h + d_R) = 64·4·24, the latent h·(d_c + d_R) = 64·40 and its norm 32, the
    up-projection d_c·A(d_h + d_v) = 32·4·32, o A·d_v·h = 4·16·64; block 0 a dense SwiGLU 3·64·256,
    block 1 a router 4·64, 4 experts and 1 shared expert of 3·64·32; norms 2·64 per block;
    embedding and head 256·64, final norm 64. FLOPs: QKᵀ contracts 24, PV produces 16 per head.
    DeepSeek-V2-Lite (27 blocks, hidden 2048, 16 heads, a 512 latent, 64 routed experts top-6 and
    2 shared of 1408, the first block dense 10944 wide) is 15,706,484,224 — the paper's 15.7B
    (its §B: 15.7B total, 2.4B activated), pinned against the module in tests/workers/test_families.py."""
    h, a, f, fe, v, e, k = 64, 4, 256, 32, 256, 4, 2
    attention = h * a * 24 + h * 40 + 32 + 32 * a * 32 + a * 16 * h
    dense, moe = attention + 2 * h + 3 * h * f, attention + 2 * h + e * h + 3 * h * fe
    cfg = job("single", 1, family="hf", **DEEPSEEK_MOE).model
    counts = param_counts(cfg)
    assert counts.total == dense + moe + e * 3 * h * fe + 2 * v * h + h
    assert counts.active_non_embedding == dense + moe + k * 3 * h * fe + h + v * h
    assert model_flops_per_token(cfg) == 6 * counts.active_non_embedding + 6 * 2 * a * (24 + 16) * cfg.seq_len
    lite = PRESETS["deepseek-v2-lite"].config
    assert param_counts(lite).total == 15_706_484_224
    assert round(param_counts(lite).active_non_embedding / 1e9, 1) == 2.5  # 2.45e9 with the head: the paper's 2.4B activated
    # compressed queries: q_a_proj h·d_c' + its norm d_c' + q_b_proj d_c'·A(d_h + d_R) in place of q_proj
    compressed = job("single", 1, family="hf", **DEEPSEEK_MOE, q_lora_rank=16).model
    assert param_counts(compressed).total - counts.total == 2 * (h * 16 + 16 + 16 * a * 24 - h * a * 24)
    tensors = {t.name: t.shape for t in model_tensors(cfg)}
    assert tensors["model.layers.0.self_attn.kv_a_proj_with_mqa.weight"] == (32 + 8, h)
    assert tensors["model.layers.0.self_attn.kv_b_proj.weight"] == (a * (16 + 16), 32)
    assert tensors["model.layers.1.mlp.shared_experts.gate_proj.weight"] == (fe, h)
    assert tensors["model.layers.1.mlp.experts.gate_up_proj"] == (e, 2 * fe, h) and "model.layers.0.mlp.gate_proj.weight" in tensors


def test_a_scaled_down_deepseek_keeps_its_latent_and_expert_ratios():
    cfg = job("single", 1, model="deepseek-v2-lite", num_layers=2, hidden_size=256, num_experts=8).model
    assert (cfg.kv_lora_rank, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim) == (64, 16, 8, 16)
    assert (cfg.ffn_hidden_size, cfg.moe_ffn_hidden_size, cfg.num_heads, cfg.num_kv_heads) == (1368, 176, 16, 16)


def test_the_mla_fields_are_neutral_so_stored_workload_keys_stay():
    from parallab.core.spec import key_fields

    plain = job(family="hf").workload_document()
    assert not {"kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "moe_ffn_hidden_size"} & set(
        key_fields(plain)
    )
    same = job(family="hf", num_experts=4, moe_ffn_hidden_size=256).model
    assert same.moe_ffn_hidden_size is None == job(family="hf", num_experts=4).model.moe_ffn_hidden_size


@pytest.mark.parametrize(
    ("strategy", "n", "options", "workload", "loc", "says"),
    [
        ("ddp", 2, {}, {**DEEPSEEK, "num_kv_heads": 2}, ("workload", "num_kv_heads"), "num_kv_heads 2 must equal num_heads 4"),
        ("ddp", 2, {}, {**DEEPSEEK, "qk_rope_head_dim": 7}, ("workload", "qk_rope_head_dim"), "must be even"),
        ("ddp", 2, {}, {**DEEPSEEK, "attention_bias": True}, ("workload", "attention_bias"), "no q/k/v biases"),
        ("ddp", 2, {}, {"v_head_dim": 16}, ("workload", "v_head_dim"), "it needs kv_lora_rank"),
        ("ddp", 2, {}, {**DEEPSEEK_MOE, "num_shared_experts": 0}, ("workload", "num_shared_experts"), "always have shared experts"),
        ("ddp", 2, {}, {"num_experts": 4, "moe_ffn_hidden_size": 32}, ("workload", "moe_ffn_hidden_size"), "DeepSeek-V2's"),
        (
            "tp",
            2,
            {"sequence_parallel": True},
            DEEPSEEK,
            ("strategy", "options", "sequence_parallel"),
            "not composed with multi-head latent attention",
        ),
        ("moe", 2, {}, DEEPSEEK_MOE, ("strategy", "options", "aux_loss_coef"), "aux_loss_coef 0.01 would not be applied"),
    ],
)
def test_what_the_hf_deepseek_cannot_run_is_refused_naming_the_field(strategy, n, options, workload, loc, says):
    problems = refused(strategy, n, options, family="hf", **workload)
    assert loc in problems and says in problems[loc], problems


@pytest.mark.parametrize("workload", [{"num_experts": 4}, DEEPSEEK_MOE], ids=["mixtral", "deepseek-v2"])
def test_hf_experts_resolve_under_expert_parallelism_without_a_load_balancing_loss(workload):
    """The library's experts split over ep (2 a rank), alone or beside FSDP; the all-to-all carries
    every routed slot (tokens · top_k rows, there and back, forward and backward) in each MoE block."""
    moe = job("moe", 2, {"aux_loss_coef": 0}, family="hf", **workload)
    assert (moe.options.aux_loss_coef, moe.model.num_experts) == (0, 4)
    comm = predict(moe)["comm_bytes_per_step"]
    rows = 8 * 64 // 2 * 2  # each rank's half of the batch (8 × 64 tokens), top-2
    assert comm["all_to_all"] == moe.model.moe_layers * (4 * rows * 64 * 4 + 8 * 4)
    assert job("layout", 4, {"ep": 2, "dp_shard": 2, "aux_loss_coef": 0}, family="hf", **workload).options.ep == 2


def test_the_planner_times_deepseeks_narrow_experts_and_latent_projections():
    """DeepSeek-V2-Lite's experts are 1408 wide, not the dense block's 10944: its estimated compute
    is far below the same shape with experts as wide as the dense MLP, and its activations count
    q, k, v and the output at the latent attention's widths (A·(2·192 + 2·128) per token)."""
    from parallab.core.activations import layer_terms
    from parallab.core.hardware import load_catalogue
    from parallab.core.plan_hardware import Hardware
    from parallab.core.planner import compute_seconds

    hw = Hardware(spec=load_catalogue().get("h100"), nodes=1)
    lite = job("fsdp", 8, model="deepseek-v2-lite", precision="bf16")
    wide = job("fsdp", 8, model="deepseek-v2-lite", precision="bf16", moe_ffn_hidden_size=10944)
    assert compute_seconds(lite, hw) < 0.5 * compute_seconds(wide, hw)
    qkvo = [t.bytes_per_token for t in layer_terms(lite.model, "fp32") if "q, k (after rotary), v, output" in t.name]
    assert len(qkvo) == 2 and sum(qkvo) == pytest.approx(4 * 16 * (2 * 192 + 2 * 128))  # dense and MoE blocks alike


def test_latent_attention_is_the_hf_familys_only():
    problems = refused("ddp", 2, {}, **DEEPSEEK)
    assert "built by the hf family (DeepSeek-V2), not the parallab family" in problems[("workload", "kv_lora_rank")]


def test_deepseek_resolves_under_a_pipeline_alone_and_beside_fsdp():
    """Its router (softmax, greedy top-k per token, no capacity, no auxiliary loss in the library's
    model) routes a micro-batch as the batch: pp runs its experts."""
    assert job("pp", 2, family="hf", **DEEPSEEK_MOE).options.microbatches == 4
    assert job("layout", 4, {"pp": 2, "dp_shard": 2}, family="hf", **DEEPSEEK_MOE).options.pp == 2


def test_the_planner_plans_deepseek_v2_lite_at_its_true_size():
    j = resolve_job(
        JobSpec.model_validate(
            {"workload": {"model": "deepseek-v2-lite", "precision": "bf16"}, "strategy": {"name": "fsdp", "world_size": 8}}
        )
    )
    prediction = predict(j)
    assert prediction["params_total"] == 15_706_484_224 and j.model.family == "hf" and j.model.kv_lora_rank == 512
    assert sum(prediction["model_state_bytes_per_rank"].values()) == 16 * 15_706_484_224 // 8


def test_the_hf_family_names_hugging_faces_modules():
    cfg = job("single", 1, family="hf").model
    family = family_of(cfg)
    assert (family.blocks, family.first_stage, family.last_stage, family.attention) == (
        "model.layers",
        ("model.embed_tokens",),
        ("model.norm", "lm_head"),
        "self_attn",
    )
    plan = family.block_plan(cfg, 0)
    assert {
        p: plan[p] for p in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")
    } == dict.fromkeys(("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"), "colwise")
    assert plan["self_attn.o_proj"] == plan["mlp.down_proj"] == "rowwise"
    # Megatron's one input preparation per attention and per MLP (the attention's input comes by keyword)
    assert (plan["self_attn"], plan["mlp"]) == ("input_kwarg", "input")
    assert job("tp", 2, {"sequence_parallel": True}, family="hf").options.sequence_parallel
    names = [t.name for t in model_tensors(cfg)]
    assert names[0] == "model.embed_tokens.weight" and names[-2:] == ["model.norm.weight", "lm_head.weight"]
    assert family.on_first_stage(model_tensors(cfg)[0]) and not family.on_first_stage(model_tensors(cfg)[-2])


@pytest.mark.parametrize("experts", [{}, {"num_experts": 4}])
def test_an_hf_model_resolves_under_a_pipeline_alone_and_beside_fsdp(experts):
    """pp runs for the hf family's Llama and its Mixtral: the library's router routes each token
    alone (`routes_per_token`), so a micro-batch routes as the batch does."""
    assert job("pp", 2, family="hf", **experts).options.microbatches == 4
    layout = job("layout", 4, {"pp": 2, "dp_shard": 2}, family="hf", **experts).options
    assert (layout.pp, layout.dp_shard) == (2, 2)


@pytest.mark.parametrize(("strategy", "n", "options"), [("pp", 2, {}), ("layout", 4, {"pp": 2, "dp_shard": 2})])
def test_the_parallab_familys_experts_stay_refused_under_a_pipeline(strategy, n, options):
    """Its MoE's capacity and load-balancing loss are the whole batch's: a micro-batch would route otherwise."""
    problems = refused(strategy, n, options, num_experts=4)
    assert "supports dense models only" in problems[("workload", "num_experts")], problems


def test_the_parallab_family_stays_the_default():
    assert job().model.family == "parallab" and family_of(job().model).name == "parallab"


@pytest.mark.parametrize(
    ("strategy", "n", "options", "workload", "loc", "says"),
    [
        ("ddp", 2, {}, {"mlp": "gelu"}, ("workload", "mlp"), "the hf family builds Llama's SwiGLU MLP"),
        ("ddp", 2, {}, {"num_experts": 4, "num_shared_experts": 1}, ("workload", "num_shared_experts"), "Mixtral, which has no shared"),
        ("ddp", 2, {}, {"num_experts": 4, "first_dense_layers": 1}, ("workload", "first_dense_layers"), "no dense first layers"),
        ("ddp", 2, {}, {"num_experts": 4, "attention_bias": True}, ("workload", "attention_bias"), "no q/k/v biases"),
        ("ddp", 2, {}, {"num_experts": 4, "capacity_factor": 2.0}, ("workload", "capacity_factor"), "no capacity): leave it at 1.25"),
        ("moe", 2, {}, {}, ("strategy", "options", "aux_loss_coef"), "no load-balancing loss"),
        ("layout", 4, {"ep": 2, "dp_shard": 2}, {"num_experts": 4}, ("strategy", "options", "aux_loss_coef"), "set it to 0"),
        (
            "tp",
            2,
            {"sequence_parallel": True},
            {"num_experts": 4},
            ("strategy", "options", "sequence_parallel"),
            "would route each rank's sequence shard apart",
        ),
        ("pp", 2, {}, {"tie_embeddings": True}, ("workload", "tie_embeddings"), "tied embeddings need the embedding and the head"),
        ("ring", 2, {}, {}, ("strategy", "name"), "context parallelism yet (cp=2)"),
    ],
)
def test_what_the_hf_family_cannot_run_is_refused_naming_the_field(strategy, n, options, workload, loc, says):
    problems = refused(strategy, n, options, family="hf", **workload)
    assert loc in problems and says in problems[loc], problems


def test_an_unknown_family_is_refused_naming_the_field():
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as exc:
        job(family="mixtral")
    assert [err["loc"] for err in exc.value.errors()] == [("workload", "family")]
