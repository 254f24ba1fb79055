"""Measured against predicted: every strategy's communication per op, FSDP's model state vs DDP's.

Real torchrun jobs of the harness on gloo (`tiny`, 3 measured steps after 1 warm-up), merged by
`workers.aggregate.build_result` exactly as the worker does; the file's 2-rank jobs share one
torchrun and its 4-rank jobs another (tests/workers/jobs_driver.py runs the harness's
`run_training` for each in turn), as tests/workers/test_strategies.py does.
"""

from __future__ import annotations

import json

import pytest

from parallab.core.jobs import Limits, ResolvedJob, resolve_job
from parallab.core.spec import JobSpec
from tests.workers.conftest import TRACE_CAP_BYTES, run_job, run_jobs_together

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

pytestmark = pytest.mark.slow


FOLDED = [  # every job this file reads, as (strategy, world size, options, workload): launched together
    *((name, n, options, {}) for name, n, options in CASES),
    ("fsdp", 2, {}, {"precision": "bf16"}),
    ("fsdp", 4, {}, {}),
]


def _job(strategy: str, n: int, options: dict | None, workload: dict | None) -> ResolvedJob:
    spec = JobSpec.model_validate(
        {
            "workload": {"model": "tiny", "steps": 3, "warmup_steps": 1, **(workload or {})},
            "strategy": {"name": strategy, "world_size": n, "options": options or {}},
        }
    )
    return resolve_job(spec, Limits(max_world_size=8))


def _key(strategy: str, n: int, options: dict | None, workload: dict | None) -> tuple[str, int, str, str]:
    return (strategy, n, json.dumps(options or {}, sort_keys=True), json.dumps(workload or {}, sort_keys=True))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The result document of a job, each launched once: the file's jobs (`FOLDED`) in one torchrun
    per world size (`run_jobs_together`: the harness's own `run_training` for each in turn, merged
    by `build_result` as the worker merges them), so a rank imports the harness once, not per job."""
    cache = {}
    root = tmp_path_factory.mktemp("prediction-agreement")
    for world in sorted({n for _, n, _, _ in FOLDED}):
        specs = [spec for spec in FOLDED if spec[1] == world]
        dirs = [root / f"{name}{n}-{i}" for i, (name, n, _, _) in enumerate(specs)]
        docs = run_jobs_together([_job(*spec) for spec in specs], dirs, cache_dir=root / "cache", trace_cap_bytes=TRACE_CAP_BYTES)
        cache.update({_key(*spec): doc for spec, doc in zip(specs, docs, strict=True)})

    def launch(strategy: str, n: int, options: dict | None = None, workload: dict | None = None):
        key = _key(strategy, n, options, workload)
        if key not in cache:  # a job outside FOLDED: alone, through the worker's launcher
            cache[key] = run_job(_job(strategy, n, options, workload), tmp_path_factory.mktemp(f"{strategy}{n}"), cache_dir=None)
        return cache[key]

    return launch


@pytest.mark.parametrize(("strategy", "n", "options"), CASES, ids=lambda v: json.dumps(v) if isinstance(v, dict) else str(v))
def test_comm_bytes_match_prediction_within_10_percent(run, strategy, n, options):
    doc = run(strategy, n, options)
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
