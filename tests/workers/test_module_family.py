"""The `module` family: a lab's own module built by an allow-listed entry point, held against its
contract, and trained under ddp, fsdp and tp (on the plan its spec declares) against `single`.

In one process: the example (`examples.lab_model:build`) builds exactly the parameters it
declares; each way of breaking the contract (`lab_builds`) is refused with an error naming
`workload.module` and what is wrong; the launcher refuses a module this worker does not list
before any rank starts, and a listed one whose build is wrong fails in the ranks with that error.
One 2-rank torchrun (module_driver.py, module fixture) runs ddp, fsdp, tp and pp on a 2-layer
example (pp with its P2P recorded per step), tp on a module that keeps a stored head count and pp
under a split that drops the last stage's block (the gradient check must fail both); one tp job
through the launcher (the session's `harness_job`) measures its communication against the
prediction. In one process, the split cuts the example where its spec says, each stage's forward
runs from the previous stage's output, and a spec a pipeline cannot cut is refused naming its field.
"""

from __future__ import annotations

from typing import Any

import pytest

from parallab.core.families.module import ALLOW_LIST_ENV
from parallab.core.model import ModelConfig
from parallab.core.rundir import RunDir
from tests.workers.conftest import TEST_ALLOWED_MODULES, make_job, run_driver
from tests.workers.module_driver import MODULE_WORKLOAD
from workers.launcher import launch

EXAMPLE_PARAMS = 136_832
"""The example at tiny's shape with 2 layers: (256 + 64)·64 + 2·(4·64² + 3·64 + 2·64·256 + 256 + 64 + 4·64) + 2·64 + 256·64."""
EXAMPLE_TENSORS = 2 + 2 * 15 + 3
"""Its tensors: tok, pos; 15 per block; the final norm's 2 and the head."""


@pytest.fixture(autouse=True)
def _listed_for_this_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """The builds in this process check the allow-list a rank would be handed: the tests' own."""
    monkeypatch.setenv(ALLOW_LIST_ENV, ",".join(sorted(TEST_ALLOWED_MODULES)))


def cfg_of(entry: str) -> ModelConfig:
    return make_job("single", 1, workload={**MODULE_WORKLOAD, "module": entry}, trace=False).model


def test_the_example_holds_the_parameters_it_declares():
    from examples.lab_model import build, param_count
    from workers.harness.families import build_meta

    cfg = cfg_of("examples.lab_model:build")
    model = build_meta(cfg)
    assert all(p.is_meta for p in model.parameters())
    assert model.params == build(cfg)[1]["params"] == param_count(256, 64, 2, 256, 64) == EXAMPLE_PARAMS
    assert len(model.blocks()) == 2 and {n.split(".")[1] for n, _ in model.named_parameters()} >= {"tok", "pos", "blocks", "head"}
    assert model.flops_per_token == 6 * (EXAMPLE_PARAMS - (256 + 64) * 64) + 12 * 2 * 64 * 64, "the declared FLOPs"


def test_without_declared_counts_the_parameters_are_counted_and_flops_are_six_psi():
    from workers.harness.families import build_meta

    model = build_meta(cfg_of("tests.workers.lab_builds:counted"))
    assert model.spec.params is None and model.params == EXAMPLE_PARAMS
    assert model.flops_per_token == 6 * EXAMPLE_PARAMS


WRONG_BUILDS = {
    "returns_a_module_alone": "must return (module, spec); it returned LabGPT",
    "returns_a_tensor_first": "must return an nn.Module first; it returned Tensor",
    "declares_one_parameter_too_many": f"declares {EXAMPLE_PARAMS + 1:,} parameters; the module it built holds {EXAMPLE_PARAMS:,}",
    "declares_missing_blocks": "declares blocks 'layers', which the built module does not have",
    "declares_a_block_that_is_no_container": "declares blocks 'norm', which is not a non-empty ModuleDict or ModuleList",
    "declares_an_unknown_style": "returned a spec that is not valid: tp_plan.head: Input should be 'colwise'",
    "declares_a_missing_plan_path": "declares block module 'attn.qkv', which the built module does not have",
    "no_such_function": "names nothing callable: module 'tests.workers.lab_builds' has no function 'no_such_function'",
    "declares_a_rowwise_layer_colwise": "declares a block_tp_plan tensor parallelism cannot apply: 'mlp' prepares its input but "
    "no module beneath it is rowwise: its output would stay sharded",
    "declares_a_norm_colwise": "declares 'norm' colwise, which needs a Linear or Embedding; it is a LayerNorm",
}


