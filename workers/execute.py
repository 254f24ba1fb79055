"""Run a job and turn its ranks' records into a result document.

`parallab bench` calls :func:`run_and_collect` directly with a `ResolvedJob`; the Celery tasks call
:func:`execute_run` (a run's node 0, which claims the run) and :func:`execute_node` (another host's
part of a multi-node run), which add the database around it:

- the claim: a status guard (only a `queued` run starts, so a redelivered message never starts it
  twice) and, in the same transaction, the reservation of every host the job needs
  (`backend.services.workers.reserve`); a worker that cannot take them all now holds nothing and
  puts the job back on its queue;
- the launch, through the host engine (`workers.engines.host_torchrun`, one implementation of
  `workers.engines.base.Engine`: launch, state, cancel, collect, reconcile);
- the watch (`workers.watch`): live progress, the lease renewed with this worker's heartbeat,
  cancel, and any other node's fault, which stops every node;
- the reference: before launching, node 0 copies the lab's fp32 reference curve of the
  job from the database into this host's cache when the host has none; after a successful run it
  stores the curve the ranks used when the database lacks it (computed, or the host's own), so each
  workload pays for its reference once per lab, not once per host (`parallab.core.reference`);
- the end: node 0 merges every node's rank records (the other hosts hand theirs on through the
  database) and stores the result, or the one reason the run failed, in one transaction — fenced:
  a run that meanwhile ended elsewhere (reconciled as lost) is not overwritten.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from pydantic import ValidationError
from sqlalchemy.exc import InterfaceError, OperationalError

from backend.config import Settings
from backend.db import session_scope
from backend.models import Run
from backend.queue import enqueue_run, send_node
from backend.services import workers as fleet
from backend.services.hardware import latest_profile
from backend.services.ingest import attach_result
from backend.services.pools import pool_topology
from backend.services.workers import NotReserved, WorkerInfo
from backend.store import references as reference_store
from backend.store import runs as store
from backend.store import workers as worker_store
from parallab.core.hardware import HardwareProfile, load_catalogue
from parallab.core.jobs import Limits, ResolvedJob, resolve_job
from parallab.core.problems import SpecError
from parallab.core.reference import cache_path, is_reference, read_cached, reference_job, reference_key, write_cached
from parallab.core.result import RankRecord, ResultDocument
from parallab.core.rundir import RunDir
from parallab.core.spec import JobSpec
from workers import fleet as worker_fleet
from workers.aggregate import build_result, merge_nodes, read_rank_records
from workers.engines.host_torchrun import HostTorchrun, LocalWatch, reference_cache_dir
from workers.engines.outputs import failure_message, flight_recorder, read_traces
from workers.launcher import LaunchOutcome, NodeLaunch
from workers.watch import Watcher

log = logging.getLogger(__name__)
T = TypeVar("T")

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


def prefetch_reference(settings: Settings, job: ResolvedJob, device: str, *, cache_dir: Path | None = None) -> bool:
    """Before the launch: copy the lab database's reference curve of `job` (computed on `device`)
    into the ranks' cache (this host's, or `cache_dir`: a Slurm pool's on its shared filesystem)
    when it has none. True if it did (the ranks then read it from there). Best effort: without it
    the ranks compute the curve, as before."""
    if not job.trains or is_reference(job):
        return False
    path = cache_path(cache_dir or reference_cache_dir(settings), job)
    if read_cached(path) is not None:
        return False
    try:
        with session_scope(settings.sqlalchemy_url) as session:
            row = reference_store.get_curve(session, reference_key(job), device)
            curve = [float(x) for x in row.loss] if row is not None else None
        if curve is None:
            return False
        write_cached(path, job, curve)
    except Exception:
        log.warning("could not fetch the reference curve of %s from the lab database", reference_key(job), exc_info=True)
        return False
    return True


def share_reference(
    settings: Settings, job: ResolvedJob, document: ResultDocument, *, device: str, run_id: str, fetched: bool
) -> ResultDocument:
    """After a successful run: name the lab database as the reference's source when `prefetch_reference`
    put it in the cache; else store the curve the ranks used (computed, the run's own, or the host's
    cache) unless the database has one already — one transaction, INSERT … ON CONFLICT DO NOTHING.
    Best effort: the run's result never depends on it."""
    loss = document.loss
    if fetched and loss.reference_source == "host cache":
        return document.model_copy(update={"loss": loss.model_copy(update={"reference_source": "lab database"})})
    if not job.trains or not loss.reference or loss.reference_source not in ("computed", "own", "host cache"):
        return document
    try:
        with session_scope(settings.sqlalchemy_url) as session:
            reference_store.add_curve(
                session,
                key=reference_key(job),
                device=device,
                model=job.workload.model,
                seed=job.workload.seed,
                workload=reference_job(job).workload_document(),
                loss=list(loss.reference),
                run_id=run_id,
            )
    except Exception:
        log.warning("could not store the reference curve of run %s in the lab database", run_id, exc_info=True)
    return document


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
        catalogue = load_catalogue(settings.hardware_catalogue)
        document = build_result(
            job,
            read_rank_records(files, job.world_size),
            profile=profile,
            catalogue=catalogue,
            noise=outcome.noise,
            host_speed=outcome.host_speed,
        )
    except Exception as exc:  # a rank wrote a bad or partial record
        log.exception("could not build the result of %s", run_dir)
        return Collected(outcome, error=f"could not build the result document: {exc}\n--- log tail ---\n{outcome.log_tail}")
    traces = read_traces(files, job.world_size, settings.max_trace_bytes) if job.spec.trace else {}
    return Collected(outcome, document=document, traces=traces)


