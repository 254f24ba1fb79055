"""The `hf` family: a Hugging Face Llama (Qwen2 with q/k/v biases) built offline from its config,
held against its declaration and trained under ddp, fsdp and tp against `single`.

In one process: the module built on the meta device is exactly the declared tensors (names,
shapes, the closed-form count), and the tp plan splits each parameter on its declared dim (torch's
fake process group). One 2-rank torchrun (hf_driver.py, module fixture) runs ddp, fsdp, tp, tp
with sequence parallelism and pp on a tiny Llama (hidden 64, 2 layers, 4 heads over 2 KV heads,
vocabulary 256), two wrong TP plans and a wrong pipeline stage boundary, all against one `single`.
Without `transformers` the launcher refuses the job naming the field and the fix.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from parallab.core.families import HF, family_of, model_tensors
from parallab.core.model import ModelConfig
from tests.workers.conftest import make_job, run_driver
from tests.workers.declared import mismatches, tp_split

pytest.importorskip("transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never the hub: a config builds the model

LLAMA = {"family": "hf", "num_layers": 2, "num_kv_heads": 2}
"""The tiny Llama of the brief: `tiny`'s hidden 64, 4 heads and vocabulary 256, 2 layers, 2 KV heads."""
MIXTRAL = {**LLAMA, "num_experts": 4, "top_k": 2}
"""The same as Mixtral: every block's MLP 4 experts (inner width 256), each token routed to 2."""
DEEPSEEK = {
    "family": "hf",
    "num_layers": 2,
    "kv_lora_rank": 32,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 16,
    "num_experts": 4,
    "top_k": 2,
    "num_shared_experts": 2,
    "first_dense_layers": 1,
    "moe_ffn_hidden_size": 32,
}
"""DeepSeek-V2 at tiny's width: multi-head latent attention (a 32-wide latent, query/key 16 + 8
rotary, value 16), block 0 dense, block 1 4 routed experts top-2 and 2 shared, 32 wide."""
SHAPES = {
    "llama-gqa": LLAMA,
    "llama-mha-tied": {"family": "hf", "num_layers": 3, "tie_embeddings": True},
    "qwen2-bias": {**LLAMA, "attention_bias": True, "num_kv_heads": 1},
    "mixtral": MIXTRAL,
    "mixtral-top1-tied": {**MIXTRAL, "num_experts": 8, "top_k": 1, "tie_embeddings": True, "num_kv_heads": 1},
    "deepseek-v2": DEEPSEEK,
    "deepseek-v2-q-lora-tied": {**DEEPSEEK, "q_lora_rank": 24, "tie_embeddings": True, "num_layers": 3, "first_dense_layers": 2},
    "deepseek-v2-dense": {**DEEPSEEK, "num_experts": 0, "num_shared_experts": 0, "first_dense_layers": 0, "moe_ffn_hidden_size": None},
}


def cfg_of(workload: dict[str, Any]) -> ModelConfig:
    return make_job("single", 1, workload=workload, trace=False).model


@pytest.mark.parametrize("name", list(SHAPES))
def test_the_built_module_is_exactly_the_declared_tensors(name):
    from workers.harness.families import build_meta

    cfg = cfg_of(SHAPES[name])
    model = build_meta(cfg)
    assert family_of(cfg) is HF and all(p.is_meta for p in model.parameters())
    assert mismatches(HF, cfg, model) == []  # names, shapes, and the closed-form count against sum(numel)
    assert type(model).__name__ == "HFCausalLM"


def test_the_architecture_follows_attention_bias_and_experts_and_the_tied_head_is_one_parameter():
    from workers.harness.families import build_meta

    assert HF.architecture(cfg_of(SHAPES["qwen2-bias"])) == "Qwen2ForCausalLM"
    assert HF.architecture(cfg_of(LLAMA)) == "LlamaForCausalLM"
    assert HF.architecture(cfg_of(MIXTRAL)) == "MixtralForCausalLM"
    mixtral = build_meta(cfg_of(MIXTRAL))
    assert type(mixtral.model).__name__ == "MixtralModel"
    moe = mixtral.model.layers["0"].mlp
    assert (moe.gate.top_k, moe.experts.num_experts, moe.jitter_noise) == (2, 4, 0.0)
    tied = build_meta(cfg_of(SHAPES["llama-mha-tied"]))
    assert tied.lm_head.weight is tied.model.embed_tokens.weight and "lm_head.weight" not in dict(tied.named_parameters())