def test_the_other_families_plans_are_megatron_plans_too():
    """The rule a lab's plan is held to (`plan_problems`) holds of the plans the harness's own families declare."""
    from parallab.core.families import FAMILIES
    from parallab.core.families.base import plan_problems

    cfg = cfg_of("examples.lab_model:build").model_copy(update={"family": "parallab", "module": None})
    for family in FAMILIES.values():
        assert plan_problems(family.root_plan(cfg)) == [] and plan_problems(family.block_plan(cfg, 0)) == [], family.name


@pytest.mark.parametrize("name", list(WRONG_BUILDS))
def test_a_build_that_breaks_the_contract_is_refused_naming_the_field(name):
    from workers.harness.families import build_model
    from workers.harness.module import ModuleBuildError

    entry = f"tests.workers.lab_builds:{name}"
    with pytest.raises(ModuleBuildError) as caught:
        build_model(cfg_of(entry), seed=0)
    assert str(caught.value).startswith(f"workload.module: {entry!r} "), caught.value
    assert WRONG_BUILDS[name] in str(caught.value)


def test_a_module_whose_forward_returns_no_logits_is_refused_at_its_first_step():
    import torch

    from workers.harness.families import build_model
    from workers.harness.module import ModuleBuildError

    model = build_model(cfg_of("tests.workers.lab_builds:returns_no_logits"), seed=0)
    with pytest.raises(ModuleBuildError, match=r"forward must return logits of shape \(2, 8, 256\); it returned \(2,\)"):
        model(torch.zeros(2, 8, dtype=torch.long), labels=torch.zeros(2, 8, dtype=torch.long))


def test_the_launcher_refuses_an_entry_point_this_worker_does_not_list_even_of_a_listed_module(tmp_path):
    job = make_job("ddp", 2, workload=MODULE_WORKLOAD, trace=False)  # listed where it was resolved
    sibling = frozenset({"examples.lab_model:param_count"})  # another callable of the same module
    outcome = launch(job, RunDir(tmp_path / "run"), timeout_s=60, trace_cap_bytes=1 << 20, allowed_modules=sibling)
    assert not outcome.ok and outcome.returncode is None, "no rank was started"
    assert outcome.reason is not None
    assert outcome.reason.startswith("workload.module: entry point 'examples.lab_model:build' is not on this worker's allow-list")
    assert "param_count" not in outcome.reason, "a refusal does not list what the allow-list holds"
    default = launch(job, RunDir(tmp_path / "default"), timeout_s=60, trace_cap_bytes=1 << 20)
    assert default.returncode is None and default.reason is not None and "is not on this worker's" in default.reason, "empty by default"


@pytest.mark.parametrize("entry", ["examples.lab_model:param_count", "examples.lab_model:LabGPT", "examples.lab_model:__class__"])
def test_a_rank_refuses_an_entry_point_its_engine_did_not_hand_it(entry, monkeypatch):
    """The rank's own check: only the listed callable is imported, whatever reached the rank."""
    from workers.harness.families import build_model
    from workers.harness.module import ModuleBuildError

    monkeypatch.setenv(ALLOW_LIST_ENV, "examples.lab_model:build")
    cfg = cfg_of("examples.lab_model:build").model_copy(update={"module": entry})
    with pytest.raises(ModuleBuildError, match=r"is refused: entry point .* is not on this rank's allow-list") as caught:
        build_model(cfg, seed=0)
    assert str(caught.value).startswith(f"workload.module: {entry!r} ")
    monkeypatch.delenv(ALLOW_LIST_ENV)
    with pytest.raises(ModuleBuildError, match="is refused"):
        build_model(cfg.model_copy(update={"module": "examples.lab_model:build"}), seed=0)


