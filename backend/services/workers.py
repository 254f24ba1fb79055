"""The fleet: workers register and heartbeat; jobs are placed on a pool, reserved, and reconciled.

Pools and gang scheduling. Each worker registers its host, pool and devices and
heartbeats; a job is placed on a pool that can run it (`place`, 422 otherwise); the worker that
takes a job reserves all of its hosts at once (`reserve`): every worker row is taken with a
conditional update in one transaction, in id order, or none is — all-or-nothing, and two
coordinators competing for the same hosts never wait on each other in a cycle. A worker that
cannot reserve holds nothing while it waits (the job goes back to its queue).

Leases. The worker that claims a run holds its lease through its heartbeat (one
liveness signal for both issues). A running run whose worker stopped heartbeating is lost:
`reconcile_lost_runs` fails it ("worker lost") — any worker or the API may do that — and a live
worker of the same machine kills its orphaned ranks (workers.fleet, by the recorded process group).

Why the database and not Redis: the lease, the reservation and the run's status must change
together, atomically, in one transaction (queued → running with its hosts taken; running →
finished with its hosts freed); Postgres gives that with row locks, and keeps it across a broker
restart. Redis stays a queue: losing it loses no state about who runs what.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy.orm import Session

from backend.config import Settings
from backend.models import FINAL_NODE_STATUSES, Run, RunNode, Worker, utcnow
from backend.queue import pool_queue
from backend.store import runs as run_store
from backend.store import workers as store
from parallab.core.jobs import ResolvedJob
from parallab.core.ledger import GangState, NodeState, WorkerInfo
from parallab.core.prediction import predict
from parallab.core.problems import SpecError, SpecProblem

GIB = 1024**3
FORGET_AFTER = timedelta(days=1)
"""A dead worker's row is kept this long for the /workers page, then forgotten."""


class NotReserved(RuntimeError):
    """The hosts a job needs could not all be taken now; nothing was taken."""

    def __init__(self, reason: str, *, mine_taken: bool = False, impossible: bool = False):
        super().__init__(reason)
        self.mine_taken = mine_taken
        """This worker is itself reserved by another job: it must serve that one first."""
        self.impossible = impossible
        """The pool has fewer live hosts than the job needs: waiting will not help."""


def utc(moment: datetime) -> datetime:
    """SQLite hands datetimes back naive; every stored time is UTC."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)


def alive_after(settings: Settings, now: datetime | None = None) -> datetime:
    """Workers that heartbeated since then are alive."""
    return (now or utcnow()) - timedelta(seconds=settings.worker.worker_ttl_s)


def is_alive(worker: Worker | None, settings: Settings, now: datetime | None = None) -> bool:
    return worker is not None and utc(worker.heartbeat_at) >= alive_after(settings, now)


# ---- registration and heartbeat ----


def register(*, session: Session, info: WorkerInfo) -> Worker:
    """Insert or refresh this worker's row (its heartbeat included)."""
    return store.upsert_worker(session, info.fields(), now=utcnow())


def heartbeat(*, session: Session, info: WorkerInfo) -> None:
    """Renew the heartbeat (and with it the lease of every run this worker holds); re-register if forgotten."""
    if not store.touch_worker(session, info.id, now=utcnow()):
        register(session=session, info=info)


def deregister(*, session: Session, worker_id: str) -> None:
    """A worker that stops cleanly leaves the fleet (a killed one just stops heartbeating)."""
    store.delete_worker(session, worker_id)


def forget_dead_twins(*, session: Session, info: WorkerInfo, live_pids: Sequence[int]) -> list[str]:
    """Workers of this machine whose process is gone are dead now, not after their heartbeat ages."""
    return store.forget_dead_twins(session, machine=info.machine, live_pids=live_pids, keep=info.id)


# ---- placement: which pool runs a job ----


def predicted_bytes_per_rank(job: ResolvedJob) -> int:
    """Model state plus activations per rank, as predicted before the run (0 when not predicted)."""
    prediction = predict(job)
    state = prediction.get("model_state_bytes_per_rank") or {}
    return int(sum(state.values())) + int(prediction.get("activation_bytes_per_rank") or 0)


