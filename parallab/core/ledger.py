"""The run side's ledger: every database transaction a coordinator makes, as one typed interface.

A coordinator (`workers.coordinator`) drives a run through an engine and records each step here;
it never opens a database session itself, so it can be tested against an in-memory ledger and the
engines stay free of the database. The one implementation over the lab's database is
`backend.services.ledger.DbLedger`.

Each method is one transaction. Outcomes are types, not strings: a claim is either `Claimed` or a
`Refused` carrying a `Refusal`; a run ends with an `Ending` whose `End` says how.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from enum import Enum
from typing import Any, Protocol

from parallab.core.hardware import HardwareProfile
from parallab.core.jobs import ResolvedJob
from parallab.core.pools import PoolTopology
from parallab.core.result import ResultDocument


@dataclass(frozen=True)
class WorkerInfo:
    """What a worker says about itself when it registers (read without torch: workers.fleet)."""

    id: str
    host: str
    machine: str
    address: str
    pid: int
    pool: str
    device: str
    device_name: str | None
    device_count: int
    memory_per_device_bytes: int | None
    interconnect: str

    def fields(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class NodeState:
    """One node of a running run as the others watch it."""

    node_rank: int
    host: str
    status: str
    reason: str | None
    alive: bool
    reserved_at: datetime


@dataclass(frozen=True)
class GangState:
    """What a node's watcher needs each poll: the run's status, a cancel, and every node."""

    status: str
    cancel_requested: bool
    nodes: list[NodeState]
    records: dict[int, list[dict[str, Any]] | None]


class Refusal(Enum):
    """Why a claim did not start the run."""

    SKIP = "skip"
    """Not queued (a redelivered message, a run cancelled or deleted meanwhile): nothing to do."""
    FAILED = "failed"
    """The run was failed at the claim (its job unreadable, or no pool can ever hold it)."""
    REQUEUE = "requeue"
    """Its hosts are busy; nothing was taken: put it back after a pause."""
    REQUEUE_NOW = "requeue-now"
    """This worker is reserved by another run's gang: put it back at once and serve that one."""


@dataclass(frozen=True)
class Refused:
    refusal: Refusal
    pool: str | None = None
    """The run's pool, where it goes back on a queue."""


@dataclass(frozen=True)
class Claimed:
    """A run moved to running with every host it needs reserved."""

    job: ResolvedJob
    pool: str
    nodes: list[tuple[int, str]]
    """(node rank, worker id) of every node, node 0 (the claimer) first."""
    endpoint: str | None
    """The rendezvous of a multi-node run (None: one node)."""


@dataclass(frozen=True)
class NodeClaim:
    """Another host's reserved part of a multi-node run, started."""

    job: ResolvedJob
    endpoint: str


class End(Enum):
    """How a run ended."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


@dataclass(frozen=True)
class Ending:
    """A run's end as the coordinator stores it in one transaction."""

    end: End
    error: str | None = None
    document: ResultDocument | None = None
    traces: dict[int, bytes] = field(default_factory=dict)
    flight: dict[str, Any] | None = None
    """A failed run's flight-recorder dumps and their analysis, kept with it."""

    def __post_init__(self) -> None:
        if (self.end is End.SUCCEEDED) != (self.document is not None):
            raise ValueError("a run succeeds with its result document, and only then")


@dataclass(frozen=True)
class BuildContext:
    """What the ledger adds to a result document: the hosts by node, the pool's calibration and wiring."""

    hosts: list[str] | None = None
    profile: HardwareProfile | None = None
    topology: PoolTopology | None = None


@dataclass(frozen=True)
class Submitted:
    """A scheduler took a run's job (its id there, and where its output goes)."""

    job_id: str
    output: str | None = None


@dataclass(frozen=True)
class Observed:
    """What a scheduler's coordinator needs back after recording a job's state."""

    run_status: str
    cancel: bool
    """The run was cancelled (or asked to be): the job must be cancelled in the scheduler."""
    job: dict[str, Any] | None
    """The run's frozen job (what its ranks ran)."""