def test_a_wrong_declaration_is_caught_against_the_module():
    """The holding test can fail: a family declaring Llama's o_proj with a bias disagrees with the module."""
    from parallab.core.families.base import Param
    from parallab.core.families.hf import HFFamily
    from workers.harness.families import build_meta

    class BiasedO(HFFamily):
        def block_params(self, cfg: ModelConfig, layer: int) -> list[Param]:
            return [*super().block_params(cfg, layer), Param("self_attn.o_proj", "bias", (cfg.hidden_size,))]

    cfg = cfg_of(LLAMA)
    found = mismatches(BiasedO(), cfg, build_meta(cfg))
    assert "model.layers.0.self_attn.o_proj.bias: module None, declared (64,)" in found
    assert "the parameter formula disagrees with the module" not in found  # the formula is HF's own, unchanged


def test_a_wrong_mixtral_declaration_is_caught_against_the_module():
    """The holding test can fail for the experts too: transformers 4.x's per-expert Linear layers
    (experts.0.w1 ...) or an unfused gate/up pair are not what 5.x builds."""
    from parallab.core.families.base import Param
    from parallab.core.families.hf import HFFamily
    from workers.harness.families import build_meta

    class Unfused(HFFamily):
        def block_params(self, cfg: ModelConfig, layer: int) -> list[Param]:
            e, f, h = cfg.num_experts, cfg.ffn_hidden_size, cfg.hidden_size
            out = [p for p in super().block_params(cfg, layer) if p.param != "gate_up_proj"]
            return [
                *out,
                Param("mlp.experts", "gate_proj", (e, f, h), expert=True),
                Param("mlp.experts", "up_proj", (e, f, h), expert=True),
            ]

    cfg = cfg_of(MIXTRAL)
    found = mismatches(Unfused(), cfg, build_meta(cfg))
    assert "model.layers.0.mlp.experts.gate_proj: module None, declared (4, 256, 64)" in found
    assert "model.layers.0.mlp.experts.gate_up_proj: module (4, 512, 64), declared None" in found, found


def test_a_wrong_deepseek_declaration_is_caught_against_the_module():
    """The holding test can fail for latent attention: kv_b_proj declared heads·(nope + rope) wide —
    the key's full width, where the library's up-projection makes the key without its rotary part
    and the value — disagrees with the module, and so does its count."""
    from parallab.core.families.base import Param
    from parallab.core.families.hf import HFFamily
    from workers.harness.families import build_meta

    class RopeInKvB(HFFamily):
        def block_params(self, cfg: ModelConfig, layer: int) -> list[Param]:
            wrong = (cfg.num_heads * cfg.qk_head_dim, cfg.kv_lora_rank)
            return [Param(p.module, p.param, wrong) if p.module == "self_attn.kv_b_proj" else p for p in super().block_params(cfg, layer)]

    cfg = cfg_of(DEEPSEEK)
    found = mismatches(RopeInKvB(), cfg, build_meta(cfg))
    assert "model.layers.0.self_attn.kv_b_proj.weight: module (128, 32), declared (96, 32)" in found, found
    assert (
        HF.architecture(cfg) == "DeepseekV2ForCausalLM" and HF.architecture(cfg_of(SHAPES["deepseek-v2-dense"])) == "DeepseekV2ForCausalLM"
    )
    model = build_meta(cfg)
    assert type(model.model.layers["1"].mlp).__name__ == "DeepseekV2Moe" and type(model.model.layers["0"].mlp).__name__ == "DeepseekV2MLP"


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_the_tp_plan_splits_each_parameter_on_its_declared_dim(fake_tp_mesh, sequence_parallel):
    from workers.harness.families import build_model
    from workers.strategies.tensor_parallel import parallelize

    cfg = cfg_of(SHAPES["qwen2-bias"] | {"num_kv_heads": 2})
    model = parallelize(build_model(cfg, seed=0), fake_tp_mesh, sequence_parallel=sequence_parallel)
    split = tp_split(model)
    assert split == {t.name: t.tp_dim for t in model_tensors(cfg)}
    assert split["model.layers.0.self_attn.o_proj.weight"] == 1 and split["model.layers.0.mlp.up_proj.weight"] == 0
    assert split["lm_head.weight"] == 0 and split["model.embed_tokens.weight"] == 0 and split["model.norm.weight"] is None


