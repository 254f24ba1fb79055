"""The run coordinator against an in-memory ledger and engine: no database, no ranks.

Each test drives `workers.coordinator.Coordinator` through one path — a run that succeeds, a
launch that breaks, a cancel, a requeue, a skip, a scheduler's job that failed — and asserts the
ledger transactions it made, in order, and the one ending it stored.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from parallab.core.jobs import Limits, ResolvedJob, resolve_job
from parallab.core.ledger import (
    BuildContext,
    Claimed,
    End,
    Ending,
    GangState,
    NodeClaim,
    NodeState,
    Observed,
    OpenJob,
    Refusal,
    Refused,
    Submit,
    Submitted,
    WorkerInfo,
)
from parallab.core.result import LossCurve, ModelStateBytes, RankRecord
from parallab.core.spec import JobSpec
from workers import coordinator as coordinator_module
from workers.coordinator import Coordinator, RunAt
from workers.engines.base import Engine, EngineFacts, EngineState, Records

JOB = resolve_job(
    JobSpec.model_validate({"workload": {"model": "tiny", "steps": 3}, "strategy": {"name": "ddp", "world_size": 2}}),
    Limits(max_world_size=2, max_steps=10),
)
ME = WorkerInfo("w1", "host-a", "m", "127.0.0.1", 1, "cpu", "cpu", None, 2, None, "none")
CURVE = [5.0, 4.9, 4.8]


def records() -> list[RankRecord]:
    loss = LossCurve(values=CURVE, reference=CURVE, reference_source="computed")
    return [
        RankRecord(rank=r, model_state_bytes=ModelStateBytes(params=1, grads=1, optimizer=2), step_times_s=[0.1], loss=loss)
        for r in range(2)
    ]


@dataclass
class FakeLedger:
    """Records every transaction asked of it; answers as the test sets it up."""

    claimed: Claimed | Refused = field(default_factory=lambda: Claimed(JOB, "cpu", [(0, ME.id)], None))
    cancel_requested: bool = False
    calls: list[str] = field(default_factory=list)
    endings: list[tuple[Ending, WorkerInfo | None]] = field(default_factory=list)
    shared: list[list[float]] = field(default_factory=list)
    node_dumps: dict[int, str] = field(default_factory=dict)
    """What the gang's other nodes handed on (`node_flight`)."""

    def claim(self, run_id: str, me: WorkerInfo, endpoint: str) -> Claimed | Refused:
        self.calls.append("claim")
        return self.claimed

    def fail_queued(self, run_id: str, error: str) -> None:
        self.calls.append("fail_queued")

    def gang(self, run_id: str, me: WorkerInfo | None = None) -> GangState | None:
        self.calls.append("gang")
        return GangState("running", self.cancel_requested, [], {})

    def record_pgid(self, run_id: str, node_rank: int, pgid: int) -> None:
        self.calls.append("record_pgid")

    def fail_node(self, run_id: str, node_rank: int, reason: str) -> None:
        self.calls.append("fail_node")

    def claim_node(self, run_id: str, node_rank: int, me: WorkerInfo) -> NodeClaim | None:
        self.calls.append("claim_node")
        return None

    def finish_node(self, run_id: str, node_rank: int, me: WorkerInfo, **_: Any) -> None:
        self.calls.append("finish_node")

    def node_flight(self, run_id: str) -> dict[int, str]:
        self.calls.append("node_flight")
        return dict(self.node_dumps)

    def progress(self, run_id: str, line: dict[str, Any]) -> None:
        self.calls.append("progress")

    def reference(self, key: str, device: str) -> list[float] | None:
        self.calls.append("reference")
        return None

    def share_reference(self, job: ResolvedJob, *, device: str, loss: Sequence[float], run_id: str) -> None:
        self.calls.append("share_reference")
        self.shared.append(list(loss))

    def context(self, run_id: str, pool: str) -> BuildContext:
        self.calls.append("context")
        return BuildContext(hosts=["host-a"])

    def finish(self, run_id: str, ending: Ending, *, worker: WorkerInfo | None = None) -> str:
        self.calls.append("finish")
        self.endings.append((ending, worker))
        return ending.end.value

    def submit_next(self, pool: str, engine: str, submit: Submit) -> str | None:
        return None

    def open_jobs(self, pool: str) -> list[OpenJob]:
        return []

    def observe(self, run_id: str, *, state: str, reason: str | None, nodes: str | None, running: bool) -> Observed | None:
        return None

    def adopt(self, run_id: str, *, pool: str, engine: str, submitted: Submitted) -> bool | None:
        return None


