"""Gemma 2 and Phi-3, the architectures added by model_type: each published config's parameter
count is exactly the library's module's, built from that config on the meta device (names and
shapes too); the tiny configs' modules give the library's logits with its weights loaded (Gemma
2's eager attention under the explicit mask, its embedding scale and logit soft-cap); then each
runs as the worker runs it at 2 ranks on gloo — real torchrun jobs through the launcher — its
loss held against `single`'s curve and step 0's gradients against `single`'s.

TINY_GEMMA_2: hidden 64, 4 heads 32 wide (not 64 / 4), 2 KV heads, 2 layers, GeGLU 256 wide, the
head tied, vocabulary 256. TINY_PHI_3: hidden 64, 4 heads over 2 KV heads in one qkv_proj, 2
layers, gate_up_proj 2·256 wide, vocabulary 256.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from parallab.core.families import HF, model_tensors, param_counts
from parallab.core.families.hf_archs import ARCHS
from tests.core.hf_configs import GEMMA_2_2B, GEMMA_2_9B, PHI_3_MEDIUM_4K, PHI_3_MINI_4K, TINY_GEMMA_2, TINY_PHI_3
from tests.workers.test_hf_family import cfg_of

pytest.importorskip("transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a config, never the hub

NOT_CONFIG = ("architectures", "auto_map", "_name_or_path", "torch_dtype", "transformers_version")
"""Keys of a published config.json that are not the config class's arguments."""


def library_model(config: dict[str, Any], *, meta: bool) -> Any:
    """The library's own `…ForCausalLM` from the config as published on the meta device; with
    random weights otherwise, and no padding row (as the harness's: its batches have none)."""
    import torch
    import transformers

    keys = {k: v for k, v in config.items() if k not in NOT_CONFIG}
    hf_config = transformers.AutoConfig.for_model(**(keys if meta else {**keys, "pad_token_id": None}))
    if meta:
        with torch.device("meta"):
            return transformers.AutoModelForCausalLM.from_config(hf_config)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(hf_config, attn_implementation="eager").float().eval()


@pytest.mark.parametrize(
    ("config", "count"),
    [(GEMMA_2_2B, 2_614_341_888), (GEMMA_2_9B, 9_241_705_984), (PHI_3_MINI_4K, 3_821_079_552), (PHI_3_MEDIUM_4K, 13_960_238_080)],
    ids=["gemma-2-2b", "gemma-2-9b", "phi-3-mini", "phi-3-medium"],
)
def test_the_published_configs_count_is_the_librarys_meta_device_count(config, count):
    from workers.harness.families import build_meta

    reference = library_model(config, meta=True)
    assert sum(p.numel() for p in reference.parameters()) == count
    cfg = cfg_of({"hf_config": config})
    assert param_counts(cfg).total == count
    ours = build_meta(cfg)
    assert {n: tuple(p.shape) for n, p in ours.named_parameters()} == {n: tuple(p.shape) for n, p in reference.named_parameters()}
    assert [t.name for t in model_tensors(cfg)] == [n for n, _ in ours.named_parameters()]


@pytest.mark.parametrize("config", [TINY_GEMMA_2, TINY_PHI_3], ids=["gemma2", "phi3"])
def test_the_tiny_configs_model_is_the_librarys_tensor_for_tensor_and_logit_for_logit(config):
    import torch

    from workers.harness.families import build_model

    cfg = cfg_of({"hf_config": config})
    assert cfg.model_type == config["model_type"] and HF.architecture(cfg) == ARCHS[config["model_type"]].hf_class
    reference = library_model(config, meta=False)
    model = build_model(cfg, seed=1).eval()
    model.load_state_dict(reference.state_dict(), strict=True)
    tokens = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), reference(tokens).logits, rtol=0, atol=1e-5)


def test_the_rank_sides_builders_are_keyed_as_the_cores_architectures():
    from workers.harness.hf_archs import BUILDERS

    assert set(BUILDERS) == set(ARCHS)


RUNS: dict[str, tuple[dict[str, Any], str, dict[str, Any]]] = {
    "gemma2-fsdp": (TINY_GEMMA_2, "fsdp", {}),
    "gemma2-tp": ({**TINY_GEMMA_2, "tie_word_embeddings": False}, "tp", {}),
    "phi3-fsdp": (TINY_PHI_3, "fsdp", {}),
    "phi3-pp": (TINY_PHI_3, "pp", {}),
}
"""Each 2-rank job: the config, the strategy and its options (tp: 2 heads 32 wide a rank, the head
untied — tied embeddings are not composed with tp; pp: a block a stage)."""


@pytest.fixture(scope="module")
def gemma_phi3_runs(harness_jobs) -> None:
    """The four 2-rank jobs of RUNS in one launch (`harness_jobs`), read through `harness_job`'s memo;
    untraced: the tests read the loss and gradient checks, which every run makes, and no profiled step."""
    harness_jobs([(strategy, 2, options, {"hf_config": config}) for config, strategy, options in RUNS.values()], trace=False)


@pytest.mark.slow
@pytest.mark.usefixtures("gemma_phi3_runs")
@pytest.mark.parametrize("key", list(RUNS))
def test_gemma2_and_phi3_match_single_in_loss_and_gradients(harness_job, key):
    config, strategy, options = RUNS[key]
    doc, _ = harness_job(strategy, 2, options, {"hf_config": config}, trace=False)
    assert doc.workload["family"] == "hf" and doc.workload["model_type"] == config["model_type"]
    assert len(doc.loss.values) == doc.workload["steps"] == len(doc.loss.reference)
    assert doc.summary.loss_max_rel_diff_vs_reference <= 1e-4, doc.loss
    check = doc.summary.gradient_check
    assert check is not None and check.passed and check.max_rel_err <= check.tolerance, check
    assert check.params_checked == len(model_tensors(cfg_of({"hf_config": config})))