def frozen_job(run: Run, settings: Settings) -> ResolvedJob:
    """The job frozen into the run at submission. A run queued before jobs were frozen has none:
    its spec is resolved here, once, and the result stored in the row (the caller commits)."""
    if run.job is not None:
        return ResolvedJob.model_validate(run.job)
    job = resolve_job(JobSpec.model_validate(run.spec), Limits(max_world_size=settings.max_world_size, max_steps=settings.max_steps))
    run.job = job.model_dump(mode="json")
    return job


def with_db_retry(settings: Settings, what: str, fn: Callable[[], T], *, give_up_after_s: float = 600) -> T:
    """Call `fn` (one transaction) until the database answers: a finished job's outcome must not be
    lost to a database blip. Gives up (raises) after `give_up_after_s`."""
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
            pause = min(pause * 2, settings.heartbeat_s)


# ---- node 0: claim, reserve, launch, merge, store ----


@dataclass(frozen=True)
class Claim:
    job: ResolvedJob
    pool: str
    nodes: list[tuple[int, str]]
    """(node rank, worker id) of every node, node 0 (this worker) first."""
    endpoint: str | None


def _free_endpoint(address: str) -> str:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return f"{address}:{sock.getsockname()[1]}"


def _local_addr(settings: Settings, me: WorkerInfo) -> str | None:
    """The address torchrun gives the other nodes for this one: said outright on an emulated node
    (its namespace's only route out), left to torchrun's own look-up on a real host."""
    return me.address if settings.worker_netns else None


def claim_run(settings: Settings, run_id: str, me: WorkerInfo) -> Claim | str:
    """Move a queued run to running with all its hosts reserved; else say what to do instead:
    'skip' (not queued: the status guard), 'requeue' (hosts busy, nothing held) or 'failed'."""
    endpoint = _free_endpoint(me.address)
    with session_scope(settings.sqlalchemy_url) as session:
        run = store.get_run_for_update(session, run_id)
        if run is None or run.status != "queued":
            log.info("run %s is %s; not running it", run_id, run.status if run else "missing")
            return "skip"
        try:
            job = frozen_job(run, settings)
        except (SpecError, ValidationError) as exc:
            store.set_status(session, run, "failed", error=f"invalid spec: {exc}")
            return "failed"
        pool = run.pool or me.pool
        try:
            nodes = fleet.reserve(session=session, run=run, job=job, me=me, settings=settings, endpoint=endpoint if job.nodes > 1 else None)
        except NotReserved as exc:
            session.rollback()  # nothing taken: all-or-nothing
            if not exc.impossible:
                log.info("run %s waits for hosts: %s", run_id, exc)
                return "requeue-now" if exc.mine_taken else "requeue"
            run = store.get_run_for_update(session, run_id)
            if run is None or run.status != "queued":
                return "skip"
            store.set_status(session, run, "failed", error=f"cannot be placed: {exc}, and fewer than {job.nodes} hosts of it are alive")
            return "failed"
        store.set_status(session, run, "running")
        return Claim(job, pool, [(n.node_rank, n.worker_id) for n in nodes], endpoint if job.nodes > 1 else None)


