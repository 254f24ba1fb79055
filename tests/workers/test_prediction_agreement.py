"""Measured against predicted: every strategy's communication per op, FSDP's model state vs DDP's.

Real torchrun jobs of the harness on gloo (the `tiny-runs` group's test workload: `tiny`, 3
measured steps after 1 warm-up), merged by `workers.aggregate.build_result` exactly as the worker
does. The file is one of the `tiny-runs` group (tests/conftest.py) and declares its jobs
(`HARNESS_JOBS`): they fold into the group's one 2-rank and one 4-rank launch, and the six it
shares with test_strategies.py (ddp, fsdp, tp, tp with sequence parallelism at 2, hybrid and
fsdp at 4) are launched once for both files. Byte counts, model state and the bubble follow the
shapes, not the group's learning rate (1e-2), with one exception: MoE's all-to-alls follow its
router, and at 1e-2 the routing drifts until capacity drops a quarter of the slots (1.61 MB measured
against 2.10 MB predicted), so the moe case keeps the default learning rate (`WORKLOADS`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from parallab.core.result import ResultDocument
from tests.workers.conftest import HarnessSpec

CASES = [  # (strategy, world size, options): every strategy, and the options that change the traffic
    ("ddp", 2, {}),
    ("fsdp", 2, {}),
    ("fsdp", 2, {"reshard_after_forward": False}),
    ("tp", 2, {}),
    ("tp", 2, {"sequence_parallel": True}),
    ("pp", 2, {}),
    ("ring", 2, {}),
    ("moe", 2, {}),
    ("hybrid", 4, {}),
]

WORKLOADS: dict[str, dict[str, Any]] = {"moe": {"lr": None}}
"""A case's workload over the group's, by strategy: the moe case at the default learning rate."""

# The group's first test pays for its folded launches, whichever file it is in (test_layouts.py).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


HARNESS_JOBS: list[HarnessSpec] = [  # every job this file reads, as (strategy, world size, options, workload)
    *((name, n, options, WORKLOADS.get(name, {})) for name, n, options in CASES),
    ("fsdp", 2, {}, {"precision": "bf16"}),
    ("fsdp", 4, {}, {}),
]
"""What this file reads from `harness_job`, declared to the `tiny-runs` group's folded launches."""


@pytest.fixture(scope="module")
def run(harness_job: Callable[..., Any]) -> Callable[..., ResultDocument]:
    """The result document of a job, launched once a session (`harness_job`): a declared job with
    the group's others of its world size, in one torchrun per world size."""

    def launch(strategy: str, n: int, options: dict[str, Any] | None = None, workload: dict[str, Any] | None = None) -> ResultDocument:
        doc: ResultDocument = harness_job(strategy, n, options, workload)[0]
        return doc

    return launch


@pytest.mark.parametrize(("strategy", "n", "options"), CASES, ids=lambda v: json.dumps(v) if isinstance(v, dict) else str(v))
def test_comm_bytes_match_prediction_within_10_percent(run, strategy, n, options):
    doc = run(strategy, n, options, WORKLOADS.get(strategy))
    predicted = doc.prediction.comm_bytes_per_step
    measured = doc.summary.comm_bytes_per_step
    assert predicted, "every parallel strategy communicates"
    for op, nbytes in predicted.items():
        assert measured.get(op, 0) == pytest.approx(nbytes, rel=0.10), (op, measured, predicted)
    total = sum(predicted.values())
    assert all(measured[op] <= 0.01 * total for op in set(measured) - set(predicted)), (measured, predicted)
    assert not [f for f in doc.flags if f.metric.startswith("comm_bytes_per_step")]
    assert all(r.comm and all(op.time_s > 0 for op in r.comm) for r in doc.ranks)
    # bytes on the wire, measured from each call's own group size, against the prediction's
    wire = doc.summary.wire_bytes_per_step
    for op, nbytes in doc.prediction.wire_bytes_per_step.items():
        assert wire.get(op, 0) == pytest.approx(nbytes, rel=0.10), (op, wire, doc.prediction.wire_bytes_per_step)
    assert not [f for f in doc.flags if f.metric.startswith("wire_bytes_per_step")]


def test_tp_all_reduces_are_megatrons_four_per_layer_exactly(run):
    """Per layer 2 forward + 2 backward all-reduces of b·s·h, + the embedding's (forward) and the
    head's input gradient (backward); the logits' all-gather — measured equal to the formula."""
    doc = run("tp", 2)
    cfg = doc.workload
    layers, bsh = cfg["num_layers"], cfg["global_batch_size"] * cfg["seq_len"] * cfg["hidden_size"] * 4  # fp32, whole batch per rank
    for rank in doc.ranks:
        ops = {op.op: op for op in rank.comm}
        assert ops["all_reduce"].count == 4 * layers + 2
        assert ops["all_reduce"].bytes == (4 * layers + 2) * bsh == doc.prediction.comm_bytes_per_step["all_reduce"]
        assert ops["all_gather"].bytes == doc.prediction.comm_bytes_per_step["all_gather"]
        assert (ops["all_reduce"].group_size, ops["all_reduce"].wire_bytes) == (2, (4 * layers + 2) * bsh)  # 2(n−1)/n = 1
    assert doc.summary.wire_bytes_per_step == doc.prediction.wire_bytes_per_step


def test_fsdp_mixed_precision_all_gathers_16_bit_params_on_cpu_as_predicted(run):
    """bf16: FSDP2's param_dtype is bf16 on CPU too, so the all-gathers carry half of fp32's bytes,
    exactly as predicted; gradients are reduce-scattered in fp32 (reduce_dtype)."""
    fp32, bf16 = run("fsdp", 2), run("fsdp", 2, {}, {"precision": "bf16"})
    measured, predicted = bf16.summary.comm_bytes_per_step, bf16.prediction.comm_bytes_per_step
    assert measured == predicted
    assert 2 * measured["all_gather"] == fp32.summary.comm_bytes_per_step["all_gather"]
    assert measured["reduce_scatter"] == fp32.summary.comm_bytes_per_step["reduce_scatter"]
    assert bf16.summary.wire_bytes_per_step == bf16.prediction.wire_bytes_per_step
    assert not bf16.flags, bf16.flags  # activations too: the 16-bit stream is predicted


@pytest.mark.parametrize("n", [2, 4])
def test_fsdp_model_state_is_one_nth_of_ddp(run, n):
    ddp = run("ddp", 2).ranks[0].model_state_bytes  # a full replica, whatever the world size
    for rank in run("fsdp", n).ranks:
        for part in ("params", "grads", "optimizer"):
            assert getattr(rank.model_state_bytes, part) == pytest.approx(getattr(ddp, part) / n, rel=0.10)
    doc = run("fsdp", n)
    assert doc.ranks[0].model_state_bytes.params == doc.prediction.model_state_bytes_per_rank.params


def test_pipeline_reports_a_bubble_and_others_do_not(run):
    assert run("pp", 2).summary.bubble_fraction is not None
    assert run("pp", 2).prediction.bubble_fraction == pytest.approx(0.2)
    assert run("ring", 2).summary.bubble_fraction is None  # ring P2P is not a pipeline
