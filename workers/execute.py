"""The Celery worker's driver of the run coordinator, and `parallab bench`'s launch without a database.

`parallab bench` calls :func:`run_and_collect` directly with a `ResolvedJob`; the Celery tasks call
:func:`execute_run` (a run's node 0) and :func:`execute_node` (another host's part of a multi-node
run). Both drive `workers.coordinator.Coordinator` over the host engine
(`workers.engines.host_torchrun`) and the lab database's ledger (`backend.services.ledger`); what
is the Celery worker's own stays here: putting a run whose hosts are busy back on its queue
(holding nothing while it waits), and telling a multi-node run's other hosts to start their part.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from backend.config import Settings
from backend.queue import enqueue_run, send_node
from backend.services.ledger import DbLedger
from parallab.core.hardware import HardwareProfile
from parallab.core.jobs import ResolvedJob
from parallab.core.ledger import BuildContext, Claimed, Ledger, Refusal, Refused, WorkerInfo
from parallab.core.result import ResultDocument
from parallab.core.rundir import RunDir
from workers import fleet as worker_fleet
from workers.aggregate import read_rank_records
from workers.coordinator import Coordinator, build_document
from workers.engines.base import LaunchRefused
from workers.engines.host_torchrun import HostTorchrun, LocalWatch, reference_cache_dir
from workers.engines.outputs import failure_message, kept_node_flight, read_traces
from workers.launcher import LaunchOutcome, NodeLaunch
from workers.watch import Watcher

log = logging.getLogger(__name__)

REQUEUE_PAUSE_S = 1.0
"""How long a worker that could not reserve its hosts waits before putting the job back (holding nothing)."""


@dataclass
class Collected:
    outcome: LaunchOutcome
    document: ResultDocument | None = None
    traces: dict[int, bytes] = field(default_factory=dict)
    error: str | None = None
    """Why it failed, with the log tail, when it did."""


def failure_reason(run_dir: RunDir, outcome: LaunchOutcome) -> str:
    """Why the ranks failed: a rank's failure record when one wrote it (the loss diverged), else the
    launcher's reason; with the log tail either way."""
    return failure_message(run_dir, outcome.reason or "", outcome.log_tail)


def run_and_collect(
    job: ResolvedJob,
    run_dir: Path,
    *,
    settings: Settings,
    on_progress: Callable[[dict[str, Any]], None] | None = None,
    should_cancel: Callable[[], bool] | None = None,
    profile: HardwareProfile | None = None,
) -> Collected:
    """Launch `job` in `run_dir` under the settings' limits, through the host engine as a worker
    does, and build its result document; the prediction's step time uses the pool's calibrated
    `profile` when there is one."""
    engine = HostTorchrun(settings, watcher=LocalWatch(on_progress, should_cancel), runs_dir=run_dir.parent)
    handle = engine.launch(job, run_dir.name)
    files = handle.run_dir
    outcome = handle.outcome or LaunchOutcome(None, "launch failed", "")
    if not outcome.ok:
        return Collected(outcome, error=failure_reason(files, outcome))
    try:
        records = read_rank_records(files, job.world_size)
        facts = engine.facts(handle, engine.state(handle))
        document = build_document(job, [records], BuildContext(profile=profile), facts, catalogue=settings.planner.hardware_catalogue)
    except Exception as exc:  # a rank wrote a bad or partial record
        log.exception("could not build the result of %s", run_dir)
        return Collected(outcome, error=f"could not build the result document: {exc}\n--- log tail ---\n{outcome.log_tail}")
    traces = read_traces(files, job.world_size, settings.server.max_trace_bytes) if job.spec.trace else {}
    return Collected(outcome, document=document, traces=traces)


def _free_endpoint(address: str) -> str:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return f"{address}:{sock.getsockname()[1]}"


def _local_addr(settings: Settings, me: WorkerInfo) -> str | None:
    """The address torchrun gives the other nodes for this one: said outright on an emulated node
    (its namespace's only route out), left to torchrun's own look-up on a real host."""
    return me.address if settings.worker.worker_netns else None


def coordinator(settings: Settings, ledger: Ledger | None = None) -> Coordinator:
    """The coordinator of this worker's runs, over the lab database's ledger (or `ledger`)."""
    return Coordinator(
        ledger or DbLedger(settings), catalogue=settings.planner.hardware_catalogue, node_timeout_s=settings.worker.reservation_timeout_s
    )


