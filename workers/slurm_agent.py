"""`parallab slurm-agent --pool NAME`: the Slurm pool's driver of the run coordinator, on the cluster's login node.

A state machine over the Slurm engine (`workers.engines.slurm`), the ledger
(`parallab.core.ledger`, the lab database's `backend.services.ledger.DbLedger`) and the run
coordinator (`workers.coordinator`), one round every `slurm_poll_s`:

1. submit: each queued run of the pool not yet submitted is taken (row-locked), its reference
   curve copied into the pool's cache on the shared filesystem (`Coordinator.prefetch`), the job
   `sbatch`ed, and its Slurm job id recorded in the same transaction; a job Slurm refuses (an
   unknown partition) fails its run with Slurm's own message;
2. watch: one `squeue` for every job the pool still watches; a job's state is recorded with its
   reason (PENDING with Slurm's reason keeps the run queued), a started job makes its run running,
   a cancelled run's job is `scancel`ed, and a finished job's run is ended by the coordinator
   (`Coordinator.conclude`: collect, build the one document, share the reference, finish) as a
   worker's run is.

The agent holds nothing in memory that matters: on start it reconciles (`engine.reconcile`): jobs
of the pool that Slurm knows by name and comment but the ledger lacks (the agent died between
`sbatch` and its commit) are adopted, or cancelled when their run already ended; a watched job
that Slurm no longer knows ends its run `failed`, saying it vanished.
"""

from __future__ import annotations

import logging
import threading

from pydantic import ValidationError

from backend.config import Settings
from backend.db import session_scope
from backend.services import pools
from backend.services.ledger import DbLedger
from parallab.core.jobs import ResolvedJob
from parallab.core.ledger import End, Ending, Ledger, Submitted
from parallab.core.pools import SlurmPool
from workers.coordinator import Coordinator, RunAt
from workers.engines.base import EngineState, LaunchRefused
from workers.engines.slurm import SlurmEngine, SlurmHandle, SlurmUnavailable, read_noise
from workers.launcher import ProgressTail

__all__ = ["NoSuchPool", "SlurmAgent", "read_noise"]

log = logging.getLogger(__name__)


class NoSuchPool(LookupError):
    """The agent was started for a pool that is not a declared Slurm pool."""


