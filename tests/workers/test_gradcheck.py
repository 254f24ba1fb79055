"""The gradient check catches what the loss cannot: each strategy broken on purpose fails it.

One 2-rank torchrun of gradcheck_driver.py (session fixture) runs ddp, fsdp, tp, ring, moe, pp
and interleaved pp as they are and a mutant of each (driver docstring: a missing 1/N, a dropped
shard, a dropped micro-batch, one chunk's gradient doubled), through the check's own code; the tests read its JSON. The same launch runs the
faults only another rank's copy shows (an un-reduced DDP gradient on rank 1, a TP norm reduced on
one rank only): the gradient check misses them, the replica check names them.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.workers.conftest import run_driver

pytestmark = pytest.mark.slow

MUTATED = ("ddp", "fsdp", "tp", "ring", "moe", "tp_moe")
REPLICA_MUTANTS = {"ddp_unreduced": "layers.0.feed_forward.w1.weight", "tp_norm": "layers.0.ffn_norm.weight"}


@pytest.fixture(scope="module")
def gradcheck_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    results: dict[str, dict[str, Any]] = run_driver(tmp_path_factory, "gradcheck_driver.py", timeout=300)
    return results


PARAMS = {"tp_mla": 26}
"""Parameters a case's model has, where it is not the test workload's (39 or more): the tiny DeepSeek-V2."""


@pytest.mark.parametrize("name", [*MUTATED, "pp", "pp_interleaved", "tp_mla", *REPLICA_MUTANTS])
def test_every_strategy_as_it_is_passes_at_fp32_tolerance(gradcheck_results, name):
    check = gradcheck_results[name]["unbroken"]
    assert check["passed"] and check["tolerance"] == 1e-5 and check["max_rel_err"] <= 1e-5, check
    assert check["params_checked"] >= PARAMS.get(name, 39), "every parameter of the plain model, by its full name"
    copies = check["replicas"]
    assert copies["passed"] and copies["divergent"] == [], copies


@pytest.mark.parametrize(("name", "shared"), [("ddp", 39), ("ring", 39), ("moe", 1), ("tp_norm", 1)])
def test_the_replica_check_compares_the_copies_each_strategy_replicates(gradcheck_results, name, shared):
    """DDP and ring replicate every parameter; MoE at least its router and norms; TP its norms."""
    assert gradcheck_results[name]["unbroken"]["replicas"]["copies_compared"] >= shared


@pytest.mark.parametrize(("name", "param"), REPLICA_MUTANTS.items())
def test_a_copy_left_behind_on_one_rank_passes_the_gradient_check_and_fails_the_replica_check(gradcheck_results, name, param):
    broken = gradcheck_results[name]["broken"]
    assert broken["passed"], "the gradient check reads one copy only: this is what it cannot see"
    copies = broken["replicas"]
    assert not copies["passed"] and copies["max_rel_diff"] > copies["tolerance"], copies
    assert copies["worst_param"] == param and copies["worst_ranks"] == [0, 1], copies
    assert [d["param"] for d in copies["divergent"]] == [param], "only the broken copy differs"


def test_a_pipeline_that_drops_a_micro_batch_fails_the_gradient_check(gradcheck_results):
    broken = gradcheck_results["pp"]["broken"]
    assert not broken["passed"] and broken["max_rel_err"] > 0.1, broken


def test_an_interleaved_pipeline_with_one_chunks_gradient_doubled_fails_on_that_chunks_blocks(gradcheck_results):
    """Rank 0 holds stages 0 and 2 (one block each of tiny's 4); its second chunk, block 2, is doubled."""
    broken = gradcheck_results["pp_interleaved"]["broken"]
    assert not broken["passed"] and broken["max_rel_err"] == pytest.approx(1.0, abs=1e-4), broken
    assert broken["failing"] and all(name.startswith("layers.2.") for name in broken["failing"]), broken["failing"]


@pytest.mark.parametrize("name", MUTATED)
def test_each_broken_strategy_fails_the_check(gradcheck_results, name):
    check = gradcheck_results[name]["broken"]
    assert not check["passed"], check
    assert check["max_rel_err"] > 0.5, "a missing 1/N (N=2) is an error of 1, a dropped half-shard about 0.7"
    assert check["params_checked"] == gradcheck_results[name]["unbroken"]["params_checked"]


def test_the_worst_parameter_is_the_one_broken(gradcheck_results):
    assert gradcheck_results["tp"]["broken"]["worst_param"] == "layers.0.feed_forward.w1.weight"
    assert gradcheck_results["moe"]["broken"]["worst_param"].split(".")[-1] in ("w1", "w2", "w3"), "only the experts were left unaveraged"


def test_latent_attention_without_its_rotary_key_reduction_fails_the_check(gradcheck_results):
    """The shared rotary key is a small part of kv_a_proj_with_mqa's output (8 of 40 columns here),
    so the error is small — but hundreds of times the fp32 tolerance."""
    check = gradcheck_results["tp_mla"]["broken"]
    assert not check["passed"] and check["max_rel_err"] > 100 * check["tolerance"], check
    assert check["params_checked"] == gradcheck_results["tp_mla"]["unbroken"]["params_checked"] == 26
