"""A scheduler pool's agent: the one driver of the run coordinator for every pool kind whose jobs a
scheduler places (Slurm's `parallab slurm-agent`, Ray's `parallab ray-agent`).

A state machine over the pool's engine (`workers.engines.base.PoolEngine`), the ledger
(`parallab.core.ledger`, the lab database's `backend.services.ledger.DbLedger`) and the run
coordinator (`workers.coordinator`), one round every `poll_s`:

1. submit: each queued run of the pool not yet submitted is taken (row-locked), its reference
   curve copied into the pool's cache (`Coordinator.prefetch`), the job launched, and its job id
   recorded in the same transaction; a job the engine refuses (`LaunchRefused`, a run directory it
   cannot write) fails its run saying why; the scheduler not answering leaves the run queued;
2. watch: every watched job's state is recorded with its reason (a queued job keeps its run
   queued), a started job makes its run running and its progress is stored, a cancelled run's job
   is cancelled, and a finished job's run is ended by the coordinator (`Coordinator.conclude`:
   collect, build the one document, share the reference, finish) as a worker's run is.

The agent holds nothing in memory that matters: on start it reconciles (`engine.reconcile`): jobs
of the pool the scheduler holds but the ledger lacks (the agent died between the launch and its
commit) are adopted, or cancelled when their run already ended; a watched job the scheduler no
longer knows ends its run `failed`, in the engine's words.

A kind's agent is a subclass that names its pool settings, its engine, its handle and the error
its engine raises when the scheduler does not answer; it overrides a hook only where its engine
differs (Slurm reads every job's state in one `squeue`). The engine's state detail may carry
`<engine name>_state` (the scheduler's own word for it, recorded in place of the status) and
`<engine name>_nodes` (where it runs).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from pydantic import ValidationError

from backend.config import Settings
from backend.db import session_scope
from backend.services import pools
from backend.services.ledger import DbLedger
from parallab.core.jobs import ResolvedJob
from parallab.core.ledger import End, Ending, Ledger, Submitted
from parallab.core.pools import PoolSettings
from workers.coordinator import Coordinator, RunAt
from workers.engines.base import EngineState, LaunchRefused, PoolEngine
from workers.launcher import ProgressTail

log = logging.getLogger(__name__)


class JobHandle(Protocol):
    """A run's job in its scheduler: the run, and the scheduler's id of the job."""

    @property
    def run_id(self) -> str: ...

    @property
    def job_id(self) -> str: ...


H = TypeVar("H", bound=JobHandle)


class NoSuchPool(LookupError):
    """The agent was started for a pool that is not a declared pool of its kind."""


class SchedulerAgent(Generic[H]):
    """Submits, watches, cancels and stores the runs of one scheduler pool."""

    pool_settings: type[PoolSettings]
    """The settings model of the agent's pool kind (a pool of another kind is refused)."""
    engine_class: Callable[..., PoolEngine[H]]
    """The kind's engine, built as `engine_class(pool, settings, max_job_seconds=, trace_cap_bytes=, allowed_modules=)`."""
    job_handle: Callable[[str, str], H]
    """A watched job's handle from its run id and job id."""
    unavailable: type[Exception]
    """What the engine raises when its scheduler does not answer: the round waits for the next."""
    label: str
    """The scheduler's name, in messages (`Slurm`)."""
    job_noun: str
    """What a job is called in messages (`Slurm job`)."""
    start_failure: str | None = None
    """Set: any other error of a launch fails the run with these words and the error; unset, it ends the round."""

    def __init__(self, settings: Settings, pool: str, ledger: Ledger | None = None, *, poll_s: float):
        self.settings, self.pool, self.poll_s = settings, pool, poll_s
        with session_scope(settings.sqlalchemy_url) as session:
            config = pools.scheduled_pool(session=session, name=pool)
        if not isinstance(config, self.pool_settings):
            kind = self.pool_settings.kind
            raise NoSuchPool(f"no {self.label} pool named {pool!r} (declare it with `parallab pool create-{kind}`)")
        self.engine = self.engine_class(
            pool,
            config,
            max_job_seconds=settings.worker.max_job_seconds,
            trace_cap_bytes=settings.server.max_trace_bytes,
            allowed_modules=settings.limits.allowed_modules,
        )
        self.ledger: Ledger = ledger or DbLedger(settings)
        self.coordinator = Coordinator(self.ledger, catalogue=settings.planner.hardware_catalogue)
        self.tails: dict[str, ProgressTail] = {}

    # ---- after a restart ----

    def reconcile(self) -> list[str]:
        """Adopt the pool's jobs the scheduler holds but the ledger lacks; cancel those whose run
        already ended. Returns the adopted run ids."""
        adopted = []
        for run_id, handle in self.engine.reconcile().items():
            submitted = Submitted(handle.job_id, str(self.engine.run_dir(run_id).log))
            kept = self.ledger.adopt(run_id, pool=self.pool, engine=self.engine.name, submitted=submitted)
            if kept is None:
                continue
            if kept:
                adopted.append(run_id)
                continue
            log.warning("%s %s belongs to no live run of pool %s; cancelling it", self.job_noun, handle.job_id, self.pool)
            self._cancel(handle, "its run is no live run of the pool")
        if adopted:
            log.info("adopted the %s jobs of runs %s", self.label, ", ".join(adopted))
        return adopted

    # ---- one round ----

    def submit(self) -> int:
        """Submit every queued run of the pool not yet submitted; returns how many were taken."""
        taken = 0
        while (run_id := self.ledger.submit_next(self.pool, self.engine.name, self._launch)) is not None:
            taken += 1
            log.info("run %s taken for %s", run_id, self.label)
        return taken

    def _launch(self, run_id: str, job: ResolvedJob) -> Submitted | str:
        """Launch one run's job (the reference curve prefetched first); its job id, or why the
        scheduler or the run directory refused it (the scheduler not answering: left queued)."""
        fetched = self.coordinator.prefetch(job, self.engine.device, self.engine.cache_dir())
        try:
            handle = self.engine.launch(job, run_id)
        except self.unavailable:
            raise
        except LaunchRefused as exc:
            return str(exc)
        except OSError as exc:  # the run root refused the run directory
            return f"could not prepare the run directory on the cluster: {exc}"
        except Exception as exc:
            if self.start_failure is None:
                raise
            log.exception("run %s could not be started on %s", run_id, self.label)
            return f"{self.start_failure}: {exc}"
        files = self.engine.run_dir(run_id)
        if fetched:  # for the result, whichever agent builds it: the curve came from the lab database
            files.reference_fetched.touch()
        return Submitted(handle.job_id, str(files.log))

    def watch(self) -> None:
        """Read every watched job's state and move each run along."""
        handles = [self.job_handle(j.run_id, j.job_id) for j in self.ledger.open_jobs(self.pool)]
        if not handles:
            return
        state_of = self._states(handles)
        for handle in handles:
            try:
                self.follow(handle, state_of(handle))
            except self.unavailable:
                raise
            except Exception:
                log.exception("could not follow run %s (%s %s); trying again next round", handle.run_id, self.job_noun, handle.job_id)

    def follow(self, handle: H, state: EngineState) -> None:
        """Record one job's state and act on it: cancel it, store its progress, or end its run."""
        detail, name = state.detail, self.engine.name
        seen = self.ledger.observe(
            handle.run_id,
            state=str(detail.get(f"{name}_state") or state.status.upper()),
            reason=state.reason,
            nodes=detail.get(f"{name}_nodes"),
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
        log.info("run %s (%s %s) ended %s", handle.run_id, self.job_noun, handle.job_id, final)

    def poll(self) -> None:
        """One round: submit, then watch (the scheduler not answering only delays the round's work)."""
        try:
            self.submit()
            self.watch()
        except self.unavailable as exc:
            log.warning("%s did not answer (%s); trying again in %.0f s", self.label, exc, self.poll_s)

    def run(self, stop: threading.Event) -> None:
        """Reconcile, then poll until `stop` is set (a database or scheduler blip never ends the agent)."""
        while not stop.is_set():
            try:
                self.reconcile()
                break
            except Exception:
                log.exception("could not reconcile with %s; trying again", self.label)
                stop.wait(self.poll_s)
        while not stop.is_set():
            try:
                self.poll()
            except Exception:
                log.exception("agent round failed; trying again")
            stop.wait(self.poll_s)

    # ---- hooks: where a kind's engine differs ----

    def _states(self, handles: list[H]) -> Callable[[H], EngineState]:
        """How this round reads a watched job's state: one engine call a job, unless the kind reads them all at once."""
        return self.engine.state

    def _cancel(self, handle: H, reason: str = "cancelled") -> None:
        """Cancel a job (the scheduler not answering ends the round, unless the kind says otherwise)."""
        self.engine.cancel(handle, reason)

    # ---- small pieces ----

    def _progress(self, run_id: str) -> None:
        tail = self.tails.setdefault(run_id, ProgressTail(self.engine.run_dir(run_id).progress))
        if (line := tail.poll()) is not None:
            self.ledger.progress(run_id, line)
