"""The Celery worker's engine: torchrun as a subprocess on the host the worker owns.

`launch` runs the job's ranks on this host to their end (the Celery task holds the job for its
whole life anyway, one job per worker); while they run, the launcher polls the run's watch: a
worker's `workers.watch.Watcher` (progress, the lease's heartbeat, a cancel, another node's fault)
or, for `parallab bench` (`workers.execute.run_and_collect`), a `LocalWatch` of two callbacks. A
cancel the watch sees goes through this engine's `cancel`; any other stop (another node's fault, a
lapsed lease) stops the ranks as the watch's reason. So `state` is final once `launch` returns.
`reconcile` finds the ranks still running on this machine, by run id (their process groups); which
of them no live worker watches is the ledger's to say, and the fleet's reaper (`workers.fleet`)
kills those.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import psutil

from backend.config import Settings
from parallab.core.jobs import ResolvedJob
from parallab.core.rundir import RunDir
from workers.engines.base import Engine, EngineFacts, EngineState, Records
from workers.engines.outputs import failure_message, kept_flight, node_records, read_traces
from workers.launcher import LaunchOutcome, NodeLaunch, launch

_RUN_ID = re.compile(r"[0-9a-f]{32}")


def reference_cache_dir(settings: Settings) -> Path:
    """This host's cache of reference curves (the ranks' `--cache-dir`)."""
    return settings.resolved_home / "cache" / "reference"


class Watch(Protocol):
    """What the launcher asks while a job's ranks run (`workers.watch.Watcher` is the worker's)."""

    stop_reason: str | None
    cancelled: bool

    def progress(self, line: dict[str, Any]) -> None: ...

    def should_stop(self) -> str | None: ...

    def started(self, pgid: int) -> None: ...


class LocalWatch:
    """A watch without a database (`parallab bench`): live progress to a callback, and a cancel
    when `should_cancel` says so."""

    def __init__(self, on_progress: Callable[[dict[str, Any]], None] | None = None, should_cancel: Callable[[], bool] | None = None):
        self.on_progress, self.should_cancel = on_progress, should_cancel
        self.stop_reason: str | None = None
        self.cancelled = False

    def progress(self, line: dict[str, Any]) -> None:
        if self.on_progress is not None:
            self.on_progress(line)

    def should_stop(self) -> str | None:
        if self.should_cancel is not None and self.should_cancel():
            self.stop_reason, self.cancelled = "cancelled", True
        return self.stop_reason

    def started(self, pgid: int) -> None:
        pass


@dataclass
class HostJob:
    """One host's part of a run: its run directory and, once its ranks ended, how."""

    run_dir: RunDir
    outcome: LaunchOutcome | None = None
    cancelled: str | None = field(default=None)
    """Why `cancel` stopped it, if it did."""
    pgids: set[int] = field(default_factory=set)
    """The process groups of its ranks found on this machine (`reconcile`)."""


class HostTorchrun(Engine[HostJob]):
    """This host's share of a job (the whole job, or one node's part of a multi-node one)."""

    name = "host-torchrun"

    def __init__(
        self,
        settings: Settings,
        *,
        watcher: Watch | None = None,
        node: NodeLaunch | None = None,
        runs_dir: Path | None = None,
    ):
        """`watcher`: the run's watch (none: only `cancel` stops the ranks); `runs_dir`: where run
        directories go (default: the settings' runs directory)."""
        self.settings, self.watcher, self.node = settings, watcher, node
        self.runs_dir = runs_dir or settings.runs_dir

    def launch(self, job: ResolvedJob, run_id: str) -> HostJob:
        handle = HostJob(RunDir(self.runs_dir / run_id))
        watcher = self.watcher

        def should_stop() -> str | None:
            if handle.cancelled is None and watcher is not None and (why := watcher.should_stop()) is not None:
                if not watcher.cancelled:
                    return why  # another node's fault, a lapsed lease: a stop, not a cancel
                self.cancel(handle, why)
            return handle.cancelled

        handle.outcome = launch(
            job,
            handle.run_dir,
            timeout_s=self.settings.worker.max_job_seconds,
            trace_cap_bytes=self.settings.server.max_trace_bytes,
            cache_dir=reference_cache_dir(self.settings),
            on_progress=watcher.progress if watcher is not None else None,
            should_stop=should_stop,
            on_start=watcher.started if watcher is not None else None,
            node=self.node,
            netns=self.settings.worker.worker_netns,
            collective_timeout_s=self.settings.worker.collective_timeout_s,
            allowed_modules=self.settings.limits.allowed_modules,
        )
        return handle

    def stopped(self, handle: HostJob) -> bool:
        """Stopped by its watcher or a cancel, rather than failing by itself."""
        reason = handle.outcome.reason if handle.outcome else None
        watched = self.watcher.stop_reason if self.watcher is not None else None
        return reason is not None and reason in (watched, handle.cancelled)

    def state(self, handle: HostJob) -> EngineState:
        outcome = handle.outcome
        if outcome is None:
            return EngineState("running")
        if outcome.ok:
            return EngineState("succeeded")
        if self.stopped(handle):
            return EngineState("cancelled" if handle.cancelled is not None else "failed", outcome.reason, stopped=True)
        return EngineState("failed", failure_message(handle.run_dir, outcome.reason or "", outcome.log_tail))

    def cancel(self, handle: HostJob, reason: str = "cancelled") -> None:
        handle.cancelled = reason

    def collect(self, handle: HostJob, job: ResolvedJob) -> Records:
        tail = handle.outcome.log_tail if handle.outcome else ""
        records = node_records(handle.run_dir, job, expected=job.ranks_per_node, log_tail=tail)
        traces = read_traces(handle.run_dir, job.world_size, self.settings.server.max_trace_bytes) if job.spec.trace else {}
        return Records(records, traces)

    def log_tail(self, handle: HostJob) -> str:
        return handle.outcome.log_tail if handle.outcome else ""

    def failure(self, handle: HostJob, state: EngineState) -> str:
        return state.reason or "stopped"

    def flight(self, handle: HostJob, job: ResolvedJob, others: Mapping[int, str] | None = None) -> dict[str, Any] | None:
        return kept_flight(handle.run_dir, job.world_size, others)

    def facts(self, handle: HostJob, state: EngineState) -> EngineFacts:
        outcome = handle.outcome
        return EngineFacts(noise=outcome.noise, host_speed=outcome.host_speed) if outcome else EngineFacts()

    def reconcile(self) -> dict[str, HostJob]:
        """The ranks (and their torchrun) still running on this machine, by run id — the name of the
        run directory on their command line — never this process's own group. A worker that
        restarts resumes none of them (they lost their worker); the fleet's reaper kills those
        that no live worker watches."""
        own = os.getpgrp()
        found: dict[str, HostJob] = {}
        for proc in psutil.process_iter(["pid", "cmdline"]):
            cmd = proc.info.get("cmdline") or []
            if "--run-dir" not in cmd or not any(part in ("workers.harness.main", "torch.distributed.run") for part in cmd):
                continue
            index = cmd.index("--run-dir")
            run_id = Path(cmd[index + 1]).name if index + 1 < len(cmd) else ""
            if not _RUN_ID.fullmatch(run_id):
                continue
            try:
                pgid = os.getpgid(proc.info["pid"])
            except ProcessLookupError:
                continue
            if pgid != own:
                found.setdefault(run_id, HostJob(RunDir(self.runs_dir / run_id))).pgids.add(pgid)
        return found
