"""The one interface every engine implements: the five things a coordinator asks of it.

1. `launch`: place and launch a resolved job (returns a handle the other calls take);
2. `state`: where the job stands now, as one of a run's statuses with the engine's reason;
3. `cancel`: stop it;
4. `collect`: the rank records it left behind (and their traces);
5. `reconcile`: after a restart, the jobs this engine still holds, so the coordinator carries on.

The coordinator (`workers.coordinator`, driven by the Celery task and by the scheduler pools' agent) is a
state machine over these calls and the ledger (`parallab.core.ledger`); an engine never opens a
database session itself. Besides the five, an engine may say more about a job it ran — its log
tail, why it failed, its flight-recorder dumps, where it ran (`facts`) — for the one result
document the coordinator builds; the defaults say nothing.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from parallab.core.hostspeed import HostSpeed
from parallab.core.jobs import ResolvedJob
from parallab.core.noise import HostNoise
from parallab.core.result import RankRecord
from parallab.core.rundir import RunDir

H = TypeVar("H")
"""An engine's handle on one launched job (a torchrun process, a Slurm job id)."""

ACTIVE = frozenset({"queued", "running"})


@dataclass(frozen=True)
class EngineState:
    """A job as its engine sees it, in a run's terms."""

    status: str
    """queued, running, succeeded, failed or cancelled (a run's statuses)."""
    reason: str | None = None
    """Why it is where it is, in the engine's words (Slurm's PENDING reason, an exit code, TIMEOUT)."""
    detail: dict[str, Any] = field(default_factory=dict)
    """What the engine knows of where it runs (Slurm's job id, state and node list)."""
    stopped: bool = False
    """Stopped from outside (a cancel, another node's fault) rather than failing by itself."""

    @property
    def active(self) -> bool:
        return self.status in ACTIVE


@dataclass(frozen=True)
class Records:
    """What a finished job's ranks left: their records in rank order, and their traces."""

    records: list[RankRecord]
    traces: dict[int, bytes]


@dataclass(frozen=True)
class EngineFacts:
    """What an engine knows of where a finished job ran, for its result document (None: nothing)."""

    hosts: list[str] | None = None
    noise: HostNoise | None = None
    host_speed: HostSpeed | None = None
    hardware: dict[str, Any] = field(default_factory=dict)
    """Added to the document's `hardware` (a scheduler's job id and nodes)."""


class Engine(ABC, Generic[H]):
    """Places, watches, stops and reads back jobs of one kind of compute."""

    name: str

    @abstractmethod
    def launch(self, job: ResolvedJob, run_id: str) -> H:
        """Place and launch `job` as run `run_id`; raises LaunchRefused with the engine's message when it refuses it."""

    @abstractmethod
    def state(self, handle: H) -> EngineState:
        """Where the job stands now."""

    @abstractmethod
    def cancel(self, handle: H, reason: str = "cancelled") -> None:
        """Stop the job (idempotent: a finished job stays finished)."""

    @abstractmethod
    def collect(self, handle: H, job: ResolvedJob) -> Records:
        """The records of a job that succeeded (raises with the reason when they are missing or bad)."""

    @abstractmethod
    def reconcile(self) -> dict[str, H]:
        """After a restart: the jobs this engine still holds, by run id."""

    def log_tail(self, handle: H) -> str:
        """The end of the job's output."""
        return ""

    def failure(self, handle: H, state: EngineState) -> str:
        """Why a failed job failed, in full (with a rank's own record and the log tail where known)."""
        return state.reason or "failed"

    def flight(self, handle: H, job: ResolvedJob, others: Mapping[int, str] | None = None) -> dict[str, Any] | None:
        """A failed job's flight-recorder dumps and their analysis, when its ranks left any: its own
        ranks' with `others` (the dumps its gang's other nodes handed on), every rank analysed together."""
        return None

    def facts(self, handle: H, state: EngineState) -> EngineFacts:
        """Where a finished job ran."""
        return EngineFacts()


class PoolEngine(Engine[H]):
    """The engine of a declared pool, driven by its scheduler agent (`workers.scheduler_agent`): its
    runs keep their files under the pool's run root, where the agent reads their progress."""

    pool: str

    @abstractmethod
    def run_dir(self, run_id: str) -> RunDir:
        """Where run `run_id`'s files live."""

    @property
    @abstractmethod
    def device(self) -> str:
        """What the ranks train on (the key of the lab's reference curves)."""

    @abstractmethod
    def cache_dir(self) -> Path:
        """The pool's cache of reference curves, which the ranks read."""


class LaunchRefused(RuntimeError):
    """The engine refused the job outright (the message is the engine's own)."""