@dataclass
class FakeEngine(Engine[str]):
    """A job that is `running` for `polls` reads of its state, then ends as `end` (a cancel ends it cancelled)."""

    end: EngineState = field(default_factory=lambda: EngineState("succeeded"))
    polls: int = 0
    launch_error: Exception | None = None
    calls: list[str] = field(default_factory=list)
    flight_others: dict[int, str] | None = None
    """The other nodes' dumps `flight` was handed (None: not asked)."""
    report: Any = "hang"
    name = "fake"

    def launch(self, job: ResolvedJob, run_id: str) -> str:
        self.calls.append("launch")
        if self.launch_error is not None:
            raise self.launch_error
        return run_id

    def state(self, handle: str) -> EngineState:
        if self.polls > 0:
            self.polls -= 1
            return EngineState("running")
        return self.end

    def cancel(self, handle: str, reason: str = "cancelled") -> None:
        self.calls.append("cancel")
        self.polls, self.end = 0, EngineState("cancelled", reason, stopped=True)

    def collect(self, handle: str, job: ResolvedJob) -> Records:
        self.calls.append("collect")
        return Records(records(), {0: b"trace"})

    def reconcile(self) -> dict[str, str]:
        return {}

    def log_tail(self, handle: str) -> str:
        return "last words"

    def flight(self, handle: str, job: ResolvedJob, others: Mapping[int, str] | None = None) -> dict[str, Any] | None:
        self.flight_others = dict(others or {})
        return {"report": self.report}

    def facts(self, handle: str, state: EngineState) -> EngineFacts:
        return EngineFacts(hardware={"fake_job": handle})


def drive(ledger: FakeLedger, engine: FakeEngine, tmp_path: Path) -> tuple[str | Refused, list[Claimed]]:
    opened: list[Claimed] = []

    def open_engine(claim: Claimed) -> FakeEngine:
        opened.append(claim)
        return engine

    coordinator = Coordinator(ledger, poll_s=0, sleep=lambda _: None)
    return coordinator.run("r1", ME, endpoint="127.0.0.1:1", open_engine=open_engine, cache_dir=tmp_path), opened


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many result documents the coordinator built."""
    built: list[int] = []
    real = coordinator_module.build_result

    def counted(*args: Any, **kwargs: Any) -> Any:
        built.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(coordinator_module, "build_result", counted)
    return built


def test_a_run_that_succeeds_is_built_once_shares_its_reference_and_finishes_with_its_document(tmp_path: Path, builds: list[int]) -> None:
    ledger, engine = FakeLedger(), FakeEngine(polls=2)
    status, opened = drive(ledger, engine, tmp_path)
    assert status == "succeeded" and len(opened) == 1
    assert ledger.calls == ["claim", "reference", "gang", "gang", "context", "share_reference", "finish"]
    assert engine.calls == ["launch", "collect"] and builds == [1]
    [(ending, worker)] = ledger.endings
    assert ending.end is End.SUCCEEDED and worker == ME and ending.traces == {0: b"trace"}
    assert ending.document is not None and ending.document.hardware["fake_job"] == "r1"  # the engine's facts
    assert ending.document.hardware["hosts"] == ["host-a"]  # the ledger's context
    assert ledger.shared == [CURVE]


def test_a_launch_that_breaks_ends_the_run_failed_without_collecting(tmp_path: Path, builds: list[int]) -> None:
    ledger, engine = FakeLedger(), FakeEngine(launch_error=RuntimeError("no torchrun"))
    status, _ = drive(ledger, engine, tmp_path)
    assert status == "failed"
    assert ledger.calls == ["claim", "reference", "finish"] and engine.calls == ["launch"] and builds == []
    [(ending, _worker)] = ledger.endings
    assert ending == Ending(End.FAILED, "could not launch the job: no torchrun")


def test_a_cancel_asked_in_the_ledger_cancels_the_job_once_and_ends_the_run_cancelled(tmp_path: Path, builds: list[int]) -> None:
    ledger, engine = FakeLedger(cancel_requested=True), FakeEngine(polls=5)
    status, _ = drive(ledger, engine, tmp_path)
    assert status == "cancelled"
    assert ledger.calls == ["claim", "reference", "gang", "finish"]
    assert engine.calls == ["launch", "cancel"] and builds == []
    [(ending, _worker)] = ledger.endings
    assert ending.end is End.CANCELLED and ending.error == "cancelled while running\n--- log tail ---\nlast words"


@pytest.mark.parametrize("refusal", [Refusal.REQUEUE, Refusal.REQUEUE_NOW, Refusal.SKIP, Refusal.FAILED])
def test_a_refused_claim_opens_no_engine_and_writes_nothing_more(tmp_path: Path, refusal: Refusal) -> None:
    """A requeue or a skip is the driver's to act on; the coordinator hands the typed refusal back."""
    ledger, engine = FakeLedger(claimed=Refused(refusal, "cpu")), FakeEngine()
    status, opened = drive(ledger, engine, tmp_path)
    assert status == Refused(refusal, "cpu")
    assert ledger.calls == ["claim"] and opened == [] and engine.calls == []


