"""A Mistral config.json runs as the hf family's Llama: the module the rank side builds from the
resolved config holds exactly `MistralForCausalLM`'s parameters (names and shapes) and, with
Mistral's weights loaded, gives its logits while the sliding window covers the sequence — and
not beyond it, which is why resolution refuses a longer `seq_len` (one process, CPU, offline)."""

from __future__ import annotations

import os

import pytest

from parallab.core.jobs import resolve_job
from parallab.core.spec import JobSpec
from tests.core.hf_configs import TINY_MISTRAL

pytest.importorskip("transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a config, never the hub


def mistral(config: dict):
    import torch
    import transformers

    torch.manual_seed(0)
    hf_config = transformers.AutoConfig.for_model(**{k: v for k, v in config.items() if k != "torch_dtype"})
    return transformers.AutoModelForCausalLM.from_config(hf_config, attn_implementation="sdpa").float().eval()


def ours(seq_len: int):
    from workers.harness.families import build_model

    job = resolve_job(JobSpec.model_validate({"workload": {"hf_config": TINY_MISTRAL, "seq_len": seq_len}, "strategy": {"name": "single"}}))
    return build_model(job.model, seed=1).eval()


def test_a_mistral_config_is_built_as_llama_with_mistrals_exact_tensors_and_logits():
    import torch

    reference = mistral(TINY_MISTRAL)
    assert type(reference).__name__ == "MistralForCausalLM"
    model = ours(seq_len=16)
    assert type(model.model).__name__ == "LlamaModel"
    theirs = {name: tuple(p.shape) for name, p in reference.named_parameters()}
    assert {name: tuple(p.shape) for name, p in model.named_parameters()} == theirs
    model.load_state_dict(reference.state_dict(), strict=True)
    tokens = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), reference(tokens).logits, rtol=0, atol=1e-5)
        # beyond the window Mistral attends to less than the full causal attention built here
        longer = torch.randint(0, 256, (2, 48), generator=torch.Generator().manual_seed(1))
        assert not torch.allclose(model(longer), reference(longer).logits, atol=1e-3)