class SlurmAgent:
    """Submits, watches, cancels and stores the runs of one Slurm pool."""

    def __init__(self, settings: Settings, pool: str, ledger: Ledger | None = None):
        self.settings, self.pool = settings, pool
        with session_scope(settings.sqlalchemy_url) as session:
            config = pools.scheduled_pool(session=session, name=pool)
        if not isinstance(config, SlurmPool):
            raise NoSuchPool(f"no Slurm pool named {pool!r} (declare it with `parallab pool create-slurm`)")
        self.engine = SlurmEngine(
            pool,
            config,
            max_job_seconds=settings.max_job_seconds,
            trace_cap_bytes=settings.max_trace_bytes,
            allowed_modules=settings.allowed_modules,
        )
        self.ledger: Ledger = ledger or DbLedger(settings)
        self.coordinator = Coordinator(self.ledger, catalogue=settings.hardware_catalogue)
        self.tails: dict[str, ProgressTail] = {}

    # ---- after a restart ----

    def reconcile(self) -> list[str]:
        """Adopt the pool's jobs Slurm knows but the ledger lacks; cancel those whose run already ended. Returns the adopted run ids."""
        adopted = []
        for run_id, handle in self.engine.reconcile().items():
            submitted = Submitted(handle.job_id, str(self.engine.run_dir(run_id).log))
            kept = self.ledger.adopt(run_id, pool=self.pool, engine=self.engine.name, submitted=submitted)
            if kept is None:
                continue
            if kept:
                adopted.append(run_id)
                continue
            log.warning("Slurm job %s belongs to no live run of pool %s; cancelling it", handle.job_id, self.pool)
            self._cancel(handle)
        if adopted:
            log.info("adopted Slurm jobs of runs %s", ", ".join(adopted))
        return adopted

    # ---- one round ----

    def submit(self) -> int:
        """Submit every queued run of the pool not yet submitted; returns how many were taken."""
        taken = 0
        while (run_id := self.ledger.submit_next(self.pool, self.engine.name, self._launch)) is not None:
            taken += 1
            log.info("run %s taken for Slurm", run_id)
        return taken

    def _launch(self, run_id: str, job: ResolvedJob) -> Submitted | str:
        """`sbatch` one run's job (the reference curve prefetched first); its Slurm job id, or why Slurm or the filesystem refused it."""
        fetched = self.coordinator.prefetch(job, self.engine.device, self.engine.cache_dir())
        try:
            handle = self.engine.launch(job, run_id)
        except LaunchRefused as exc:
            return str(exc)
        except OSError as exc:  # the shared filesystem refused the run directory
            return f"could not prepare the run directory on the cluster: {exc}"
        files = self.engine.run_dir(run_id)
        if fetched:  # for the result, whichever agent builds it: the curve came from the lab database
            files.reference_fetched.touch()
        return Submitted(handle.job_id, str(files.log))

    def watch(self) -> None:
        """Read every watched job's state in one `squeue` and move each run along."""
        handles = [SlurmHandle(j.run_id, j.job_id) for j in self.ledger.open_jobs(self.pool)]
        if not handles:
            return
        for handle, state in self.engine.states(handles).items():
            try:
                self.follow(handle, state)
            except Exception:
                log.exception("could not follow run %s (Slurm job %s); trying again next round", handle.run_id, handle.job_id)

    def follow(self, handle: SlurmHandle, state: EngineState) -> None:
        """Record one job's state and act on it: cancel it, store its progress, or end its run."""
        detail = state.detail
        seen = self.ledger.observe(
            handle.run_id,
            state=str(detail.get("slurm_state") or state.status.upper()),
            reason=state.reason,
            nodes=detail.get("slurm_nodes"),
            running=state.status != "queued",
        )
        if seen is None or (seen.cancel and state.active):
            self._cancel(handle)
            return
        if state.active:
            if state.status == "running":
                self._progress(handle.run_id)
            return
        try:
            job = ResolvedJob.model_validate(seen.job)
        except ValidationError as exc:
            ending = Ending(End.FAILED, f"could not build the result document: the run's frozen job is unreadable: {exc}")
            final = self.ledger.finish(handle.run_id, ending)
        else:
            fetched = self.engine.run_dir(handle.run_id).reference_fetched.exists()
            run = RunAt(handle.run_id, job, self.pool, self.engine.device, fetched=fetched)
            final = self.coordinator.conclude(run, self.engine, handle, state)
        self.tails.pop(handle.run_id, None)
        log.info("run %s (Slurm job %s) ended %s", handle.run_id, handle.job_id, final)

    def poll(self) -> None:
        """One round: submit, then watch (Slurm not answering only delays the round's work)."""
        try:
            self.submit()
            self.watch()
        except SlurmUnavailable as exc:
            log.warning("Slurm did not answer (%s); trying again in %.0f s", exc, self.settings.slurm_poll_s)

    def run(self, stop: threading.Event) -> None:
        """Reconcile, then poll until `stop` is set (a database or Slurm blip never ends the agent)."""
        while not stop.is_set():
            try:
                self.reconcile()
                break
            except Exception:
                log.exception("could not reconcile with Slurm; trying again")
                stop.wait(self.settings.slurm_poll_s)
        while not stop.is_set():
            try:
                self.poll()
            except Exception:
                log.exception("agent round failed; trying again")
            stop.wait(self.settings.slurm_poll_s)

    # ---- small pieces ----

    def _cancel(self, handle: SlurmHandle) -> None:
        try:
            self.engine.cancel(handle)
        except SlurmUnavailable as exc:
            log.warning("could not cancel Slurm job %s (%s); trying again next round", handle.job_id, exc)

    def _progress(self, run_id: str) -> None:
        tail = self.tails.setdefault(run_id, ProgressTail(self.engine.run_dir(run_id).progress))
        if (line := tail.poll()) is not None:
            self.ledger.progress(run_id, line)
