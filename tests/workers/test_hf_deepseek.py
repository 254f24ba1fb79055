"""The `hf` family's DeepSeek-V2 from a config.json: in one process, the module the rank side builds
from the resolved config is `DeepseekV2ForCausalLM`'s parameter for parameter and, with its
weights, gives its logits; then run as the worker runs it — `ddp`, `fsdp` and `pp` at 2 ranks on
gloo (real torchrun jobs through the launcher, traced), each step's loss held against `single`'s
curve, step 0's gradients against `single`'s, and the communication measured from the trace equal
to what the family predicts for it.

The model is TINY_DEEPSEEK_V2 (hidden 64, 4 heads over a 32-wide key/value latent — query/key 16 +
8 rotary, value 16 —, block 0 a dense MLP 128 wide, block 1 MoE: 4 routed experts top-2 and 1
shared expert, 32 wide; vocabulary 256). Its router is the library's: a softmax over the experts,
greedy top-k per token, no capacity and no auxiliary loss in the model, so a rank's share of the
batch (or a micro-batch) routes exactly as the whole batch does — ddp, fsdp and pp match `single`
to float summation order. Tensor parallelism is refused for it (its latent feeds every head).
"""

from __future__ import annotations

import os

import pytest

from parallab.core.families import HF, model_tensors
from tests.core.hf_configs import TINY_DEEPSEEK_V2
from tests.workers.test_hf_family import cfg_of

pytest.importorskip("transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a config, never the hub

DEEPSEEK = {"hf_config": TINY_DEEPSEEK_V2}
"""The workload: the config file, resolved into the hf family's fields."""
RUNS = {"ddp": ("ddp", {}), "fsdp": ("fsdp", {}), "pp": ("pp", {})}
"""Each 2-rank job: strategy and options (pp: 2 stages of one block each, 4 micro-batches)."""
TENSORS = 26
"""Embedding, head, final norm; block 0: q, kv_a, kv_a norm, kv_b, o, gate/up/down, 2 norms (10);
block 1: the same attention and norms (7), the router, the two expert tensors, the shared expert's 3 (13)."""


def test_the_configs_model_is_the_librarys_deepseek_v2_tensor_for_tensor_and_logit_for_logit():
    import torch
    import transformers

    from workers.harness.families import build_model

    cfg = cfg_of(DEEPSEEK)
    assert (cfg.family, cfg.kv_lora_rank, cfg.num_experts, cfg.num_shared_experts, cfg.first_dense_layers) == ("hf", 32, 4, 1, 1)
    assert HF.architecture(cfg) == "DeepseekV2ForCausalLM"
    torch.manual_seed(0)
    keys = set(transformers.DeepseekV2Config.__dataclass_fields__)
    config = transformers.DeepseekV2Config(**{k: v for k, v in TINY_DEEPSEEK_V2.items() if k in keys and k != "rope_scaling"})
    reference = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").float().eval()
    model = build_model(cfg, seed=1).eval()
    assert {n: tuple(p.shape) for n, p in model.named_parameters()} == {n: tuple(p.shape) for n, p in reference.named_parameters()}
    assert len(list(model.parameters())) == len(model_tensors(cfg)) == TENSORS
    model.load_state_dict(reference.state_dict(), strict=True)
    tokens = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), reference(tokens).logits, rtol=0, atol=1e-5)


def test_the_router_picks_each_tokens_experts_alone():
    """What makes pp and a data-parallel shard route as the batch: a token's experts do not depend
    on the other tokens (the library's router at the built model's weights)."""
    import torch

    from workers.harness.families import build_model

    gate = build_model(cfg_of(DEEPSEEK), seed=0).model.layers["1"].mlp.gate
    x = torch.randn(6, 64, generator=torch.Generator().manual_seed(0))
    _, weights, experts = gate(x)
    _, alone_w, alone_e = gate(x[:2])
    assert torch.equal(experts[:2].sort().values, alone_e.sort().values) and torch.allclose(weights[:2].sum(-1), alone_w.sum(-1))


@pytest.mark.slow
@pytest.mark.parametrize("key", list(RUNS))
def test_deepseek_matches_single_in_loss_and_gradients(harness_job, key):
    strategy, options = RUNS[key]
    doc, _ = harness_job(strategy, 2, options, DEEPSEEK)
    assert doc.workload["family"] == "hf" and doc.workload["kv_lora_rank"] == 32
    assert len(doc.loss.values) == doc.workload["steps"] == len(doc.loss.reference)
    assert doc.summary.loss_max_rel_diff_vs_reference <= 1e-4, doc.loss
    check = doc.summary.gradient_check
    assert check is not None and check.passed and check.max_rel_err <= check.tolerance, check
    assert check.params_checked == TENSORS, "every tensor (both stages' under pp)"


@pytest.mark.slow
@pytest.mark.parametrize("key", list(RUNS))
def test_deepseek_communicates_exactly_what_the_family_predicts(harness_job, key):
    strategy, options = RUNS[key]
    doc, _ = harness_job(strategy, 2, options, DEEPSEEK)
    measured, predicted = doc.summary.comm_bytes_per_step, doc.prediction.comm_bytes_per_step
    assert predicted and measured == predicted, (measured, predicted)
    assert not [f for f in doc.flags if f.metric.startswith(("comm_bytes", "wire_bytes", "model_state"))], doc.flags


@pytest.mark.slow
def test_single_deepseek_is_its_own_reference_and_counts_what_the_module_holds(harness_job):
    doc, _ = harness_job("single", 1, {}, DEEPSEEK)
    assert doc.loss.values == doc.loss.reference and doc.loss.reference_source == "own"
    h, a, f, fe, v, e = 64, 4, 128, 32, 256, 4
    attention = h * a * 24 + h * 40 + 32 + 32 * a * 32 + a * 16 * h + 2 * h  # q, kv_a, its norm, kv_b, o; 2 norms
    total = 2 * attention + 3 * h * f + e * h + (e + 1) * 3 * h * fe + 2 * v * h + h
    assert doc.prediction.params_total == HF.param_counts(cfg_of(DEEPSEEK)).total == total == 122_496
