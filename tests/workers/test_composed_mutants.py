"""Each composed layout broken in one dimension's reduction: the gradient check or the replica check catches it.

One 4-rank torchrun of gradcheck_driver.py (session fixture) runs the 2 × 2 layouts of
test_layouts.py through the checks' own code, as they are and with one fault each (driver docstring,
`COMPOSED_MUTANTS`): the hsdp, hybrid and `layout` composers, the last over replicas beside tp, pp ×
dp_shard, pp × tp, cp × dp_shard and ep × dp_shard (on `tiny` with experts), and pp × tp on a lab's
module (the module family's example, cut by its spec and sharded by its plan). The `3d` composer (pp ×
dp_shard × tp) needs 8 ranks; its three dimensions' reductions are the ones the pp × dp_shard and pp
× tp cases break, through the same composition (`workers.strategies.compose.Composed`).

A clean run passes both checks at the fp32 tolerance; a mutant fails exactly the checks named
for it in `CAUGHT_BY` (error above the tolerance) and passes the other: the gradient check sees
what is wrong in rank 0's copy, the one it reads; the replica check sees copies that should be
equal and are not — alone for HSDP's wrong replica (rank 0's is right), beside the gradient check
where TP leaves a block's input gradient unreduced (it names the norm where the partial sums land).
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from parallab.core.families.module import ALLOW_LIST_ENV
from tests.workers.conftest import TEST_ALLOWED_MODULES, make_job, run_driver
from tests.workers.gradcheck_driver import COMPOSED_CASES, MODULE_PP_TP, W1
from tests.workers.test_module_family import EXAMPLE_TENSORS
from workers.harness.gradcheck import canonical
from workers.harness.main import new_model
from workers.strategies import pipeline

# One launch of 4 ranks on 2 shared cores: about 30 s idle, several times that under load.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

GRADIENTS, REPLICAS = "gradients", "replicas"
CAUGHT_BY: dict[str, frozenset[str]] = {
    "dp_replicate×dp_shard": frozenset({REPLICAS}),
    "dp_shard×tp": frozenset({GRADIENTS}),
    "dp_replicate×tp": frozenset({GRADIENTS}),
    "pp×dp_shard": frozenset({GRADIENTS}),
    "pp×tp": frozenset({GRADIENTS, REPLICAS}),
    "cp×dp_shard": frozenset({REPLICAS}),
    "ep×dp_shard": frozenset({GRADIENTS}),
    MODULE_PP_TP: frozenset({GRADIENTS, REPLICAS}),
}
"""Which checks each composed mutant fails."""
FULL_PARAMS = 39
"""Parameters of the plain `tiny` model, each checked by its full name."""


@pytest.fixture(autouse=True)
def ranks_allow_list(monkeypatch: pytest.MonkeyPatch) -> None:
    """`stage_params` builds each layout's model here as a rank does, so with a rank's allow-list
    (what an engine hands its ranks): the lab module's entry point on it."""
    monkeypatch.setenv(ALLOW_LIST_ENV, ",".join(sorted(TEST_ALLOWED_MODULES)))


@pytest.fixture(scope="session")
def composed_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    began = time.monotonic()
    results: dict[str, dict[str, Any]] = run_driver(tmp_path_factory, "gradcheck_driver.py", nproc=4, timeout=600)
    print(f"composed mutants: one 4-rank launch, {time.monotonic() - began:.1f} s")
    return results


def plain_params(key: str) -> list[str]:
    """The plain-model names of layout `key`'s model (the dense `tiny`, or with experts for ep)."""
    case = COMPOSED_CASES[key]
    return [name for name, _ in new_model(make_job(case.strategy, 4, case.options, case.workload, trace=False)).named_parameters()]