def test_without_transformers_the_launcher_refuses_the_job_naming_the_field_and_the_fix(monkeypatch, tmp_path):
    from parallab.core.rundir import RunDir
    from workers import extras
    from workers.launcher import launch

    monkeypatch.setattr(extras, "transformers_available", lambda: False)
    outcome = launch(make_job("ddp", 2, workload=LLAMA, trace=False), RunDir(tmp_path / "run"), timeout_s=60, trace_cap_bytes=1 << 20)
    assert not outcome.ok and outcome.returncode is None, "no rank was started"
    assert outcome.reason is not None and outcome.reason.startswith("workload.family: 'hf' needs Hugging Face transformers")
    assert "pip install 'parallab[hf]'" in outcome.reason and "Traceback" not in outcome.log_tail
    assert extras.missing_extra(cfg_of({})) is None, "the parallab family needs no extra"


@pytest.fixture(scope="module")
def hf_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    results: dict[str, Any] = run_driver(tmp_path_factory, "hf_driver.py", timeout=300)
    return results


CASES = ("ddp", "fsdp", "tp", "tp_sp", "pp")
"""The driver's cases: tp_sp is tp with sequence parallelism; pp is 2 stages, 1F1B (under pp the
check gathers every tensor from both stages)."""


@pytest.mark.slow
@pytest.mark.parametrize("name", CASES)
def test_each_strategy_matches_single_in_loss_and_gradients(hf_results, name):
    case = hf_results[name]
    check = case["gradient_check"]
    assert check["passed"] and check["tolerance"] == 1e-5 and check["max_rel_err"] <= 1e-5, check
    assert check["params_checked"] == len(model_tensors(cfg_of(LLAMA))) == 21
    assert case["loss_max_rel_diff"] <= 1e-4, (case["losses"], case["reference"])
    assert len(case["losses"]) == 3


@pytest.mark.slow
def test_the_built_module_holds_the_declared_parameter_count(hf_results):
    declared = HF.param_counts(cfg_of(LLAMA)).total
    assert hf_results["reference_params"] == declared == 155_968
    assert all(hf_results[s]["params"] == declared for s in CASES)


@pytest.mark.slow
def test_o_proj_marked_colwise_is_a_sharding_error(hf_results):
    error = hf_results["tp_o_proj_colwise"].get("error", "")
    assert error.startswith("RuntimeError:") and "Sharding propagation failed" in error, hf_results["tp_o_proj_colwise"]


@pytest.mark.slow
def test_k_and_v_left_out_of_the_plan_train_and_fail_the_gradient_check(hf_results):
    outcome = hf_results["tp_kv_replicated"]["outcome"]
    check = outcome["gradient_check"]
    assert not check["passed"] and check["max_rel_err"] > 0.1, check
    assert outcome["loss_max_rel_diff"] > 1e-4, "the loss check sees it too"


@pytest.mark.slow
def test_the_final_norm_on_the_wrong_stage_trains_and_fails_both_checks(hf_results):
    """Stage 0 normalises what it sends and the last stage feeds the head unnormalised: every
    gradient is wrong, and the loss curve leaves the reference's (the clean pp above passes both)."""
    outcome = hf_results["pp_norm_on_first_stage"]["outcome"]
    check = outcome["gradient_check"]
    assert not check["passed"] and check["max_rel_err"] > 0.1, check
    assert check["params_checked"] == 21 and check["worst_param"] is not None, "both stages' tensors, the norm now on stage 0"
    assert outcome["loss_max_rel_diff"] > 1e-4, (outcome["losses"], outcome["reference"])
