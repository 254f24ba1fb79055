"""`parallab slurm-agent --pool NAME`: the coordinator of a Slurm pool, on the cluster's login node.

A state machine over the Slurm engine (`workers.engines.slurm`) and the pool's ledger in the
database (`backend.services.pools`), one round every `slurm_poll_s`:

1. submit: each queued run of the pool not yet submitted is taken (row-locked), `sbatch`ed, and
   its Slurm job id recorded in the same transaction; a job Slurm refuses (an unknown partition)
   fails its run with Slurm's own message. Before the `sbatch`, the lab database's reference curve
   of the job is copied into the pool's cache on the shared filesystem, as a worker copies it
   into its host's (`workers.execute.prefetch_reference`);
2. watch: one `squeue` for every job the pool still watches; a job's state is recorded with its
   reason (PENDING with Slurm's reason keeps the run queued), a started job makes its run running,
   a cancelled run's job is `scancel`ed, and a finished job ends its run — its ranks' records read
   back from the shared filesystem and built into a result document as a worker builds it (the
   pool's calibration for the prediction, the host noise the batch script sampled on the first
   node), its reference curve shared with the lab (`workers.execute.share_reference`), and
   stored through the same ingest a worker uses.

The agent holds nothing in memory that matters: on start it reconciles (`engine.reconcile`): jobs
of the pool that Slurm knows by name and comment but the ledger lacks (the agent died between
`sbatch` and its commit) are adopted, or cancelled when their run already ended; a watched job
that Slurm no longer knows ends its run `failed`, saying it vanished.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from backend.config import Settings
from backend.db import session_scope
from backend.services import pools
from backend.services.hardware import latest_profile
from parallab.core.hardware import load_catalogue
from parallab.core.jobs import ResolvedJob
from parallab.core.noise import HostNoise
from parallab.core.result import ResultDocument
from workers.aggregate import build_result, merge_nodes
from workers.engines.base import EngineState, LaunchRefused
from workers.engines.slurm import SlurmEngine, SlurmHandle, SlurmUnavailable
from workers.execute import prefetch_reference, share_reference
from workers.launcher import ProgressTail

log = logging.getLogger(__name__)


class NoSuchPool(LookupError):
    """The agent was started for a pool that is not a declared Slurm pool."""


def read_noise(path: Path) -> HostNoise | None:
    """The host noise the batch script sampled, or None where it wrote none or nothing readable:
    the run's result stands without it (`noise` is optional), never fails for it."""
    try:
        return HostNoise.model_validate_json(path.read_text())
    except (OSError, ValidationError) as exc:
        if path.exists():
            log.warning("ignoring the host noise in %s: %s", path, exc)
        return None


