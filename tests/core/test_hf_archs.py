"""Hugging Face architectures by `model_type` (`parallab.core.families.hf_archs`): the workload
keeps its config's model_type, each architecture refuses the features it does not have, and the
two added as the proof — Gemma 2 (heads of their own width, four norms a block, soft-caps) and
Phi-3 (fused projections) — read their published configs, with what they cannot build refused
naming the key. Their exact counts against the library's module are tests/workers/test_hf_gemma_phi3.py's."""

from __future__ import annotations

from typing import Any

import pytest

from parallab.core.families import HF, param_counts
from parallab.core.families.hf_archs import ARCHS, arch_of
from parallab.core.hf_config import read_hf_config
from parallab.core.jobs import ResolvedJob, resolve_job
from parallab.core.problems import SpecError
from parallab.core.spec import JobSpec, key_fields
from tests.core.hf_configs import GEMMA_2_2B, GEMMA_2_27B, LLAMA_3_8B, MISTRAL_7B_V0_3, PHI_3_MINI_4K, TINY_GEMMA_2, TINY_PHI_3

GEMMA_2_2B_PARAMS = 2_614_341_888
PHI_3_MINI_PARAMS = 3_821_079_552


def resolve(config: Any, strategy: str = "fsdp", world: int = 2, options: dict[str, Any] | None = None, **workload: Any) -> ResolvedJob:
    spec = {"workload": {"hf_config": config, **workload}, "strategy": {"name": strategy, "world_size": world, "options": options or {}}}
    return resolve_job(JobSpec.model_validate(spec))


def refusal(
    config: Any = None, strategy: str = "fsdp", world: int = 2, options: dict[str, Any] | None = None, **workload: Any
) -> dict[str, str]:
    with pytest.raises(SpecError) as caught:
        if config is None:
            resolve_job(JobSpec.model_validate({"workload": workload, "strategy": {"name": strategy, "world_size": world}}))
        else:
            resolve(config, strategy, world, options, **workload)
    return {".".join(map(str, p.loc)): p.msg for p in caught.value.problems}


def test_every_architecture_is_registered_under_its_own_model_type():
    assert set(ARCHS) == {"llama", "mistral", "qwen2", "mixtral", "deepseek_v2", "gemma2", "phi3"}
    assert all(arch.model_type == name for name, arch in ARCHS.items())


def test_the_workload_keeps_the_model_type_only_where_the_shape_does_not_imply_it():
    """Llama's and Mistral's (Llama's module) are implied: their workloads and keys are as before."""
    for config in (LLAMA_3_8B, MISTRAL_7B_V0_3):
        job = resolve(config)
        assert job.model.model_type is None and arch_of(job.model).model_type == "llama"
        assert "model_type" not in key_fields(job.workload_document()) and "head_dim" not in key_fields(job.workload_document())
    gemma = resolve(TINY_GEMMA_2)
    assert gemma.model.model_type == "gemma2" and key_fields(gemma.workload_document())["model_type"] == "gemma2"
    assert resolve(TINY_PHI_3).model.model_type == "phi3"