@pytest.mark.slow
def test_a_listed_module_whose_build_is_wrong_fails_in_the_ranks_with_the_error(tmp_path):
    from tests.workers.conftest import TEST_ALLOWED_MODULES

    entry = "tests.workers.lab_builds:declares_one_parameter_too_many"
    job = make_job("single", 1, workload={**MODULE_WORKLOAD, "module": entry}, trace=False)
    outcome = launch(job, RunDir(tmp_path / "run"), timeout_s=300, trace_cap_bytes=1 << 20, allowed_modules=TEST_ALLOWED_MODULES)
    assert not outcome.ok and outcome.returncode not in (None, 0)
    assert f"ModuleBuildError: workload.module: {entry!r} declares {EXAMPLE_PARAMS + 1:,} parameters" in outcome.log_tail


@pytest.fixture(scope="module")
def module_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    results: dict[str, Any] = run_driver(tmp_path_factory, "module_driver.py", timeout=300)
    return results


PP_WRONG_BUILDS = {
    "declares_no_last_stage": "declares no last_stage: pipeline parallelism needs the last stage's (final norm, head) root modules",
    "leaves_positions_off_the_first_stage": "puts pos.weight in neither blocks, first_stage nor last_stage",
    "keeps_its_blocks_in_a_list": "declares blocks 'blocks' (ModuleList): pipeline parallelism needs a ModuleDict keyed '0'..'1'",
    "ties_its_head_to_the_embedding": "shares one parameter as tok.weight (first_stage) and head.weight (last_stage)",
}


@pytest.mark.parametrize("name", list(PP_WRONG_BUILDS))
def test_a_spec_a_pipeline_cannot_cut_is_refused_naming_the_field(name):
    """These build, and run unsplit; the pipeline's split asks for the spec's ends and refuses."""
    from workers.harness.families import build_meta
    from workers.harness.module import ModuleBuildError
    from workers.strategies.pipeline import split

    entry = f"tests.workers.lab_builds:{name}"
    model = build_meta(cfg_of(entry))
    with pytest.raises(ModuleBuildError) as caught:
        split(model, stage=0, stages=2, layers=range(1))
    assert str(caught.value).startswith(f"workload.module: {entry!r} ") and PP_WRONG_BUILDS[name] in str(caught.value), caught.value


@pytest.mark.parametrize("stage", [0, 1])
def test_each_stage_holds_its_end_and_its_block_and_runs_from_the_previous_stage(stage):
    """The spec's split on the wrapper's paths: stage 0 the embeddings and block 0, stage 1 block 1,
    the final norm and the head — every parameter on exactly one stage; stage 0 maps token ids to
    the residual stream, stage 1 that stream to logits."""
    import torch

    from workers.harness.families import build_meta
    from workers.strategies.pipeline import split

    cfg = cfg_of("examples.lab_model:build")
    whole = {name for name, _ in build_meta(cfg).named_parameters()}
    held = split(build_meta(cfg), stage=stage, stages=2, layers=range(stage, stage + 1))
    names = {name for name, _ in held.named_parameters()}
    ends = ("lab.tok.", "lab.pos.") if stage == 0 else ("lab.norm.", "lab.head.")
    assert {n for n in names if not n.startswith("lab.blocks.")} == {n for n in whole if n.startswith(ends)}
    assert {n.split(".")[2] for n in names if n.startswith("lab.blocks.")} == {str(stage)}
    other = {name for name, _ in split(build_meta(cfg), stage=1 - stage, stages=2, layers=range(1 - stage, 2 - stage)).named_parameters()}
    assert names | other == whole and not names & other
    b, t, h, v = 2, cfg.seq_len, cfg.hidden_size, cfg.vocab_size
    given = torch.zeros(b, t, dtype=torch.long, device="meta") if stage == 0 else torch.zeros(b, t, h, device="meta")
    assert tuple(held(given).shape) == ((b, t, h) if stage == 0 else (b, t, v))