def _claim(settings: Settings, run_id: str, me: WorkerInfo | None = None) -> ResolvedJob | None:
    """The claim's job, or None when the run is not started (tests read the claim alone)."""
    claim = claim_run(settings, run_id, me or worker_fleet.current(settings))
    return claim.job if isinstance(claim, Claim) else None


@dataclass
class Part:
    """How this host's part of a run ended."""

    outcome: LaunchOutcome
    records: list[RankRecord] | None
    traces: dict[int, bytes]
    reason: str | None
    """None if it succeeded; else why (with the log tail)."""
    stopped: bool
    """Stopped by its watcher (a cancel, another node's fault) rather than failing by itself."""


def _run_part(settings: Settings, job: ResolvedJob, run_id: str, node: NodeLaunch | None, watcher: Watcher) -> Part:
    """Launch this host's ranks through the host engine, watched, and read back what they wrote."""
    engine = HostTorchrun(settings, watcher=watcher, node=node, me=watcher.me)
    try:
        handle = engine.launch(job, run_id)
    except Exception as exc:  # the launcher itself broke: the run must still end
        log.exception("run %s could not be launched", run_id)
        return Part(LaunchOutcome(None, "launch failed", ""), None, {}, f"could not launch the job: {exc}", stopped=False)
    outcome = handle.outcome or LaunchOutcome(None, "launch failed", "")
    state = engine.state(handle)
    if state.status != "succeeded":
        return Part(outcome, None, {}, state.reason or "stopped", stopped=engine.stopped(handle))
    try:
        collected = engine.collect(handle, job)
    except ValueError as exc:
        return Part(outcome, None, {}, str(exc), stopped=False)
    return Part(outcome, collected.records, collected.traces, None, stopped=False)


def _wait_for_nodes(settings: Settings, run_id: str, watcher: Watcher, nodes: int) -> tuple[list[list[RankRecord]], str | None]:
    """After node 0's ranks ended well: every other node's records, or why they cannot all come."""
    deadline = time.monotonic() + settings.reservation_timeout_s
    while True:
        try:
            with session_scope(settings.sqlalchemy_url) as session:
                fleet.heartbeat(session=session, info=watcher.me)
                state = fleet.gang_state(session=session, run_id=run_id, settings=settings)
        except Exception as exc:
            log.warning("waiting for the nodes of %s: %s", run_id, exc)
            state = None
        if state is not None:
            others = [n for n in state.nodes if n.node_rank != 0]
            if all(n.status == "succeeded" for n in others) and len(others) == nodes - 1:
                return [[RankRecord.model_validate(r) for r in state.records.get(n.node_rank) or []] for n in others], None
            if (reason := watcher.reason(state)) is not None:
                return [], reason
        if time.monotonic() > deadline:
            return [], f"not every node reported within {settings.reservation_timeout_s:.0f} s of node 0's end"
        time.sleep(0.5)


def _gang_failure(settings: Settings, run_id: str, own: str, settle_s: float = 10) -> str:
    """Node 0 failed by itself: a peer's death often surfaces here as a broken connection, so wait
    briefly for the other nodes to end and name every node that failed, the others first."""
    try:
        with session_scope(settings.sqlalchemy_url) as session:
            fleet.fail_node(session=session, run_id=run_id, node_rank=0, reason=own)
    except Exception as exc:
        log.warning("could not mark node 0 of %s failed: %s", run_id, exc)
    deadline = time.monotonic() + settle_s
    others: list[str] = []
    while time.monotonic() < deadline:
        try:
            with session_scope(settings.sqlalchemy_url) as session:
                state = fleet.gang_state(session=session, run_id=run_id, settings=settings)
        except Exception:
            state = None
        if state is not None:
            rest = [n for n in state.nodes if n.node_rank != 0]
            others = [f"node {n.node_rank} (host {n.host}) failed: {n.reason}" for n in rest if n.status == "failed"]
            if all(n.status not in ("reserved", "running") for n in rest):
                break
        time.sleep(0.5)
    return "\n\n".join([*others, own])