@dataclass
class PoolCapacity:
    """What a pool's live workers offer one job."""

    name: str
    hosts: int = 0
    devices_per_host: int = 0
    memory_per_device_bytes: int | None = None
    host_names: set[str] = field(default_factory=set)

    def problems(self, job: ResolvedJob, per_rank_bytes: int) -> list[SpecProblem]:
        """Why this pool cannot run `job` (empty: it can), each naming the pool and the limit."""
        out = []
        if self.hosts == 0:
            out.append(SpecProblem(("placement", "pool"), f"pool {self.name!r} has no live worker"))
            return out
        if job.nodes > self.hosts:
            out.append(
                SpecProblem(
                    ("placement", "nodes"), f"pool {self.name!r} has {self.hosts} live host(s); this job asks for {job.nodes} nodes"
                )
            )
        if job.ranks_per_node > self.devices_per_host:
            out.append(
                SpecProblem(
                    ("strategy", "world_size"),
                    f"pool {self.name!r} has {self.devices_per_host} device(s) per host; "
                    f"this job puts {job.ranks_per_node} rank(s) on each of its {job.nodes} node(s)",
                )
            )
        if self.memory_per_device_bytes and per_rank_bytes > self.memory_per_device_bytes:
            out.append(
                SpecProblem(
                    ("workload", "model"),
                    f"predicted {per_rank_bytes / GIB:.2f} GiB per rank is more than pool {self.name!r}'s "
                    f"{self.memory_per_device_bytes / GIB:.2f} GiB per device",
                )
            )
        return out


def pool_capacities(session: Session, settings: Settings) -> dict[str, PoolCapacity]:
    """Each pool with at least one registered worker, and what its live workers offer."""
    now = utcnow()
    pools: dict[str, PoolCapacity] = {}
    for worker in store.list_workers(session):
        pool = pools.setdefault(worker.pool, PoolCapacity(worker.pool))
        if not is_alive(worker, settings, now):
            continue
        pool.host_names.add(worker.host)
        pool.hosts = len(pool.host_names)
        pool.devices_per_host = max(pool.devices_per_host, worker.device_count)
        if worker.memory_per_device_bytes:
            current = pool.memory_per_device_bytes
            pool.memory_per_device_bytes = min(current, worker.memory_per_device_bytes) if current else worker.memory_per_device_bytes
    return pools


def place(*, session: Session, job: ResolvedJob, settings: Settings) -> str:
    """The pool `job` runs on: the one it names, else the default, else the first live pool that can
    run it. SpecError (a 422 naming the pool and the limit) if none can. Before any worker has ever
    registered (a fresh deployment) the job waits on its named or default pool's queue."""
    pools = pool_capacities(session, settings)
    fallback = job.pool or settings.worker.default_pool or "cpu"
    if not pools:
        return fallback
    per_rank = predicted_bytes_per_rank(job)
    if job.pool or settings.worker.default_pool:
        pool = pools.get(fallback, PoolCapacity(fallback))
        problems = pool.problems(job, per_rank)
        if problems and fallback not in pools:
            known = ", ".join(sorted(pools))
            problems = [SpecProblem(("placement", "pool"), f"no worker has registered pool {fallback!r} (pools: {known})")]
        if problems:
            raise SpecError(problems)
        return fallback
    problems = []
    for name in sorted(pools):
        found = pools[name].problems(job, per_rank)
        if not found:
            return name
        problems += found
    raise SpecError(problems)


# ---- reservation: all of a job's hosts at once, or none ----


def reserve(*, session: Session, run: Run, job: ResolvedJob, me: WorkerInfo, settings: Settings, endpoint: str | None) -> list[RunNode]:
    """Take this worker and `job.nodes - 1` other idle live hosts of its pool for `run`, and record
    the run's nodes (node 0 is this worker). Raises NotReserved with nothing taken — the caller
    rolls the transaction back."""
    now = utcnow()
    cutoff = alive_after(settings, now)
    picked: list[Worker] = []
    if job.nodes > 1:
        hosts = {me.host}
        for worker in store.idle_workers(session, pool=me.pool, alive_after=cutoff, exclude=me.id, min_devices=job.ranks_per_node):
            if worker.host not in hosts and len(picked) < job.nodes - 1:
                picked.append(worker)
                hosts.add(worker.host)
        if len(picked) < job.nodes - 1:
            live_hosts = {w.host for w in store.live_workers(session, alive_after=cutoff, pool=me.pool)} | {me.host}
            raise NotReserved(
                f"{len(picked) + 1} of the {job.nodes} hosts this job needs in pool {me.pool!r} are free",
                impossible=len(live_hosts) < job.nodes,
            )
    rank_of = {me.id: 0} | {worker.id: i + 1 for i, worker in enumerate(picked)}
    # Lock every host in one order before writing any (this worker's heartbeat included): a
    # coordinator that refreshed its own row first held it while waiting for another's, which that
    # one's coordinator held while waiting for this — a cycle Postgres broke by aborting one task.
    store.lock_workers(session, list(rank_of))
    register(session=session, info=me)
    for worker_id in sorted(rank_of):
        if not store.take_worker(session, worker_id, run_id=run.id, node_rank=rank_of[worker_id], now=now, alive_after=cutoff):
            raise NotReserved(f"host of worker {worker_id} was taken meanwhile", mine_taken=worker_id == me.id)
    nodes = [RunNode(run_id=run.id, node_rank=0, worker_id=me.id, host=me.host, machine=me.machine, endpoint=endpoint, status="running")]
    nodes[0].started_at = now
    nodes += [
        RunNode(run_id=run.id, node_rank=i + 1, worker_id=w.id, host=w.host, machine=w.machine, endpoint=endpoint, status="reserved")
        for i, w in enumerate(picked)
    ]
    for node in nodes:
        node.reserved_at = now
    store.add_nodes(session, nodes)
    run.worker_id, run.host = me.id, me.host
    return nodes


