"""The `hf` family's models from their config.json files, run as the worker runs them at 2 ranks
on gloo (real torchrun jobs through the launcher, traced): each step's loss held against
`single`'s curve, step 0's gradients against `single`'s, and the communication measured from the
trace equal to what the family predicts.

- TINY_LLAMA (Llama 3's config at `tiny`'s width: 4 heads over 2 KV heads, 2 layers): tp, its
  grouped K/V heads split over the ranks, with its bytes. Its ddp and fsdp (and tp, tp with sequence
  parallelism) are test_hf_family.py's untraced driver's, on the same architecture, against the same
  `single`; their bytes are the parameter bytes, which the family predicts the same way for Qwen2's
  ddp and fsdp below (Llama's shape plus the q/k/v biases). Its pp is test_hf_pipeline.py's.
- TINY_QWEN2 (Qwen2.5's: the same with q/k/v biases): ddp, fsdp, tp and pp.
- TINY_MIXTRAL (2 layers of 4 experts, top-2): ddp, fsdp and tp, whose plan splits the attention
  and leaves each MoE block whole on both ranks, and ep=2 (`moe`). Its experts are the library's:
  dropless, routing each token alone, so a rank's share of the batch routes exactly as the whole
  batch does. Its pp run is test_hf_pipeline.py's.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from parallab.core.families import HF, model_tensors
from tests.core.hf_configs import TINY_LLAMA, TINY_MIXTRAL, TINY_QWEN2
from tests.workers.test_hf_deepseek import assert_comm_is_predicted
from tests.workers.test_hf_family import cfg_of

pytest.importorskip("transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a config, never the hub

pytestmark = pytest.mark.slow

CONFIGS: dict[str, dict[str, Any]] = {
    "llama": {"hf_config": TINY_LLAMA},
    "qwen2": {"hf_config": TINY_QWEN2},
    "mixtral": {"hf_config": TINY_MIXTRAL},
}
"""Each workload: a config file, resolved into the hf family's fields."""
RUNS = [("llama", "tp")] + [("qwen2", s) for s in ("ddp", "fsdp", "tp", "pp")]
RUNS += [("mixtral", s) for s in ("ddp", "fsdp", "tp")]
EP = ("moe", 2, {"aux_loss_coef": 0.0}, CONFIGS["mixtral"])
"""Mixtral under expert parallelism: 2 of the 4 experts a rank, no load-balancing loss (the library's model has none)."""
ARCHITECTURES = {"llama": ("LlamaForCausalLM", 0, 21), "qwen2": ("Qwen2ForCausalLM", 0, 27), "mixtral": ("MixtralForCausalLM", 4, 21)}
"""What each config resolves to: the library's class, its experts, and its parameter tensors."""


@pytest.fixture(scope="module", autouse=True)
def hf_runs(harness_jobs) -> None:
    """The eight 2-rank jobs of RUNS and EP in one launch (`harness_jobs`), read through `harness_job`'s memo."""
    harness_jobs([*((strategy, 2, {}, CONFIGS[model]) for model, strategy in RUNS), EP])


@pytest.mark.parametrize(("model", "strategy"), RUNS)
def test_each_run_matches_single_in_loss_and_gradients(harness_job, model, strategy):
    doc, _ = harness_job(strategy, 2, workload=CONFIGS[model])
    architecture, experts, tensors = ARCHITECTURES[model]
    assert doc.workload["family"] == "hf" and doc.workload["num_experts"] == experts
    assert HF.architecture(cfg_of(CONFIGS[model])) == architecture
    assert len(doc.loss.values) == doc.workload["steps"] == len(doc.loss.reference)
    assert doc.summary.loss_max_rel_diff_vs_reference <= 1e-5, doc.loss
    check = doc.summary.gradient_check
    assert check is not None and check.passed and check.max_rel_err <= check.tolerance == 1e-5, check
    assert check.params_checked == len(model_tensors(cfg_of(CONFIGS[model]))) == tensors


@pytest.mark.parametrize(("model", "strategy"), RUNS)
def test_each_run_communicates_exactly_what_the_family_predicts(harness_job, model, strategy):
    doc, _ = harness_job(strategy, 2, workload=CONFIGS[model])
    measured, predicted = doc.summary.comm_bytes_per_step, doc.prediction.comm_bytes_per_step
    assert predicted and measured == predicted, (measured, predicted)
    assert not [f for f in doc.flags if f.metric.startswith(("comm_bytes", "wire_bytes", "model_state"))], doc.flags


def test_mixtral_under_expert_parallelism_matches_single_and_communicates_what_it_predicts(harness_job):
    """ep=2: each rank holds 2 of the 4 experts (the library's fused tensors, sliced on dim 0) and
    sends every routed slot to its expert's rank by all-to-all; no load-balancing loss (0)."""
    doc, _ = harness_job(*EP)
    assert doc.summary.loss_max_rel_diff_vs_reference <= 1e-4, doc.loss
    check = doc.summary.gradient_check
    assert check is not None and check.passed and check.params_checked == 21, check
    assert_comm_is_predicted(doc)