def _finish_run(
    settings: Settings,
    run_id: str,
    me: WorkerInfo,
    *,
    status: str,
    error: str | None,
    document: ResultDocument | None,
    traces: dict[int, bytes],
    flight: dict[str, Any] | None = None,
) -> str:
    """One transaction: the run's end (result, failure or cancel) and its hosts freed — unless the run
    is no longer this worker's (it was reconciled as lost meanwhile): then only node 0 is closed.
    `flight`: a failed run's flight-recorder dumps and their analysis, kept with it."""

    def write() -> str:
        with session_scope(settings.sqlalchemy_url) as session:
            run = store.get_run_for_update(session, run_id)
            if run is None:
                return "missing"
            if run.status == "running" and run.worker_id == me.id:
                if status == "cancelled":
                    store.set_status(session, run, "cancelled", error=error)
                elif document is not None:
                    attach_result(session, run=run, document=document, traces=traces, pool=run.pool)
                else:
                    store.set_status(session, run, "failed", error=error)
                    worker_store.delete_traces(session, run_id)  # other nodes' traces: nothing half-kept
                    if flight is not None:
                        store.set_flight_recorder(session, run_id, flight)
            else:
                log.warning("run %s ended elsewhere (%s) while this worker ran it; not overwriting", run_id, run.status)
            node_status = {"succeeded": "succeeded", "cancelled": "stopped"}.get(run.status, "failed")
            fleet.finish_node(session=session, run_id=run_id, node_rank=0, worker_id=me.id, status=node_status, reason=error, records=None)
            fleet.close_nodes(session=session, run_id=run_id)
            return run.status

    return with_db_retry(settings, f"storing the end of run {run_id}", write)


def _requeue(settings: Settings, run_id: str, pool: str, *, pause: bool) -> str:
    if pause:
        time.sleep(REQUEUE_PAUSE_S)
    try:
        enqueue_run(settings, run_id, pool=pool)
    except Exception as exc:
        log.exception("could not put run %s back on its queue", run_id)
        with session_scope(settings.sqlalchemy_url) as session:
            run = store.get_run_for_update(session, run_id)
            if run is not None and run.status == "queued":
                store.set_status(session, run, "failed", error=f"could not reach the job queue while waiting for hosts: {exc}")
        return "failed"
    return "requeued"


def _flight(settings: Settings, run_id: str, job: ResolvedJob) -> dict[str, Any] | None:
    """This host's ranks' flight-recorder dumps of a failed run, with their analysis (best effort:
    the run's failure is stored without them)."""
    try:
        return flight_recorder(RunDir(settings.runs_dir / run_id), job.world_size)
    except Exception:
        log.exception("could not read the flight-recorder dumps of run %s", run_id)
        return None