def watcher(settings: Settings, ledger: Ledger, run_id: str, node_rank: int, me: WorkerInfo) -> Watcher:
    return Watcher(
        ledger,
        run_id=run_id,
        node_rank=node_rank,
        me=me,
        reservation_timeout_s=settings.worker.reservation_timeout_s,
        heartbeat_s=settings.worker.heartbeat_s,
    )


def claim_run(settings: Settings, run_id: str, me: WorkerInfo) -> Claimed | Refused:
    """The claim alone (tests read it): a queued run moved to running with its hosts reserved, or why not."""
    return DbLedger(settings).claim(run_id, me, _free_endpoint(me.address))


def _requeue(settings: Settings, ledger: Ledger, run_id: str, refused: Refused, me: WorkerInfo) -> str:
    """Put a run whose hosts are busy back on its queue (after a pause unless this worker is itself
    reserved by a gang); a queue that cannot be reached fails the run."""
    if refused.refusal is Refusal.REQUEUE:
        time.sleep(REQUEUE_PAUSE_S)
    try:
        enqueue_run(settings, run_id, pool=refused.pool or me.pool)
    except Exception as exc:
        log.exception("could not put run %s back on its queue", run_id)
        ledger.fail_queued(run_id, f"could not reach the job queue while waiting for hosts: {exc}")
        return "failed"
    return "requeued"


def execute_run(run_id: str, settings: Settings, worker: WorkerInfo | None = None) -> str:
    """Run a queued run end to end as its node 0; returns its final status ("skipped", "requeued"
    when it was not started). Never raises for a failed job."""
    me = worker or worker_fleet.current(settings)
    ledger = DbLedger(settings)

    def open_engine(claim: Claimed) -> HostTorchrun:
        node = None
        if claim.endpoint is not None:
            node = NodeLaunch(
                claim.job.nodes,
                0,
                claim.endpoint,
                run_id,
                join_timeout_s=int(settings.worker.reservation_timeout_s),
                local_addr=_local_addr(settings, me),
            )
            for rank, worker_id in claim.nodes[1:]:
                try:
                    send_node(settings, worker_id=worker_id, run_id=run_id, node_rank=rank)
                except Exception as exc:  # the reserved host cannot be told: the run cannot start
                    log.exception("could not send node %d of run %s", rank, run_id)
                    raise LaunchRefused(f"could not reach node {rank}'s worker: {exc}") from exc
        return HostTorchrun(settings, watcher=watcher(settings, ledger, run_id, 0, me), node=node)

    ended = coordinator(settings, ledger).run(
        run_id, me, endpoint=_free_endpoint(me.address), open_engine=open_engine, cache_dir=reference_cache_dir(settings)
    )
    if not isinstance(ended, Refused):
        return ended
    if ended.refusal is Refusal.SKIP:
        return "skipped"
    if ended.refusal is Refusal.FAILED:
        return "failed"
    return _requeue(settings, ledger, run_id, ended, me)


# ---- another host's part of a multi-node run ----


def execute_node(run_id: str, node_rank: int, settings: Settings, worker: WorkerInfo | None = None) -> str:
    """Run this worker's reserved part of a multi-node run and hand its records on; returns the node's status."""
    me = worker or worker_fleet.current(settings)
    ledger = DbLedger(settings)
    claimed = ledger.claim_node(run_id, node_rank, me)
    if claimed is None:
        log.info("node %d of run %s is not reserved for this worker; not running it", node_rank, run_id)
        return "skipped"
    job = claimed.job
    node = NodeLaunch(
        job.nodes,
        node_rank,
        claimed.endpoint,
        run_id,
        join_timeout_s=int(settings.worker.reservation_timeout_s),
        local_addr=_local_addr(settings, me),
    )
    engine = HostTorchrun(settings, watcher=watcher(settings, ledger, run_id, node_rank, me), node=node)
    status, reason = "failed", None
    records: list[dict[str, Any]] | None = None
    traces: dict[int, bytes] = {}
    flight: dict[int, str] | None = None
    try:
        handle = engine.launch(job, run_id)
    except Exception as exc:
        log.exception("node %d of run %s could not be launched", node_rank, run_id)
        reason = f"could not launch the job: {exc}"
    else:
        state = engine.state(handle)
        if state.status != "succeeded":
            status, reason = ("stopped" if state.stopped else "failed"), engine.failure(handle, state)
            flight = kept_node_flight(handle.run_dir, job, node_rank)
        else:
            try:
                found = engine.collect(handle, job)
                status, records, traces = "succeeded", [r.model_dump(mode="json") for r in found.records], found.traces
            except ValueError as exc:
                reason = str(exc)
    ledger.finish_node(run_id, node_rank, me, status=status, reason=reason, records=records, traces=traces, flight=flight)
    return status