def test_a_stage_whose_forward_returns_no_residual_stream_is_refused_at_its_first_step():
    import torch

    from workers.harness.families import build_meta
    from workers.harness.module import ModuleBuildError
    from workers.strategies.pipeline import split

    held = split(build_meta(cfg_of("examples.lab_model:build")), stage=0, stages=2, layers=range(1))
    held.lab.get_submodule("blocks.0").forward = lambda x: x[..., :1]  # a block that narrows the stream
    with pytest.raises(ModuleBuildError, match=r"must return the residual stream .* of shape \(2, 64, 64\); it returned \(2, 64, 1\)"):
        held(torch.zeros(2, 64, dtype=torch.long, device="meta"))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ddp", "fsdp", "tp", "pp"])
def test_each_strategy_matches_single_in_loss_and_gradients(module_results, name):
    case = module_results[name]
    check = case["gradient_check"]
    assert check["passed"] and check["tolerance"] == 1e-5 and check["max_rel_err"] <= 1e-5, check
    assert check["params_checked"] == EXAMPLE_TENSORS, "every tensor (under pp: gathered from both stages)"
    assert case["loss_max_rel_diff"] <= 1e-4, (case["losses"], case["reference"])
    assert len(case["losses"]) == 3
    assert case["params"] == module_results["reference_params"] == EXAMPLE_PARAMS


@pytest.mark.slow
def test_a_module_that_stores_its_head_count_fails_the_gradient_check_under_tp(module_results):
    """No declaration check sees a forward that splits its q/k/v shard into the whole model's head
    count; it runs, and the gradient check against `single` says it computes something else."""
    check = module_results["tp-stored-heads"]["gradient_check"]
    assert not check["passed"] and check["max_rel_err"] > 0.1, check
    assert check["worst_param"].startswith("lab.blocks.") and ".attn." in check["worst_param"], check


@pytest.mark.slow
def test_tp_communicates_exactly_what_is_predicted(harness_job):
    """The spec's plan is Megatron's, so the module's step runs the prediction's collectives to the
    byte: (4L + 2) all-reduces of b·s·h and the logits' all-gather (`parallab.core.dims.tp`)."""
    doc, _ = harness_job("tp", 2, workload=MODULE_WORKLOAD)
    measured, predicted = doc.summary.comm_bytes_per_step, doc.prediction.comm_bytes_per_step
    assert predicted and measured == predicted, (measured, predicted)
    assert set(measured) == {"all_reduce", "all_gather"}, measured
    assert doc.summary.gradient_check is not None and doc.summary.gradient_check.passed, doc.summary.gradient_check
    assert doc.summary.loss_max_rel_diff_vs_reference is not None and doc.summary.loss_max_rel_diff_vs_reference <= 1e-4


@pytest.mark.slow
def test_pp_sends_exactly_the_residual_stream_predicted(module_results):
    """Each step, stage 0 sends each micro-batch's residual stream (rows × sequence × hidden,
    fp32) and receives its gradient; stage 1 the reverse: the prediction to the byte, on every
    rank and every step after the first (which also sends the stage's shape metadata once)."""
    case = module_results["pp"]
    predicted = case["predicted"]
    job = make_job("pp", 2, workload=MODULE_WORKLOAD, trace=False)
    stream = job.workload.global_batch_size * job.model.seq_len * job.model.hidden_size * 4
    assert predicted == {"send": stream, "recv": stream}, predicted
    for rank, steps in enumerate(case["p2p_per_step"]):
        assert len(steps) == 1 + 1 + 3, "the gradient check's step, the warm-up step and 3 steps"
        assert all(step == predicted for step in steps[1:]), (rank, steps)
        assert all(0 < steps[0][op] - predicted[op] < 1024 for op in predicted), (rank, steps[0])


@pytest.mark.slow
def test_a_split_that_drops_a_block_fails_the_gradient_check(module_results):
    """The last stage keeps no block: the pipeline trains, and the gradient check (block 1's
    gradients missing, block 0's wrong) and the loss curve both see it."""
    case = module_results["pp-drops-a-block"]
    check = case["gradient_check"]
    assert not check["passed"] and check["max_rel_err"] >= 1.0 and check["worst_param"].startswith("lab.blocks."), check
    assert check["params_checked"] == EXAMPLE_TENSORS, "every tensor of the reference, the dropped block's too"
    assert case["loss_max_rel_diff"] > 1e-4, (case["losses"], case["reference"])