def stage_params(key: str, stage: int) -> set[str]:
    """The plain-model names pipeline stage `stage` of layout `key` holds (the composer's split)."""
    case = COMPOSED_CASES[key]
    job = make_job(case.strategy, 4, case.options, case.workload, trace=False)
    model = new_model(job)
    stages = job.strategy_document()["options"]["pp"]
    per = model.cfg.num_layers // stages
    held = pipeline.split(model, stage=stage, stages=stages, layers=range(stage * per, (stage + 1) * per))
    return {canonical(name) for name, _ in held.named_parameters()}


def test_every_composer_is_covered():
    assert set(CAUGHT_BY) == set(COMPOSED_CASES)
    assert {case.strategy for case in COMPOSED_CASES.values()} == {"hsdp", "hybrid", "layout"}


@pytest.mark.parametrize("key", list(CAUGHT_BY))
def test_a_clean_composition_passes_both_checks(composed_results, key):
    check = composed_results[key]["unbroken"]
    assert check["passed"] and check["tolerance"] == 1e-5 and check["max_rel_err"] <= check["tolerance"], check
    tensors = EXAMPLE_TENSORS if key == MODULE_PP_TP else FULL_PARAMS
    assert check["params_checked"] == len(plain_params(key)) >= tensors and check["failing"] == [], check
    copies = check["replicas"]
    assert copies["passed"] and copies["divergent"] == [] and copies["max_rel_diff"] <= copies["tolerance"], copies


@pytest.mark.parametrize(("key", "shared"), [("dp_replicate×dp_shard", 2 * FULL_PARAMS), ("dp_replicate×tp", FULL_PARAMS), ("pp×tp", 1)])
def test_the_replica_check_compares_the_copies_a_layout_replicates(composed_results, key, shared):
    """Replicas hold a copy of every shard (hsdp: each parameter's two dp_shard halves; beside tp,
    every parameter); tp in a pipeline stage replicates at least that stage's norms."""
    assert composed_results[key]["unbroken"]["replicas"]["copies_compared"] >= shared


@pytest.mark.parametrize("key", list(CAUGHT_BY))
def test_each_mutant_fails_exactly_the_check_named_for_it(composed_results, key):
    check = composed_results[key]["broken"]
    copies = check["replicas"]
    gradients_caught = not check["passed"] and check["max_rel_err"] > 0.5
    replicas_caught = not copies["passed"] and copies["max_rel_diff"] > 0.5
    assert (gradients_caught, replicas_caught) == (GRADIENTS in CAUGHT_BY[key], REPLICAS in CAUGHT_BY[key]), check
    if not gradients_caught:
        assert check["max_rel_err"] <= check["tolerance"] and check["failing"] == [], "rank 0's copy is right"
    if not replicas_caught:
        assert copies["passed"] and copies["divergent"] == [], copies


def test_hsdp_one_replica_without_its_one_over_n_diverges_from_the_other(composed_results):
    """Replica 1 holds twice the mean of every shard: each dp_shard position's two replicas
    (ranks r and r + 2, replica-major) differ by the missing factor, everywhere."""
    copies = composed_results["dp_replicate×dp_shard"]["broken"]["replicas"]
    assert len(copies["divergent"]) == copies["copies_compared"] == 2 * FULL_PARAMS, copies
    assert {tuple(d["ranks"]) for d in copies["divergent"]} == {(0, 2), (1, 3)}
    assert all(d["rel_diff"] == pytest.approx(1.0, abs=1e-5) for d in copies["divergent"]), "2 × mean − mean, over the mean"


def test_a_lost_tp_shard_under_fsdp_fails_that_parameter_only(composed_results):
    check = composed_results["dp_shard×tp"]["broken"]
    assert check["failing"] == [W1] and check["worst_param"] == W1, check
    assert check["max_rel_err"] == pytest.approx(0.5**0.5, abs=0.1), "half the weight's gradient (one of two tp shards) zeroed"


