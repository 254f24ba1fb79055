"""The one interface every engine implements: the five things a coordinator asks of it.

1. `launch`: place and launch a resolved job (returns a handle the other calls take);
2. `state`: where the job stands now, as one of a run's statuses with the engine's reason;
3. `cancel`: stop it;
4. `collect`: the rank records it left behind (and their traces);
5. `reconcile`: after a restart, the jobs this engine still holds, so the coordinator carries on.

The coordinator (the Celery task's `workers.execute`, or `workers.slurm_agent`) is a state machine
over these calls and the database; an engine never opens a database session itself.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from parallab.core.jobs import ResolvedJob
from parallab.core.result import RankRecord

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

    @property
    def active(self) -> bool:
        return self.status in ACTIVE


@dataclass(frozen=True)
class Records:
    """What a finished job's ranks left: their records in rank order, and their traces."""

    records: list[RankRecord]
    traces: dict[int, bytes]


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


class LaunchRefused(RuntimeError):
    """The engine refused the job outright (the message is the engine's own)."""
