"""Measured against predicted: every strategy's communication per op, FSDP's model state vs DDP's.

Real torchrun jobs of the harness on gloo (`tiny`, 3 measured steps after 1 warm-up), merged by
`workers.aggregate.build_result` exactly as the worker does.
"""

from __future__ import annotations

import json

import pytest

from parallab.core.jobs import Limits, resolve_job
from parallab.core.spec import JobSpec
from tests.workers.conftest import run_job

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


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Launch (once per strategy and world size) and return the result document."""
    cache = {}

    def launch(strategy: str, n: int, options: dict | None = None):
        key = (strategy, n, json.dumps(options or {}, sort_keys=True))
        if key not in cache:
            spec = JobSpec.model_validate(
                {
                    "workload": {"model": "tiny", "steps": 3, "warmup_steps": 1},
                    "strategy": {"name": strategy, "world_size": n, "options": options or {}},
                }
            )
            job = resolve_job(spec, Limits(max_world_size=8))
            cache[key] = run_job(job, tmp_path_factory.mktemp(f"{strategy}{n}"), cache_dir=None)
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