def test_an_unreduced_tp_input_gradient_in_the_last_stage_fails_everything_upstream(composed_results):
    """The last block's attention input gradient left partial on each tp rank: every parameter
    before it (its norm, the earlier blocks, the first stage through the pipeline's send) is
    wrong; nothing after it is. Its norm is the only replicated copy that differs between the tp
    ranks: the next upstream all-reduce (the previous block's MLP input) makes the others' equal."""
    check = composed_results["pp×tp"]["broken"]
    norm = "layers.3.attention_norm.weight"
    upstream = stage_params("pp×tp", 0) | {n for n in stage_params("pp×tp", 1) if n.startswith("layers.2.")} | {norm}
    assert set(check["failing"]) == upstream and check["max_rel_err"] > 0.5, check
    copies = check["replicas"]
    assert [d["param"] for d in copies["divergent"]] == [norm] and copies["worst_ranks"] == [2, 3], copies


def test_an_unreduced_tp_input_gradient_in_a_lab_modules_last_stage_fails_everything_upstream(composed_results):
    """The same fault in the lab's module, cut by its spec and sharded by its plan: every
    parameter upstream of block 1's attention is wrong (its LayerNorm, stage 0 through the send),
    nothing after it. Its LayerNorm's copies differ between the last stage's tp ranks, and on the
    first stage so do the replicated parameters no all-reduce comes after — the rowwise layers'
    biases and the position table — since each tp rank there receives its own partial gradient."""
    check = composed_results[MODULE_PP_TP]["broken"]
    norm = {"lab.blocks.1.ln1.weight", "lab.blocks.1.ln1.bias"}
    assert set(check["failing"]) == stage_params(MODULE_PP_TP, 0) | norm and check["max_rel_err"] > 0.5, check
    copies = check["replicas"]
    last = {d["param"] for d in copies["divergent"] if d["ranks"] == [2, 3]}
    assert last == norm and copies["worst_param"] in norm, copies


def test_replicas_beside_tp_without_one_over_n_double_every_gradient(composed_results):
    check = composed_results["dp_replicate×tp"]["broken"]
    assert len(check["failing"]) == FULL_PARAMS and check["max_rel_err"] == pytest.approx(1.0, abs=1e-5), check


def test_a_summed_reduce_scatter_in_one_stage_fails_that_stage_only(composed_results):
    check = composed_results["pp×dp_shard"]["broken"]
    first, last = stage_params("pp×dp_shard", 0), stage_params("pp×dp_shard", 1)
    assert first and not first & last
    assert set(check["failing"]) == first and check["max_rel_err"] == pytest.approx(1.0, abs=1e-5), check


def test_one_cp_rank_without_its_one_over_n_diverges_from_the_other(composed_results):
    """cp rank 1 holds twice the mean of every FSDP shard: each shard's two cp copies (ranks r and
    r + 1, cp inside dp_shard on the mesh) differ by the missing factor; rank 0's copy, the one
    the gradient check reads, is right."""
    copies = composed_results["cp×dp_shard"]["broken"]["replicas"]
    assert len(copies["divergent"]) == copies["copies_compared"] == 2 * FULL_PARAMS, copies
    assert {tuple(d["ranks"]) for d in copies["divergent"]} == {(0, 1), (2, 3)}
    assert all(d["rel_diff"] == pytest.approx(1.0, abs=1e-5) for d in copies["divergent"]), "2 × mean − mean, over the mean"


def test_experts_left_summed_over_ep_beside_fsdp_fail_the_experts_only(composed_results):
    """Every expert weight (each rank's FSDP shard of its ep slice, gathered whole over both) at
    twice its gradient, every replicated weight right: the experts fail, by exactly the factor."""
    check = composed_results["ep×dp_shard"]["broken"]
    experts = {n for n in plain_params("ep×dp_shard") if n.rsplit(".", 1)[-1] in ("w1", "w2", "w3") and ".feed_forward." in n}
    assert experts and set(check["failing"]) == experts, check
    assert check["max_rel_err"] == pytest.approx(1.0, abs=1e-5), check