@dataclass(frozen=True)
class OpenJob:
    run_id: str
    job_id: str


Submit = Callable[[str, ResolvedJob], "Submitted | str"]
"""Launch a run's job in a scheduler: `Submitted`, or the reason it was refused."""


class Ledger(Protocol):
    """One method per transaction of the run side."""

    # ---- a worker's run ----

    def claim(self, run_id: str, me: WorkerInfo, endpoint: str) -> Claimed | Refused:
        """Move a queued run to running with all its hosts reserved (row-locked, all or nothing)."""

    def fail_queued(self, run_id: str, error: str) -> None:
        """Fail a run still queued (it could not be put back on its queue)."""

    def gang(self, run_id: str, me: WorkerInfo | None = None) -> GangState | None:
        """The run and its nodes now (None: deleted); renews `me`'s heartbeat first when given."""

    def record_pgid(self, run_id: str, node_rank: int, pgid: int) -> None:
        """Keep the process group of a node's ranks, so a worker of its machine can kill them if this one dies."""

    def fail_node(self, run_id: str, node_rank: int, reason: str) -> None:
        """Say at once that a node failed (the other nodes stop on it)."""

    def claim_node(self, run_id: str, node_rank: int, me: WorkerInfo) -> NodeClaim | None:
        """Start a reserved part of a multi-node run; None if it is not (or no longer) this worker's."""

    def finish_node(
        self,
        run_id: str,
        node_rank: int,
        me: WorkerInfo,
        *,
        status: str,
        reason: str | None,
        records: list[dict[str, Any]] | None,
        traces: dict[int, bytes],
        flight: dict[int, str] | None = None,
    ) -> None:
        """Record how a non-zero node's part ended and hand on its records and traces (kept for node
        0's result, in the same transaction); frees the worker. `flight`: its ranks' flight-recorder
        dumps when it failed or was stopped (by global rank), kept for node 0 — or, when the run has
        already ended failed, merged into the dumps it kept and analysed again with them."""

    def node_flight(self, run_id: str) -> dict[int, str]:
        """The flight-recorder dumps the other nodes of a gang handed on so far, by global rank."""

    # ---- any run ----

    def progress(self, run_id: str, line: dict[str, Any]) -> None:
        """Store a run's latest progress line."""

    def reference(self, key: str, device: str) -> list[float] | None:
        """The lab's reference loss curve of a workload on a device, if stored."""

    def share_reference(self, job: ResolvedJob, *, device: str, loss: Sequence[float], run_id: str) -> None:
        """Store a reference curve unless the lab has one (the first writer wins)."""

    def context(self, run_id: str, pool: str) -> BuildContext:
        """The hosts, calibration and topology a run's result document is built with."""

    def finish(self, run_id: str, ending: Ending, *, worker: WorkerInfo | None = None) -> str:
        """One transaction: the run's end, fenced — a run that ended elsewhere (reconciled as lost,
        cancelled before its job started) is not overwritten; its nodes or scheduler job closed.
        `worker`: the worker holding it (None: a scheduler holds it). Returns the run's final status."""

    # ---- a scheduler's runs ----

    def submit_next(self, pool: str, engine: str, submit: Submit) -> str | None:
        """Take the pool's oldest queued run not yet submitted (row-locked while `submit` runs),
        record its job or fail it with the refusal; returns its id (None: nothing to submit)."""

    def open_jobs(self, pool: str) -> list[OpenJob]:
        """The pool's submitted jobs whose runs have not ended."""

    def observe(self, run_id: str, *, state: str, reason: str | None, nodes: str | None, running: bool) -> Observed | None:
        """Record a scheduler's view of a run's job; None if the run is gone."""

    def adopt(self, run_id: str, *, pool: str, engine: str, submitted: Submitted) -> bool | None:
        """A job the scheduler holds under a run's name: None if the ledger knows it already; True if
        recorded now; False if its run is no live run of the pool (the job must be cancelled)."""
