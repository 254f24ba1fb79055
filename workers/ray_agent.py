"""`parallab ray-agent --pool NAME`: the Ray pool's driver of the run coordinator, beside the lab (or on the cluster's head).

A state machine over the Ray engine (`workers.engines.ray_cluster`), the ledger
(`parallab.core.ledger`, the lab database's `backend.services.ledger.DbLedger`) and the run
coordinator (`workers.coordinator`), one round every `poll_s`, as the Slurm pool's agent is:

1. submit: each queued run of the pool not yet submitted is taken (row-locked), its reference
   curve copied into the pool's cache (`Coordinator.prefetch`), its placement group placed and its
   rank actors started, and its placement group recorded as its job in the same transaction; a job
   the cluster cannot place (or an entry point this agent does not allow) fails its run saying why;
   the cluster not answering leaves the run queued;
2. watch: every watched job's state is recorded; a started job makes its run running, a cancelled
   run's actors are stopped and its placement group removed, and a finished job's run is ended by
   the coordinator (`Coordinator.conclude`: collect, build the one document, share the reference,
   finish) as a worker's run is.

The agent holds nothing in memory that matters: the actors and placement groups are detached and
named after their runs, and on start it reconciles (`engine.reconcile`): a run's actors the ledger
lacks (the agent died between the launch and its commit) are adopted, or stopped when their run
already ended; a watched run whose actors are gone ends `failed`, saying which rank's actor.
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
from parallab.core.pools import RayPool
from workers.coordinator import Coordinator, RunAt
from workers.engines.base import EngineState, LaunchRefused
from workers.engines.ray_cluster import RayEngine, RayHandle, RayUnavailable
from workers.launcher import ProgressTail

log = logging.getLogger(__name__)


class NoSuchPool(LookupError):
    """The agent was started for a pool that is not a declared Ray pool."""


class RayAgent:
    """Launches, watches, cancels and stores the runs of one Ray pool."""

    def __init__(self, settings: Settings, pool: str, ledger: Ledger | None = None, *, poll_s: float = 2.0):
        self.settings, self.pool, self.poll_s = settings, pool, poll_s
        with session_scope(settings.sqlalchemy_url) as session:
            config = pools.scheduled_pool(session=session, name=pool)
        if not isinstance(config, RayPool):
            raise NoSuchPool(f"no Ray pool named {pool!r} (declare it with `parallab pool create-ray`)")
        self.engine = RayEngine(
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
        """Adopt the pool's runs whose actors Ray holds but the ledger lacks; stop those whose run
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
            log.warning("Ray placement group %s belongs to no live run of pool %s; stopping it", handle.job_id, self.pool)
            self.engine.cancel(handle, "its run is no live run of the pool")
        if adopted:
            log.info("adopted the Ray actors of runs %s", ", ".join(adopted))
        return adopted

    # ---- one round ----

    def submit(self) -> int:
        """Launch every queued run of the pool not yet launched; returns how many were taken."""
        taken = 0
        while (run_id := self.ledger.submit_next(self.pool, self.engine.name, self._launch)) is not None:
            taken += 1
            log.info("run %s launched on Ray", run_id)
        return taken

    def _launch(self, run_id: str, job: ResolvedJob) -> Submitted | str:
        """Place and start one run's ranks (the reference curve prefetched first); its placement
        group, or why the cluster or the run directory refused it (RayUnavailable: left queued)."""
        fetched = self.coordinator.prefetch(job, self.engine.device, self.engine.cache_dir())
        try:
            handle = self.engine.launch(job, run_id)
        except RayUnavailable:
            raise
        except LaunchRefused as exc:
            return str(exc)
        except OSError as exc:
            return f"could not prepare the run directory: {exc}"
        except Exception as exc:  # an actor that could not start: the run fails saying so
            log.exception("run %s could not be started on Ray", run_id)
            return f"could not start the ranks on Ray: {exc}"
        files = self.engine.run_dir(run_id)
        if fetched:
            files.reference_fetched.touch()
        return Submitted(handle.job_id, str(files.log))

    def watch(self) -> None:
        """Read every watched job's state and move each run along."""
        for open_job in self.ledger.open_jobs(self.pool):
            handle = RayHandle(open_job.run_id, open_job.job_id)
            try:
                self.follow(handle, self.engine.state(handle))
            except RayUnavailable:
                raise
            except Exception:
                log.exception("could not follow run %s (Ray placement group %s); trying again next round", handle.run_id, handle.job_id)

    def follow(self, handle: RayHandle, state: EngineState) -> None:
        """Record one job's state and act on it: cancel it, store its progress, or end its run."""
        seen = self.ledger.observe(
            handle.run_id,
            state=state.status.upper(),
            reason=state.reason,
            nodes=state.detail.get("ray_nodes"),
            running=state.status != "queued",
        )
        if seen is None or (seen.cancel and state.active):
            self.engine.cancel(handle)
            return
        if state.active:
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
        log.info("run %s (Ray placement group %s) ended %s", handle.run_id, handle.job_id, final)

    def poll(self) -> None:
        """One round: submit, then watch (Ray not answering only delays the round's work)."""
        try:
            self.submit()
            self.watch()
        except RayUnavailable as exc:
            log.warning("Ray did not answer (%s); trying again in %.0f s", exc, self.poll_s)

    def run(self, stop: threading.Event) -> None:
        """Reconcile, then poll until `stop` is set (a database or Ray blip never ends the agent)."""
        while not stop.is_set():
            try:
                self.reconcile()
                break
            except Exception:
                log.exception("could not reconcile with Ray; trying again")
                stop.wait(self.poll_s)
        while not stop.is_set():
            try:
                self.poll()
            except Exception:
                log.exception("agent round failed; trying again")
            stop.wait(self.poll_s)

    def _progress(self, run_id: str) -> None:
        tail = self.tails.setdefault(run_id, ProgressTail(self.engine.run_dir(run_id).progress))
        if (line := tail.poll()) is not None:
            self.ledger.progress(run_id, line)