def test_a_schedulers_failed_job_ends_its_run_with_the_engines_reason_and_flight_recorder(tmp_path: Path) -> None:
    """The Slurm agent's path: no claim, no worker; the job's end is concluded as a worker's is."""
    ledger, engine = FakeLedger(), FakeEngine()
    run = RunAt("r2", JOB, "slurm-pool", "cpu")
    state = EngineState("failed", "Slurm job 7 FAILED: a task exited non-zero")
    assert Coordinator(ledger).conclude(run, engine, "r2", state) == "failed"
    assert ledger.calls == ["finish"] and engine.calls == []
    [(ending, worker)] = ledger.endings
    assert worker is None and ending == Ending(End.FAILED, "Slurm job 7 FAILED: a task exited non-zero", flight={"report": "hang"})


@pytest.mark.parametrize("stopped", [False, True])
def test_a_gangs_failure_analyses_every_nodes_dumps_and_leads_with_that_sentence(tmp_path: Path, stopped: bool) -> None:
    """Node 0 fails (or is stopped on another node's fault): the dumps node 1 handed on through the
    ledger reach the engine's analysis beside node 0's own, and its sentence leads the error."""
    ledger = FakeLedger(claimed=Claimed(JOB, "cpu", [(0, ME.id), (1, "w2")], "127.0.0.1:29400"), node_dumps={1: "rank 1's dump"})
    sentence = "hang: ranks disagree at collective 9 of the world group (ranks 0, 1): rank 0 called all_reduce; rank 1 called barrier"
    engine = FakeEngine(end=EngineState("failed", "exit code 1", stopped=stopped), report={"sentence": sentence})
    status, _ = drive(ledger, engine, tmp_path)
    assert status == "failed"
    assert engine.flight_others == {1: "rank 1's dump"}
    [(ending, _worker)] = ledger.endings
    assert ending.flight == {"report": {"sentence": sentence}}
    assert ending.error is not None and ending.error.splitlines()[0] == sentence
    assert ("fail_node" in ledger.calls) is not stopped


def test_an_ending_holds_a_document_exactly_when_it_succeeded() -> None:
    with pytest.raises(ValueError, match="succeeds with its result document"):
        Ending(End.SUCCEEDED)


@dataclass
class GangLedger(FakeLedger):
    """A ledger whose gang has ended as `nodes` say."""

    nodes: list[NodeState] = field(default_factory=list)

    def gang(self, run_id: str, me: WorkerInfo | None = None) -> GangState | None:
        self.calls.append("gang")
        return GangState("running", False, self.nodes, {})


@pytest.mark.parametrize(
    ("status", "reason", "told"),
    [
        ("failed", "rank 1 timed out\n--- log tail ---\nlong", "node 1 (host host-b) failed: rank 1 timed out\n--- log tail ---\nlong"),
        (
            "stopped",
            "node 0 (host host-a) failed: exit 1\n--- log tail ---\nlong",
            "node 1 (host host-b) stopped: node 0 (host host-a) failed: exit 1",
        ),
        ("succeeded", None, None),
    ],
)
def test_node_0s_failure_names_every_other_node_that_did_not_succeed_with_its_host(
    status: str, reason: str | None, told: str | None
) -> None:
    """Which node's ranks time out first is a race: node 1 failed by itself, or was stopped for node
    0's failure; either way it is named with its host, a stop by its first line only."""
    now = datetime.now(timezone.utc)
    nodes = [NodeState(0, "host-a", "failed", "x", True, now), NodeState(1, "host-b", status, reason, True, now)]
    ledger = GangLedger(nodes=nodes)
    error = Coordinator(ledger).gang_failure(RunAt("r3", JOB, "pool", "cpu", worker=ME), "exit code 1", settle_s=5)
    own = "node 0 (host host-a) failed: exit code 1"
    assert "fail_node" in ledger.calls
    if told is None:
        assert error == own
    else:
        assert error == f"{told}\n\n{own}", error
