"""The Celery worker's engine: torchrun as a subprocess on the host the worker owns.

`launch` runs the job's ranks on this host to their end (the Celery task holds the job for its
whole life anyway, one job per worker); while they run, the launcher polls the run's `Watcher`
(progress, the lease's heartbeat, a cancel, another node's fault) and this engine's own cancel.
So `state` is final once `launch` returns. `reconcile` is the fleet's: runs whose lease lapsed
are failed and the ranks a dead worker left on this machine are killed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from backend.config import Settings
from parallab.core.jobs import ResolvedJob
from parallab.core.rundir import RunDir
from workers import fleet
from workers.engines.base import Engine, EngineState, Records
from workers.engines.outputs import failure_message, node_records, read_traces
from workers.launcher import LaunchOutcome, NodeLaunch, launch
from workers.watch import Watcher


def reference_cache_dir(settings: Settings) -> Path:
    """This host's cache of reference curves (the ranks' `--cache-dir`)."""
    return settings.resolved_home / "cache" / "reference"


@dataclass
class HostJob:
    """One host's part of a run: its run directory and, once its ranks ended, how."""

    run_dir: RunDir
    outcome: LaunchOutcome | None = None
    cancelled: str | None = field(default=None)
    """Why `cancel` stopped it, if it did."""


class HostTorchrun(Engine[HostJob]):
    """This host's share of a job (the whole job, or one node's part of a multi-node one)."""

    name = "host-torchrun"

    def __init__(self, settings: Settings, *, watcher: Watcher, node: NodeLaunch | None = None):
        self.settings, self.watcher, self.node = settings, watcher, node

    def launch(self, job: ResolvedJob, run_id: str) -> HostJob:
        handle = HostJob(RunDir(self.settings.runs_dir / run_id))

        def should_stop() -> str | None:
            return handle.cancelled or self.watcher.should_stop()

        handle.outcome = launch(
            job,
            handle.run_dir,
            timeout_s=self.settings.max_job_seconds,
            trace_cap_bytes=self.settings.max_trace_bytes,
            cache_dir=reference_cache_dir(self.settings),
            on_progress=self.watcher.progress,
            should_stop=should_stop,
            on_start=self.watcher.started,
            node=self.node,
        )
        return handle

    def stopped(self, handle: HostJob) -> bool:
        """Stopped by its watcher or a cancel, rather than failing by itself."""
        reason = handle.outcome.reason if handle.outcome else None
        return reason is not None and reason in (self.watcher.stop_reason, handle.cancelled)

    def state(self, handle: HostJob) -> EngineState:
        outcome = handle.outcome
        if outcome is None:
            return EngineState("running")
        if outcome.ok:
            return EngineState("succeeded")
        if self.stopped(handle):
            cancelled = self.watcher.cancelled or handle.cancelled is not None
            return EngineState("cancelled" if cancelled else "failed", outcome.reason)
        return EngineState("failed", failure_message(handle.run_dir, outcome.reason or "", outcome.log_tail))

    def cancel(self, handle: HostJob, reason: str = "cancelled") -> None:
        handle.cancelled = reason

    def collect(self, handle: HostJob, job: ResolvedJob) -> Records:
        tail = handle.outcome.log_tail if handle.outcome else ""
        records = node_records(handle.run_dir, job, expected=job.ranks_per_node, log_tail=tail)
        traces = read_traces(handle.run_dir, job.world_size, self.settings.max_trace_bytes) if job.spec.trace else {}
        return Records(records, traces)

    def reconcile(self) -> dict[str, HostJob]:
        """Fail runs whose lease lapsed and kill this machine's orphaned ranks; a worker that
        restarts resumes nothing (its ranks died with it), so it holds no job afterwards."""
        fleet.reconcile(self.settings, self.watcher.me)
        return {}
