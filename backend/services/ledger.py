"""The run side's ledger over the lab's database: `parallab.core.ledger.Ledger`'s one implementation.

Every method is one transaction of its own (`session_scope`), so a coordinator holds no session
between steps. The writes a run's outcome depends on — its claim, a node's end and the run's end —
are retried while the database is away (`with_db_retry`): a finished job's outcome must not be lost
to a database blip, nor a queued run's one message on the queue (a claim that gives up puts the run
back). The rest is best effort where the coordinator says so.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from pydantic import ValidationError
from sqlalchemy.exc import InterfaceError, OperationalError

from backend.config import Settings
from backend.db import session_scope
from backend.models import FINISHED_STATUSES, Run, utcnow
from backend.services import pools
from backend.services import workers as fleet
from backend.services.hardware import latest_profile
from backend.services.ingest import attach_result
from backend.services.workers import NotReserved
from backend.store import pools as pool_store
from backend.store import references as reference_store
from backend.store import runs as store
from backend.store import workers as worker_store
from parallab.core.jobs import ResolvedJob, resolve_job
from parallab.core.ledger import (
    BuildContext,
    Claimed,
    End,
    Ending,
    GangState,
    NodeClaim,
    Observed,
    OpenJob,
    Refusal,
    Refused,
    Submit,
    Submitted,
    WorkerInfo,
)
from parallab.core.problems import SpecError
from parallab.core.reference import reference_job, reference_key
from parallab.core.spec import JobSpec

log = logging.getLogger(__name__)
T = TypeVar("T")


def frozen_job(run: Run, settings: Settings) -> ResolvedJob:
    """The job frozen into the run at submission. A run queued before jobs were frozen has none:
    its spec is resolved here, once, under the deployment's limits as a submission is today, and
    the result stored in the row (the caller commits)."""
    if run.job is not None:
        return ResolvedJob.model_validate(run.job)
    job = resolve_job(JobSpec.model_validate(run.spec), settings.limits)
    run.job = job.model_dump(mode="json")
    return job


def with_db_retry(settings: Settings, what: str, fn: Callable[[], T], *, give_up_after_s: float = 600) -> T:
    """Call `fn` (one transaction) until the database answers; gives up (raises) after `give_up_after_s`."""
    deadline = time.monotonic() + give_up_after_s
    pause = 0.5
    while True:
        try:
            return fn()
        except (OperationalError, InterfaceError) as exc:
            if time.monotonic() > deadline:
                raise
            log.warning("%s: database unavailable (%s); retrying in %.1f s", what, exc, pause)
            time.sleep(pause)
            pause = min(pause * 2, settings.worker.heartbeat_s)


def _holds(run: Run, worker: WorkerInfo | None) -> bool:
    """Whether the run's end is still the caller's to write: a worker's while it holds the lease of
    a running run; a scheduler's job's while the run has not ended another way (cancelled while pending)."""
    if worker is not None:
        return run.status == "running" and run.worker_id == worker.id
    return run.status not in FINISHED_STATUSES


class DbLedger:
    """The ledger of one lab database (`settings.sqlalchemy_url`)."""

    def __init__(self, settings: Settings, *, give_up_after_s: float = 600):
        """`give_up_after_s`: how long a write waits for an unavailable database (`with_db_retry`)."""
        self.settings, self.give_up_after_s = settings, give_up_after_s

    def _db(self) -> Any:
        return session_scope(self.settings.sqlalchemy_url)

    # ---- a worker's run ----

    def claim(self, run_id: str, me: WorkerInfo, endpoint: str) -> Claimed | Refused:
        """The run moved to running with its hosts reserved, or why not. Retried while the database
        is away; when it stays away the run is put back on its queue (`Refusal.REQUEUE`: its
        transaction never committed, so it is still queued), where a raised error would have lost
        the queue's message and left the run queued with nothing to start it."""
        try:
            return with_db_retry(
                self.settings, f"claiming run {run_id}", lambda: self._claim(run_id, me, endpoint), give_up_after_s=self.give_up_after_s
            )
        except (OperationalError, InterfaceError) as exc:
            log.warning("could not claim run %s, the database is away (%s): putting it back on its queue", run_id, exc)
            return Refused(Refusal.REQUEUE, None)

    def _claim(self, run_id: str, me: WorkerInfo, endpoint: str) -> Claimed | Refused:
        with self._db() as session:
            run = store.get_run_for_update(session, run_id)
            if run is None or run.status != "queued":
                log.info("run %s is %s; not running it", run_id, run.status if run else "missing")
                return Refused(Refusal.SKIP)
            pool = run.pool or me.pool
            try:
                job = frozen_job(run, self.settings)
            except (SpecError, ValidationError) as exc:
                store.set_status(session, run, "failed", error=f"invalid spec: {exc}")
                return Refused(Refusal.FAILED, pool)
            gang_endpoint = endpoint if job.nodes > 1 else None
            try:
                nodes = fleet.reserve(session=session, run=run, job=job, me=me, settings=self.settings, endpoint=gang_endpoint)
            except NotReserved as exc:
                session.rollback()  # nothing taken: all-or-nothing
                if not exc.impossible:
                    log.info("run %s waits for hosts: %s", run_id, exc)
                    return Refused(Refusal.REQUEUE_NOW if exc.mine_taken else Refusal.REQUEUE, pool)
                run = store.get_run_for_update(session, run_id)
                if run is None or run.status != "queued":
                    return Refused(Refusal.SKIP)
                error = f"cannot be placed: {exc}, and fewer than {job.nodes} hosts of it are alive"
                store.set_status(session, run, "failed", error=error)
                return Refused(Refusal.FAILED, pool)
            store.set_status(session, run, "running")
            return Claimed(job, pool, [(n.node_rank, n.worker_id) for n in nodes], gang_endpoint)

    def fail_queued(self, run_id: str, error: str) -> None:
        with self._db() as session:
            run = store.get_run_for_update(session, run_id)
            if run is not None and run.status == "queued":
                store.set_status(session, run, "failed", error=error)

    def gang(self, run_id: str, me: WorkerInfo | None = None) -> GangState | None:
        with self._db() as session:
            if me is not None:
                fleet.heartbeat(session=session, info=me)
            return fleet.gang_state(session=session, run_id=run_id, settings=self.settings)

    def record_pgid(self, run_id: str, node_rank: int, pgid: int) -> None:
        with self._db() as session:
            worker_store.set_node_pgid(session, run_id, node_rank, pgid)

    def fail_node(self, run_id: str, node_rank: int, reason: str) -> None:
        with self._db() as session:
            fleet.fail_node(session=session, run_id=run_id, node_rank=node_rank, reason=reason)

    def claim_node(self, run_id: str, node_rank: int, me: WorkerInfo) -> NodeClaim | None:
        with self._db() as session:
            claimed = fleet.claim_node(session=session, run_id=run_id, node_rank=node_rank, me=me)
            run = store.get_run(session, run_id)
            if claimed is None or run is None or run.job is None or claimed.endpoint is None:
                return None
            return NodeClaim(ResolvedJob.model_validate(run.job), claimed.endpoint)

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
        def write() -> None:
            with self._db() as session:
                # The run's row first, locked: node 0 writes the run's end under the same lock
                # (`finish`), so of the two whichever writes second sees the other's work — a dump
                # handed on while the run still runs is merged by node 0's end, one handed on after
                # it is merged here. Read unlocked, both could miss the other and the dump be lost.
                run = store.get_run_for_update(session, run_id)
                fleet.finish_node(
                    session=session, run_id=run_id, node_rank=node_rank, worker_id=me.id, status=status, reason=reason, records=records
                )
                if status == "succeeded":
                    worker_store.add_traces(session, run_id, traces)
                if flight:
                    store.add_node_flight(session, run_id, node_rank, flight)
                    if run is not None and run.status == "failed" and run.job is not None:
                        store.merge_late_flight(session, run_id, world_size=ResolvedJob.model_validate(run.job).world_size, files=flight)

        with_db_retry(self.settings, f"storing node {node_rank} of run {run_id}", write, give_up_after_s=self.give_up_after_s)

    def node_flight(self, run_id: str) -> dict[int, str]:
        with self._db() as session:
            return store.node_flight(session, run_id)

    # ---- any run ----

    def reference(self, key: str, device: str) -> list[float] | None:
        with self._db() as session:
            row = reference_store.get_curve(session, key, device)
            return [float(x) for x in row.loss] if row is not None else None

    def share_reference(self, job: ResolvedJob, *, device: str, loss: Sequence[float], run_id: str) -> None:
        with self._db() as session:
            reference_store.add_curve(
                session,
                key=reference_key(job),
                device=device,
                model=job.workload.model,
                seed=job.workload.seed,
                workload=reference_job(job).workload_document(),
                loss=list(loss),
                run_id=run_id,
            )

    def context(self, run_id: str, pool: str) -> BuildContext:
        with self._db() as session:
            hosts = [n.host for n in worker_store.get_nodes(session, run_id)]
            return BuildContext(
                hosts=hosts or None,
                profile=latest_profile(session=session, pool=pool),
                topology=pools.pool_topology(session=session, name=pool),
            )

    def finish(self, run_id: str, ending: Ending, *, worker: WorkerInfo | None = None) -> str:
        def write() -> str:
            with self._db() as session:
                job = pool_store.get_engine_job_for_update(session, run_id) if worker is None else None
                if job is not None:
                    job.finished, job.updated_at = True, utcnow()
                run = store.get_run_for_update(session, run_id)
                if run is None:
                    return "missing"
                if _holds(run, worker):
                    self._write_end(session, run, ending)
                else:
                    log.warning("run %s ended elsewhere (%s) while it ran here; not overwriting", run_id, run.status)
                if worker is not None:
                    node_status = {"succeeded": "succeeded", "cancelled": "stopped"}.get(run.status, "failed")
                    fleet.finish_node(
                        session=session,
                        run_id=run_id,
                        node_rank=0,
                        worker_id=worker.id,
                        status=node_status,
                        reason=ending.error,
                        records=None,
                    )
                    fleet.close_nodes(session=session, run_id=run_id)
                return run.status

        return with_db_retry(self.settings, f"storing the end of run {run_id}", write, give_up_after_s=self.give_up_after_s)

    @staticmethod
    def _write_end(session: Any, run: Run, ending: Ending) -> None:
        if ending.end is End.SUCCEEDED and ending.document is not None:
            attach_result(session, run=run, document=ending.document, traces=ending.traces, pool=run.pool)
            return
        store.set_status(session, run, ending.end.value, error=ending.error)
        if ending.end is End.FAILED:
            worker_store.delete_traces(session, run.id)  # other nodes' traces: nothing half-kept
            if ending.flight is not None:
                store.set_flight_recorder(session, run.id, ending.flight)
            # dumps another node handed on after node 0 last read them (`finish_node` takes this
            # run's lock, so none can come between here and the commit)
            if (late := store.node_flight(session, run.id)) and run.job is not None:
                store.merge_late_flight(session, run.id, world_size=ResolvedJob.model_validate(run.job).world_size, files=late)

    # ---- a scheduler's runs ----

    def submit_next(self, pool: str, engine: str, submit: Submit) -> str | None:
        with self._db() as session:
            found = pools.next_to_submit(session=session, pool=pool)
            if found is None:
                return None
            run, job = found
            outcome = submit(run.id, job)
            if isinstance(outcome, str):
                pools.submission_failed(session=session, run=run, error=outcome)
            else:
                pools.record_submission(session=session, run=run, engine=engine, pool=pool, job_id=outcome.job_id, output=outcome.output)
            return run.id

    def open_jobs(self, pool: str) -> list[OpenJob]:
        with self._db() as session:
            return [OpenJob(j.run_id, j.job_id) for j in pools.open_jobs(session=session, pool=pool)]

    def observe(self, run_id: str, *, state: str, reason: str | None, nodes: str | None, running: bool) -> Observed | None:
        with self._db() as session:
            return pools.observe(session=session, run_id=run_id, state=state, reason=reason, nodes=nodes, running=running)

    def progress(self, run_id: str, line: dict[str, Any]) -> None:
        with self._db() as session:
            store.set_progress(session, run_id, line)

    def adopt(self, run_id: str, *, pool: str, engine: str, submitted: Submitted) -> bool | None:
        with self._db() as session:
            if pools.engine_job(session=session, run_id=run_id) is not None:
                return None
            return pools.adopt(session=session, run_id=run_id, engine=engine, pool=pool, job_id=submitted.job_id, output=submitted.output)