class SlurmAgent:
    """Submits, watches, cancels and stores the runs of one Slurm pool."""

    def __init__(self, settings: Settings, pool: str):
        self.settings, self.pool = settings, pool
        with session_scope(settings.sqlalchemy_url) as session:
            config = pools.slurm_pool(session=session, name=pool)
        if config is None:
            raise NoSuchPool(f"no Slurm pool named {pool!r} (declare it with `parallab pool create-slurm`)")
        self.engine = SlurmEngine(
            pool,
            config,
            max_job_seconds=settings.max_job_seconds,
            trace_cap_bytes=settings.max_trace_bytes,
            allowed_modules=settings.allowed_modules,
        )
        self.tails: dict[str, ProgressTail] = {}

    def _db(self) -> Any:
        return session_scope(self.settings.sqlalchemy_url)

    # ---- after a restart ----

    def reconcile(self) -> list[str]:
        """Adopt the pool's jobs Slurm knows but the ledger lacks; cancel those whose run already ended. Returns the adopted run ids."""
        adopted = []
        for run_id, handle in self.engine.reconcile().items():
            output = str(self.engine.run_dir(run_id).log)
            with self._db() as session:
                if pools.engine_job(session=session, run_id=run_id) is not None:
                    continue
                kept = pools.adopt(
                    session=session, run_id=run_id, engine=self.engine.name, pool=self.pool, job_id=handle.job_id, output=output
                )
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
        while True:
            with self._db() as session:
                found = pools.next_to_submit(session=session, pool=self.pool)
                if found is None:
                    return taken
                run, job = found
                taken += 1
                fetched = prefetch_reference(self.settings, job, self.engine.device, cache_dir=self.engine.cache_dir())
                try:
                    handle = self.engine.launch(job, run.id)
                except LaunchRefused as exc:
                    pools.submission_failed(session=session, run=run, error=str(exc))
                    continue
                except OSError as exc:  # the shared filesystem refused the run directory
                    pools.submission_failed(session=session, run=run, error=f"could not prepare the run directory on the cluster: {exc}")
                    continue
                files = self.engine.run_dir(run.id)
                if fetched:  # for the result, whichever agent builds it: the curve came from the lab database
                    files.reference_fetched.touch()
                output = str(files.log)
                pools.record_submission(
                    session=session, run=run, engine=self.engine.name, pool=self.pool, job_id=handle.job_id, output=output
                )
                log.info("run %s submitted as Slurm job %s", run.id, handle.job_id)

    def watch(self) -> None:
        """Read every watched job's state in one `squeue` and move each run along."""
        with self._db() as session:
            handles = [SlurmHandle(j.run_id, j.job_id) for j in pools.open_jobs(session=session, pool=self.pool)]
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
        with self._db() as session:
            seen = pools.observe(
                session=session,
                run_id=handle.run_id,
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
        status, error, document = state.status, None, None
        traces: dict[int, bytes] = {}
        if state.status == "succeeded":
            try:
                document, traces = self.result(handle, seen.job, detail)
            except Exception as exc:
                log.exception("could not build the result of run %s", handle.run_id)
                status, error = "failed", f"could not build the result document: {exc}"
        elif state.status == "failed":
            error = self.engine.failure(handle, state)
        else:
            error = f"cancelled: {state.reason}"
        with self._db() as session:
            final = pools.finish(session=session, run_id=handle.run_id, status=status, error=error, document=document, traces=traces)
        self.tails.pop(handle.run_id, None)
        log.info("run %s (Slurm job %s) ended %s", handle.run_id, handle.job_id, final)

    def result(self, handle: SlurmHandle, frozen: dict[str, Any] | None, detail: dict[str, Any]) -> tuple[ResultDocument, dict[int, bytes]]:
        """The result document of a job that completed, with its Slurm job id and nodes in `hardware`."""
        try:
            job = ResolvedJob.model_validate(frozen)
        except ValidationError as exc:
            raise ValueError(f"the run's frozen job is unreadable: {exc}") from exc
        found = self.engine.collect(handle, job)
        nodes = detail.get("slurm_nodes")
        hosts = self.engine.hostnames(nodes) if nodes else None
        catalogue = load_catalogue(self.settings.hardware_catalogue)
        with self._db() as session:
            profile = latest_profile(session=session, pool=self.pool)  # the pool's calibration, for the step-time estimate
        files = self.engine.run_dir(handle.run_id)
        noise = read_noise(files.noise)
        records = merge_nodes([found.records], job.world_size)
        document = build_result(job, records, hosts=hosts, profile=profile, catalogue=catalogue, noise=noise)
        hardware = {**document.hardware, "slurm_job_id": handle.job_id, "slurm_nodes": nodes, "slurm_pool": self.pool}
        document = document.model_copy(update={"hardware": hardware})
        fetched = files.reference_fetched.exists()
        document = share_reference(self.settings, job, document, device=self.engine.device, run_id=handle.run_id, fetched=fetched)
        return document, found.traces

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
            with self._db() as session:
                pools.progress(session=session, run_id=run_id, line=line)