def claim_node(*, session: Session, run_id: str, node_rank: int, me: WorkerInfo) -> RunNode | None:
    """Start this worker's reserved part of a run; None if it is not (or no longer) reserved for it
    — the status guard of a node, so a redelivered message never starts a part twice."""
    node = store.get_node_for_update(session, run_id, node_rank)
    run = run_store.get_run(session, run_id)
    if node is None or run is None or node.worker_id != me.id or node.status != "reserved":
        return None
    if run.status != "running" or run.cancel_requested:
        node.status, node.finished_at = "released", utcnow()
        store.release_worker(session, me.id, run_id=run_id)
        return None
    node.status, node.started_at = "running", utcnow()
    store.touch_worker(session, me.id, now=utcnow())
    return node


def finish_node(
    *, session: Session, run_id: str, node_rank: int, worker_id: str, status: str, reason: str | None, records: list[dict[str, Any]] | None
) -> None:
    """Record how this worker's part ended (its ranks are gone), hand on its records, free the worker."""
    node = store.get_node_for_update(session, run_id, node_rank)
    if node is not None and node.worker_id == worker_id:
        if node.status not in FINAL_NODE_STATUSES:
            node.status, node.reason, node.records = status, reason, records
            node.finished_at = utcnow()
        node.pgid = None
    store.release_worker(session, worker_id, run_id=run_id)


def fail_node(*, session: Session, run_id: str, node_rank: int, reason: str) -> None:
    """Say at once that this node failed (the other nodes stop on it); the worker stays reserved
    until it has finished the run."""
    node = store.get_node_for_update(session, run_id, node_rank)
    if node is not None and node.status not in FINAL_NODE_STATUSES:
        node.status, node.reason, node.finished_at = "failed", reason, utcnow()


def close_nodes(*, session: Session, run_id: str) -> None:
    """The run is over: parts never started are released with their workers; node 0's worker is freed.
    Parts still running are left to their own workers, which stop them and free themselves."""
    for node in store.get_nodes(session, run_id):
        if node.status == "reserved":
            node.status, node.finished_at = "released", utcnow()
            store.release_worker(session, node.worker_id, run_id=run_id)
        elif node.node_rank == 0:
            if node.status not in FINAL_NODE_STATUSES:
                node.status, node.finished_at = "stopped", utcnow()
            node.pgid = None
            store.release_worker(session, node.worker_id, run_id=run_id)


def gang_state(*, session: Session, run_id: str, settings: Settings) -> GangState | None:
    run = run_store.get_run(session, run_id)
    if run is None:
        return None
    nodes = store.get_nodes(session, run_id)
    workers = store.workers_by_id(session, [n.worker_id for n in nodes])
    now = utcnow()
    return GangState(
        status=run.status,
        cancel_requested=run.cancel_requested,
        nodes=[
            NodeState(n.node_rank, n.host, n.status, n.reason, is_alive(workers.get(n.worker_id), settings, now), utc(n.reserved_at))
            for n in nodes
        ],
        records={n.node_rank: n.records for n in nodes},
    )


# ---- leases ----


def lease_lapsed(*, session: Session, run: Run, settings: Settings) -> bool:
    """A running run whose worker stopped heartbeating (or left) has lost its lease."""
    if run.status != "running" or run.worker_id is None:
        return False
    return not is_alive(store.get_worker(session, run.worker_id), settings)


