"""A worker's place in the fleet: who it is, its heartbeat, and the reaper of orphaned ranks.

At start-up a worker reads its hardware without torch (`workers.topology`) and registers
host, pool, devices, memory per device and interconnect; a heartbeat thread keeps the row alive
(the Celery task blocks the main thread of the solo pool, so it cannot be the one beating).

The heartbeat is the lease of every run the worker holds. At start-up and every half
TTL the worker reconciles: it fails runs whose lease lapsed ("worker lost"), and it kills the
ranks left behind on this machine by a worker that died — found by the process group recorded on
their node and by the run directory on their command line, and only for runs of this database
that no live worker watches. A job outside the database (`parallab bench`, a test) is never touched.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import uuid
from pathlib import Path

import psutil

from backend.config import Settings
from backend.db import session_scope
from backend.models import FINAL_NODE_STATUSES, Run
from backend.services import pools
from backend.services import workers as fleet
from backend.store import workers as store
from parallab.core.ledger import WorkerInfo
from workers import topology
from workers.engines.host_torchrun import HostTorchrun

log = logging.getLogger(__name__)

_current: WorkerInfo | None = None


def machine_id() -> str:
    """This kernel: the hostname and the boot id (a process group id means nothing after a reboot)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")[:12]
    except OSError:
        boot = "noboot"
    return f"{socket.gethostname()}:{boot}"[:200]


def _address(host: str) -> str:
    try:
        return socket.gethostbyname(host)
    except OSError:
        return "127.0.0.1"


def describe(settings: Settings, *, pool: str | None = None) -> WorkerInfo:
    """This worker as it registers: a new id each start, its host and pool, its devices."""
    gpus = topology.gpus()
    host = settings.worker.worker_host or socket.gethostname()
    if gpus is not None:
        count = settings.worker.worker_devices or len(gpus.names)
        device, name, memory = "cuda", gpus.names[0], min(gpus.memory_bytes) or None
    else:
        count = settings.worker.worker_devices or settings.limits.max_world_size
        device, name, memory = "cpu", topology.cpu_name(), psutil.virtual_memory().total // count
    return WorkerInfo(
        id=uuid.uuid4().hex,
        host=host[:200],
        machine=machine_id(),
        address=settings.worker.worker_address or _address(host),
        pid=os.getpid(),
        pool=pool or settings.worker.pool or topology.pool_name(gpus.names if gpus else None),
        device=device,
        device_name=name,
        device_count=count,
        memory_per_device_bytes=memory,
        interconnect=topology.interconnect(),
    )


def set_current(info: WorkerInfo) -> None:
    """The identity of this process's worker (set by `parallab worker` before Celery starts)."""
    global _current
    _current = info


def current(settings: Settings) -> WorkerInfo:
    """This process's worker; a process that runs a job without `parallab worker` (a test, a bare
    `celery worker`) registers itself on first use — the job's watcher keeps it heartbeating."""
    global _current
    if _current is None:
        _current = describe(settings)
        with session_scope(settings.sqlalchemy_url) as session:
            fleet.register(session=session, info=_current)
    return _current


# ---- the reaper: ranks whose worker died ----


def _rank_groups(settings: Settings) -> dict[str, set[int]]:
    """Process groups of parallab ranks (and their torchrun) on this machine, by run id: what the
    host engine still holds after a restart."""
    return {run_id: job.pgids for run_id, job in HostTorchrun(settings).reconcile().items()}


def _kill_groups(pgids: set[int], wait_s: float = 10) -> None:
    members = [p for p in psutil.process_iter() if _pgid(p) in pgids]
    for pgid in pgids:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            continue
    psutil.wait_procs(members, timeout=wait_s)


def _pgid(proc: psutil.Process) -> int | None:
    try:
        return os.getpgid(proc.pid)
    except (ProcessLookupError, psutil.Error):
        return None


def reap_orphans(settings: Settings, me: WorkerInfo) -> list[str]:
    """Kill the ranks on this machine of runs that no live worker watches; returns their run ids."""
    found = _rank_groups(settings)
    with session_scope(settings.sqlalchemy_url) as session:
        nodes = store.open_nodes_on(session, me.machine)
        holders = store.workers_by_id(session, [worker_id for _, _, worker_id in nodes if worker_id])
        watched = {
            node.run_id
            for node, run_status, worker_id in nodes
            if run_status == "running" and node.status in ("reserved", "running") and fleet.is_alive(holders.get(worker_id or ""), settings)
        }
        recorded: dict[str, set[int]] = {}
        for node, _, _ in nodes:
            if node.pgid is not None:
                recorded.setdefault(node.run_id, set()).add(node.pgid)
        victims: dict[str, set[int]] = {}
        for run_id in (set(found) | set(recorded)) - watched:
            run = session.get(Run, run_id)
            # a run on a Slurm pool is its scheduler's (and its agent's), even when its ranks share this machine
            if run is not None and pools.uses_queue(session=session, pool=run.pool):
                live = found.get(run_id, set())
                victims[run_id] = live | (recorded.get(run_id, set()) & _groups_of(settings, run_id))
    for run_id, pgids in victims.items():
        if pgids:
            log.warning("killing the orphaned ranks of run %s (process groups %s)", run_id, sorted(pgids))
            _kill_groups(pgids)
    if victims:
        with session_scope(settings.sqlalchemy_url) as session:
            for node, _, _ in store.open_nodes_on(session, me.machine):
                if node.run_id in victims:
                    node.pgid = None
                    if node.status not in FINAL_NODE_STATUSES:
                        node.status = "lost"
    return sorted(victims)


def _groups_of(settings: Settings, run_id: str) -> set[int]:
    return _rank_groups(settings).get(run_id, set())


def reconcile(settings: Settings, me: WorkerInfo) -> None:
    """Fail runs whose lease lapsed, then kill this machine's orphaned ranks (never raises: a
    database blip only delays it to the next round)."""
    try:
        with session_scope(settings.sqlalchemy_url) as session:
            fleet.forget_dead_twins(session=session, info=me, live_pids=psutil.pids())
        with session_scope(settings.sqlalchemy_url) as session:
            lost = fleet.reconcile_lost_runs(session=session, settings=settings)
        if lost:
            log.warning("runs whose worker was lost: %s", ", ".join(lost))
        reap_orphans(settings, me)
    except Exception:
        log.exception("reconcile failed; trying again at the next round")


# ---- the heartbeat ----


class Heartbeat(threading.Thread):
    """Renews this worker's row every `heartbeat_s` and reconciles every half TTL."""

    def __init__(self, settings: Settings, me: WorkerInfo):
        super().__init__(name="parallab-heartbeat", daemon=True)
        self.settings, self.me = settings, me
        self._stop_event = threading.Event()
        self.every = max(1, int(settings.worker.worker_ttl_s / settings.worker.heartbeat_s / 2))

    def beat(self) -> bool:
        try:
            with session_scope(self.settings.sqlalchemy_url) as session:
                fleet.heartbeat(session=session, info=self.me)
            return True
        except Exception as exc:  # the database is down: keep trying, the job goes on
            log.warning("heartbeat failed: %s", exc)
            return False

    def run(self) -> None:
        beats = 0
        while not self._stop_event.wait(self.settings.worker.heartbeat_s):
            if self.beat():
                beats += 1
                if beats % self.every == 0:
                    reconcile(self.settings, self.me)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=self.settings.worker.heartbeat_s + 5)