def execute_run(run_id: str, settings: Settings, worker: WorkerInfo | None = None) -> str:
    """Run a queued run end to end as its node 0; returns its final status. Never raises for a failed job."""
    me = worker or worker_fleet.current(settings)
    claim = claim_run(settings, run_id, me)
    if claim == "skip":
        return "skipped"
    if claim == "failed":
        return "failed"
    if isinstance(claim, str):
        with session_scope(settings.sqlalchemy_url) as session:
            run = store.get_run(session, run_id)
            pool = (run.pool if run else None) or me.pool
        return _requeue(settings, run_id, pool, pause=claim == "requeue")
    job = claim.job
    node = None
    if job.nodes > 1 and claim.endpoint is not None:
        join_s, local = int(settings.reservation_timeout_s), _local_addr(settings, me)
        node = NodeLaunch(job.nodes, 0, claim.endpoint, run_id, join_timeout_s=join_s, local_addr=local)
        for rank, worker_id in claim.nodes[1:]:
            try:
                send_node(settings, worker_id=worker_id, run_id=run_id, node_rank=rank)
            except Exception as exc:  # the reserved host cannot be told: the run cannot start
                log.exception("could not send node %d of run %s", rank, run_id)
                return _finish_run(
                    settings, run_id, me, status="failed", error=f"could not reach node {rank}'s worker: {exc}", document=None, traces={}
                )

    fetched = prefetch_reference(settings, job, me.device)
    watcher = Watcher(settings, run_id=run_id, node_rank=0, me=me)
    part = _run_part(settings, job, run_id, node, watcher)
    if part.reason is not None:
        if watcher.cancelled and part.stopped:
            tail = f"\n--- log tail ---\n{part.outcome.log_tail}" if part.outcome.log_tail else ""
            return _finish_run(settings, run_id, me, status="cancelled", error="cancelled while running" + tail, document=None, traces={})
        error = part.reason
        if node is not None and not part.stopped:
            error = _gang_failure(settings, run_id, f"node 0 (host {me.host}) failed: {part.reason}")
        flight = _flight(settings, run_id, job)
        return _finish_run(settings, run_id, me, status="failed", error=error, document=None, traces={}, flight=flight)

    per_node: list[list[RankRecord]] = [part.records or []]
    if job.nodes > 1:
        others, reason = _wait_for_nodes(settings, run_id, watcher, job.nodes)
        if reason is not None:
            return _finish_run(
                settings, run_id, me, status="cancelled" if reason == "cancelled" else "failed", error=reason, document=None, traces={}
            )
        per_node += others
    try:
        with session_scope(settings.sqlalchemy_url) as session:
            hosts = [n.host for n in worker_store.get_nodes(session, run_id)]
            profile = latest_profile(session=session, pool=claim.pool)  # the pool's calibration, for the step-time estimate
            topology = pool_topology(session=session, name=claim.pool)  # its inter-node link, for the collectives across
        catalogue = load_catalogue(settings.hardware_catalogue)
        document = build_result(
            job,
            merge_nodes(per_node, job.world_size),
            hosts=hosts,
            profile=profile,
            catalogue=catalogue,
            noise=part.outcome.noise,
            topology=topology,
            host_speed=part.outcome.host_speed,
        )
    except Exception as exc:
        log.exception("could not build the result of run %s", run_id)
        error = f"could not build the result document: {exc}\n--- log tail ---\n{part.outcome.log_tail}"
        return _finish_run(settings, run_id, me, status="failed", error=error, document=None, traces={})
    document = share_reference(settings, job, document, device=me.device, run_id=run_id, fetched=fetched)
    return _finish_run(settings, run_id, me, status="succeeded", error=None, document=document, traces=part.traces)


# ---- another host's part of a multi-node run ----


def execute_node(run_id: str, node_rank: int, settings: Settings, worker: WorkerInfo | None = None) -> str:
    """Run this worker's reserved part of a multi-node run and hand its records on; returns the node's status."""
    me = worker or worker_fleet.current(settings)
    with session_scope(settings.sqlalchemy_url) as session:
        claimed = fleet.claim_node(session=session, run_id=run_id, node_rank=node_rank, me=me)
        run = store.get_run(session, run_id)
        if claimed is None or run is None or run.job is None or claimed.endpoint is None:
            log.info("node %d of run %s is not reserved for this worker; not running it", node_rank, run_id)
            return "skipped"
        job = ResolvedJob.model_validate(run.job)
        join_s, local = int(settings.reservation_timeout_s), _local_addr(settings, me)
        node = NodeLaunch(job.nodes, node_rank, claimed.endpoint, run_id, join_timeout_s=join_s, local_addr=local)
    watcher = Watcher(settings, run_id=run_id, node_rank=node_rank, me=me)
    part = _run_part(settings, job, run_id, node, watcher)
    status = "succeeded" if part.reason is None else ("stopped" if part.stopped else "failed")
    records = [r.model_dump(mode="json") for r in part.records] if part.records is not None else None

    def write() -> None:
        with session_scope(settings.sqlalchemy_url) as session:
            fleet.finish_node(
                session=session, run_id=run_id, node_rank=node_rank, worker_id=me.id, status=status, reason=part.reason, records=records
            )
            if status == "succeeded":
                worker_store.add_traces(session, run_id, part.traces)

    with_db_retry(settings, f"storing node {node_rank} of run {run_id}", write)
    return status
