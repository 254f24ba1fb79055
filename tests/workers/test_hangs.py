"""Hangs that name their collective, on real gloo jobs launched as a worker launches them
(`workers.launcher.launch`, torchrun, `workers.harness.main`), each with a fault injected through
the harness's test-only knob (`workers.harness.faults`, `PARALLAB_TEST_FAULT`):

- rank 1 calls barrier where rank 0 calls all_reduce: both ranks' collective timeout fires, each
  rank dumps its flight recorder, and the failure's first line names the sequence, both calls and
  the ranks — within the job's collective timeout, far inside its wall-clock limit;
- rank 3 of 4 never reaches the collective the others call: named as never arrived, with its
  last sequence there;
- the worker's wall-clock limit (no collective timeout): its SIGTERM reaches ranks stuck inside
  a collective, which still dump, and the analysis names the hang.

The analysis itself is unit-tested on synthetic dumps in tests/core/test_hangs.py.
"""

from __future__ import annotations

import json
import time

import pytest

from parallab.core.hangs import FORMAT
from parallab.core.jobs import resolve_job
from parallab.core.rundir import RunDir
from parallab.core.spec import JobSpec
from tests.workers.conftest import TRACE_CAP_BYTES
from workers.engines.outputs import failure_message, hang_report, node_flight
from workers.harness.faults import FAULT_ENV, parse
from workers.launcher import launch

pytestmark = pytest.mark.slow

WORKLOAD = {"model": "tiny", "steps": 2, "warmup_steps": 1, "seed": 0}


# The collective timeouts: how long a rank waits for a peer, so they must exceed the gap between
# ranks reaching one collective. Measured on 2 shared cores at load average 17: at most 0.5 s
# between 2 ranks, 1.6 s among 4 (the job's first collective, after each rank's start-up; every
# later one within 0.1 s); each test waits its timeout out once.
TIMEOUT_2_RANKS_S, TIMEOUT_4_RANKS_S = 3, 5


def _run(tmp_path, monkeypatch, fault: str, *, world: int, collective_timeout_s: float | None, timeout_s: float = 240):
    monkeypatch.setenv(FAULT_ENV, fault)
    job = resolve_job(JobSpec.model_validate({"workload": WORKLOAD, "strategy": {"name": "ddp", "world_size": world}}))
    run_dir = RunDir(tmp_path / f"run-{fault.replace(':', '-')}")
    began = time.monotonic()
    outcome = launch(
        job,
        run_dir,
        timeout_s=timeout_s,
        trace_cap_bytes=TRACE_CAP_BYTES,
        cache_dir=tmp_path / "cache",
        collective_timeout_s=collective_timeout_s,
    )
    return run_dir, outcome, time.monotonic() - began


def test_a_mismatched_collective_fails_within_its_timeout_naming_sequence_calls_and_ranks(tmp_path, monkeypatch) -> None:
    run_dir, outcome, took = _run(tmp_path, monkeypatch, "mismatch:1", world=2, collective_timeout_s=TIMEOUT_2_RANKS_S)
    assert not outcome.ok
    assert took < 120, f"took {took:.0f} s"
    report = hang_report(run_dir)
    assert report is not None and report.dumps == {0: "ok", 1: "ok"}, report
    assert report.calls == {0: "all_reduce(Float[8])", 1: "barrier"}
    assert report.group_desc == "default_pg" and report.group_ranks == [0, 1] and report.never_arrived == []
    message = failure_message(run_dir, outcome.reason or "", outcome.log_tail)
    first = message.splitlines()[0]
    assert first == (
        f"hang: ranks disagree at collective {report.sequence} of the world group (ranks 0, 1): "
        "rank 0 called all_reduce(Float[8]); rank 1 called barrier"
    ), first
    # The dumps stay in the run directory, torch's own dump inside each.
    for rank in (0, 1):
        dump = json.loads(run_dir.flight(rank).read_text())
        assert dump["format"] == FORMAT and dump["run"] == run_dir.path.name and dump["torch"]["entries"]
        assert dump["reason"].startswith(("RuntimeError", "stopped by SIGTERM")), dump["reason"]  # its timeout, or its peer's exit


def test_a_rank_that_never_reaches_the_collective_is_named_as_missing(tmp_path, monkeypatch) -> None:
    run_dir, outcome, _ = _run(tmp_path, monkeypatch, "absent:3", world=4, collective_timeout_s=TIMEOUT_4_RANKS_S)
    assert not outcome.ok
    report = hang_report(run_dir)
    assert report is not None and report.never_arrived == [3], report
    assert set(report.calls) == {0, 1, 2} and set(report.calls.values()) == {"all_reduce(Float[8])"}
    assert report.last_sequence == {3: report.sequence - 1}  # type: ignore[operator]
    assert report.reasons[3] == "stopped by SIGTERM"  # torchrun stopped it once the others failed
    first = failure_message(run_dir, outcome.reason or "", outcome.log_tail).splitlines()[0]
    assert first.startswith(f"hang: rank 3 never arrived at collective {report.sequence} of the world group (ranks 0, 1, 2, 3)"), first


def test_the_run_timeout_reaches_ranks_inside_a_collective_and_they_still_dump(tmp_path, monkeypatch) -> None:
    # No collective timeout (torch's 30 minutes): only the launcher's wall-clock limit ends it.
    run_dir, outcome, took = _run(tmp_path, monkeypatch, "mismatch:0", world=2, collective_timeout_s=None, timeout_s=45)
    assert outcome.reason == "timed out after 45 s" and took < 90
    report = hang_report(run_dir)
    assert report is not None and report.reasons == {0: "stopped by SIGTERM", 1: "stopped by SIGTERM"}, report
    assert report.calls == {0: "barrier", 1: "all_reduce(Float[8])"}


def test_the_knob_refuses_what_it_does_not_know() -> None:
    assert parse("absent:2") == ("absent", 2)
    for bad in ("mismatch", "absent:x", "hang:1"):
        with pytest.raises(ValueError, match=FAULT_ENV):
            parse(bad)


def test_a_node_hands_on_the_dumps_of_whatever_ranks_ran_on_it(tmp_path) -> None:
    """torchrun's c10d rendezvous numbers the nodes in the order they join, so node 1 of a gang can
    run global rank 0: the dumps its host's run directory holds go on, whichever ranks wrote them
    (read as node 1's rank 1, node 1 handed on nothing and the hang went unlocated)."""
    job = resolve_job(
        JobSpec.model_validate({"workload": {"model": "tiny"}, "strategy": {"name": "ddp", "world_size": 2}, "placement": {"nodes": 2}})
    )
    run_dir = RunDir(tmp_path / "node1")
    run_dir.path.mkdir()
    run_dir.flight(0).write_text('{"rank": 0}')
    assert node_flight(run_dir, job) == {0: '{"rank": 0}'}