def lost_reason(session: Session, run: Run) -> str:
    worker = store.get_worker(session, run.worker_id) if run.worker_id else None
    since = f" since {utc(worker.heartbeat_at):%Y-%m-%d %H:%M:%S} UTC" if worker is not None and worker.heartbeat_at.year > 1970 else ""
    return (
        f"worker lost: the worker on host {run.host or '?'} stopped heartbeating{since}; "
        "its ranks died with it (or are killed by the next worker on that host)"
    )


def mark_lost(*, session: Session, run: Run, settings: Settings, status: str = "failed", error: str | None = None) -> None:
    """End a run whose lease lapsed: nodes of dead workers are lost (their process groups stay
    recorded for the reaper), parts never started are released; a part whose worker still lives
    sees the run end and stops itself."""
    now = utcnow()
    run_store.set_status(session, run, status, error=error or lost_reason(session, run))
    nodes = store.get_nodes(session, run.id)
    workers = store.workers_by_id(session, [n.worker_id for n in nodes])
    for node in nodes:
        if node.status == "reserved":
            node.status, node.finished_at = "released", now
            store.release_worker(session, node.worker_id, run_id=run.id)
        elif node.status not in FINAL_NODE_STATUSES and not is_alive(workers.get(node.worker_id), settings, now):
            node.status, node.finished_at = "lost", now
            store.release_worker(session, node.worker_id, run_id=run.id)


def reconcile_lost_runs(*, session: Session, settings: Settings) -> list[str]:
    """Fail every running run whose lease lapsed ("worker lost"; "cancelled" if a cancel was asked
    for); forget long-dead workers. Any
    worker or the API may call this: each run is locked and re-checked before it is changed."""
    lost = []
    for candidate in store.running_runs(session):
        run = run_store.get_run_for_update(session, candidate.id)
        if run is not None and lease_lapsed(session=session, run=run, settings=settings):
            if run.cancel_requested:  # cancelled while its worker was dying: the cancel stands
                mark_lost(session=session, run=run, settings=settings, status="cancelled", error=f"cancelled; {lost_reason(session, run)}")
            else:
                mark_lost(session=session, run=run, settings=settings)
            lost.append(run.id)
    store.forget_workers(session, dead_before=utcnow() - FORGET_AFTER)
    return lost


# ---- the fleet as the API and the page show it ----


@dataclass(frozen=True)
class WorkerView:
    id: str
    host: str
    pool: str
    device: str
    device_name: str | None
    devices: int
    memory_per_device_bytes: int | None
    interconnect: str
    alive: bool
    run_id: str | None
    node_rank: int | None
    heartbeat_at: datetime
    started_at: datetime


@dataclass(frozen=True)
class PoolView:
    name: str
    queue: str
    queue_length: int | None
    """None when the broker could not be asked."""
    hosts: int
    alive: int
    busy: int
    devices_per_host: int
    memory_per_device_bytes: int | None
    workers: list[WorkerView]


def fleet(*, session: Session, settings: Settings, queue_lengths: Callable[[list[str]], dict[str, int | None]]) -> list[PoolView]:
    """Every pool: its hosts, which are alive, what each runs now, and its queue length."""
    now = utcnow()
    by_pool: dict[str, list[WorkerView]] = {}
    for w in store.list_workers(session):
        by_pool.setdefault(w.pool, []).append(
            WorkerView(
                id=w.id,
                host=w.host,
                pool=w.pool,
                device=w.device,
                device_name=w.device_name,
                devices=w.device_count,
                memory_per_device_bytes=w.memory_per_device_bytes,
                interconnect=w.interconnect,
                alive=is_alive(w, settings, now),
                run_id=w.run_id,
                node_rank=w.node_rank,
                heartbeat_at=utc(w.heartbeat_at),
                started_at=utc(w.started_at),
            )
        )
    lengths = queue_lengths(sorted(by_pool))
    capacities = pool_capacities(session, settings)  # what the form offers and the planner plans on: one count
    out = []
    for name in sorted(by_pool):
        views = by_pool[name]
        alive = [w for w in views if w.alive]
        capacity = capacities.get(name, PoolCapacity(name))
        out.append(
            PoolView(
                name=name,
                queue=pool_queue(settings, name),
                queue_length=lengths.get(name),
                hosts=len({w.host for w in views}),
                alive=len(alive),
                busy=sum(1 for w in alive if w.run_id),
                devices_per_host=capacity.devices_per_host,
                memory_per_device_bytes=capacity.memory_per_device_bytes,
                workers=views,
            )
        )
    return out