def test_gemma_2_reads_its_head_width_tied_head_and_window():
    shape = read_hf_config(GEMMA_2_2B)
    assert shape.fields["model_type"] == "gemma2" and shape.fields["head_dim"] == 256 and shape.fields["tie_embeddings"] is True
    assert shape.seq_limit == ("sliding_window", 4096)
    job = resolve(GEMMA_2_2B, seq_len=4096)
    assert (job.model.head_width, job.model.hidden_size // job.model.num_heads) == (256, 288)
    assert param_counts(job.model).total == GEMMA_2_2B_PARAMS
    assert HF.architecture(job.model) == "Gemma2ForCausalLM"
    assert "sliding_window 4096" in refusal(GEMMA_2_2B, seq_len=8192)["workload.seq_len"]


@pytest.mark.parametrize(
    ("config", "key", "words"),
    [
        (GEMMA_2_27B, "query_pre_attn_scalar", "must be head_dim (128)"),
        ({**GEMMA_2_2B, "final_logit_softcapping": None}, "final_logit_softcapping", "must be 30.0"),
        ({**GEMMA_2_2B, "attn_logit_softcapping": 20.0}, "attn_logit_softcapping", "must be 50.0"),
        ({**GEMMA_2_2B, "hidden_activation": "gelu"}, "hidden_activation", "gelu_pytorch_tanh"),
        ({**GEMMA_2_2B, "use_bidirectional_attention": True}, "use_bidirectional_attention", "causal"),
        ({**PHI_3_MINI_4K, "resid_pdrop": 0.1}, "resid_pdrop", "must be 0"),
        ({**PHI_3_MINI_4K, "partial_rotary_factor": 0.75}, "partial_rotary_factor", "must be 1.0"),
        ({**PHI_3_MINI_4K, "head_dim": 64}, "head_dim", "Phi-3, which has no head_dim other than"),
    ],
)
def test_what_gemma_2_and_phi_3_cannot_build_is_refused_naming_the_key(config, key, words):
    found = refusal(config)
    assert words in found[f"workload.hf_config.{key}"], found


def test_phi_3_reads_its_window_and_count_and_is_refused_under_tensor_parallelism():
    shape = read_hf_config(PHI_3_MINI_4K)
    assert shape.fields["model_type"] == "phi3" and shape.seq_limit == ("sliding_window", 2047)
    job = resolve(PHI_3_MINI_4K)
    assert param_counts(job.model).total == PHI_3_MINI_PARAMS and HF.architecture(job.model) == "Phi3ForCausalLM"
    assert {t.name for t in HF.tensors(job.model) if t.layer == 0} >= {
        "model.layers.0.self_attn.qkv_proj.weight",
        "model.layers.0.mlp.gate_up_proj.weight",
    }
    assert "Phi-3 does not run tensor parallelism" in refusal(TINY_PHI_3, "tp", 2)["strategy.name"]
    assert resolve(TINY_PHI_3, "pp", 2).model.model_type == "phi3"


@pytest.mark.parametrize(
    ("workload", "loc", "words"),
    [
        ({"family": "hf", "model_type": "gemma3"}, "workload.model_type", "the hf family builds llama"),
        ({"family": "hf", "model_type": "deepseek_v3"}, "workload.model_type", "DeepSeek-V3 is not built"),
        ({"model_type": "llama"}, "workload.model_type", "not the parallab family's"),
        ({"head_dim": 32}, "workload.head_dim", "not the parallab family's"),
        ({"family": "hf", "model_type": "llama", "num_experts": 4}, "workload.num_experts", "Llama, which has no routed experts"),
        ({"family": "hf", "model_type": "qwen2"}, "workload.attention_bias", "always has q/k/v biases"),
        ({"family": "hf", "model_type": "gemma2", "attention_bias": True}, "workload.attention_bias", "Gemma 2, which has no q/k/v"),
    ],
)
def test_a_model_type_and_the_features_it_has_not_are_refused_naming_the_field(workload, loc, words):
    found = refusal(None, model="tiny", **workload)
    assert words in found[loc], found


def test_a_model_type_given_as_a_field_builds_that_architecture_on_a_preset():
    job = resolve_job(
        JobSpec.model_validate(
            {"workload": {"model": "tiny", "family": "hf", "model_type": "gemma2", "head_dim": 32}, "strategy": {"name": "single"}}
        )
    )
    assert (arch_of(job.model).title, job.model.head_width) == ("Gemma 2", 32)
    block = HF.block_params(job.model, 0)
    assert [p.module for p in block][-4:] == list(ARCHS["gemma2"].norms)
    assert (
        resolve_job(
            JobSpec.model_validate({"workload": {"model": "tiny", "family": "hf", "model_type": "llama"}, "strategy": {"name": "single"}})
        ).model.model_type
        is None
    )
