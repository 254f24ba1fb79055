"""A result document held against itself (`parallab.core.checks`): its summary recomputed from its
ranks, each stated field within its tolerance or named as a problem."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from parallab.core.checks import BYTES, FLOAT, check_summary, not_checked, replays_routing, summary_inputs
from parallab.core.jobs import resolve_job
from parallab.core.result import ResultDocument
from parallab.core.spec import JobSpec
from tests.ui.factories import make_document


def doc(**summary) -> ResultDocument:
    d = make_document(strategy="ddp", world_size=2, tokens_per_s=12_000.0).model_dump(mode="json")
    d["summary"].update(summary)
    return ResultDocument.model_validate(d)


def problems(document: ResultDocument) -> list[str]:
    return [".".join(map(str, p.loc)) for p in check_summary(document).problems]


def test_the_tolerances():
    assert FLOAT.agrees(1.0, 1.0 + 9e-7) and not FLOAT.agrees(1.0, 1.0 + 2e-6)
    assert BYTES.agrees(1000, 1001) and not BYTES.agrees(1000, 1002)


def test_a_worker_made_summary_passes_and_comes_back_unchanged_but_for_the_stated_checks_label():
    document = doc()
    checked = check_summary(document)
    assert checked.problems == []
    assert checked.summary == {
        **document.summary.model_dump(mode="json"),
        "checks_stated": ["gradient_check", "replica_check", "frozen_check"],
    }


def test_every_disagreeing_field_is_named():
    stated = doc().summary
    bad = doc(tokens_per_s=stated.tokens_per_s * 1.001, comm_time_fraction=0.9, peak_rss_bytes_max=1)
    assert problems(bad) == ["summary.tokens_per_s", "summary.peak_rss_bytes_max", "summary.comm_time_fraction"]


def test_formula_fields_are_recomputed_never_refused():
    checked = check_summary(doc(model_flops_per_token=1.0, tflops_per_s=99.0, mfu=0.5))
    assert checked.problems == []
    assert checked.summary["model_flops_per_token"] != 1.0 and checked.summary["tflops_per_s"] != 99.0
    assert checked.summary["mfu"] == 0.5  # a CPU has no known peak: what was stated is kept


def test_fields_no_rank_speaks_of_are_kept_as_stated():
    checked = check_summary(doc(gradient_check={"passed": False, "tolerance": 1e-5, "max_rel_err": 0.5, "params_checked": 3}))
    assert checked.problems == [] and checked.summary["gradient_check"]["max_rel_err"] == 0.5


def test_a_document_without_step_times_cannot_be_checked():
    d = doc().model_dump(mode="json")
    for rank in d["ranks"]:
        rank["step_times_s"] = []
    assert problems(ResultDocument.model_validate(d)) == ["ranks"]


def test_inputs_come_from_the_resolved_workload():
    inputs = summary_inputs(doc())
    assert (inputs.tokens_per_step, inputs.samples_per_step) == (8 * 64, 8)
    assert inputs.flops_per_token == pytest.approx(doc().summary.model_flops_per_token)


GRADIENTS = {
    "passed": True,
    "tolerance": 1e-5,
    "max_rel_err": 3e-7,
    "worst_param": "b",
    "params_checked": 2,
    "per_param": {"a": 1e-7, "b": 3e-7},
}


def test_a_gradient_check_is_held_against_its_own_per_parameter_errors():
    assert problems(doc(gradient_check=GRADIENTS)) == []
    lied = {**GRADIENTS, "max_rel_err": 1e-7, "worst_param": "a", "params_checked": 3}
    assert problems(doc(gradient_check=lied)) == [
        "summary.gradient_check.max_rel_err",
        "summary.gradient_check.worst_param",
        "summary.gradient_check.params_checked",
    ]


def test_a_gradient_check_whose_verdict_contradicts_its_error_is_refused():
    with pytest.raises(ValidationError, match="passed is True but max_rel_err 1 vs tolerance 1e-05"):
        doc(gradient_check={**GRADIENTS, "max_rel_err": 1.0, "per_param": {"a": 1e-7, "b": 1.0}})


def test_the_end_of_run_check_applies_to_every_training_run_and_the_routing_check_to_replayed_moe():
    """A dense run needs no routing check; a replayed MoE run without one, or any training run
    without its end-of-run check, is not checked — never passed."""
    dense = make_document(strategy="ddp", world_size=2, tokens_per_s=12_000.0).model_dump(mode="json")
    assert not_checked(ResultDocument.model_validate(dense)) == []
    dense["summary"].pop("frozen_check")
    assert not_checked(ResultDocument.model_validate(dense)) == ["frozen_check"]
    moe = make_document(strategy="moe", world_size=2, tokens_per_s=12_000.0).model_dump(mode="json")
    moe_doc = ResultDocument.model_validate(moe)
    assert replays_routing(resolve_job(JobSpec.model_validate({"workload": moe_doc.workload, "strategy": moe_doc.strategy.model_dump()})))
    assert not_checked(moe_doc) == []
    moe["summary"].pop("routing_check")
    assert not_checked(ResultDocument.model_validate(moe)) == ["routing_check"]
