"""All SQL of the fleet: worker rows and their heartbeats, reservations, and the nodes of a run.

Updates run with `synchronize_session=False` (SYNC): they are conditions checked by the database,
never evaluated on rows already loaded (SQLite hands back naive datetimes).

Reservations are conditional updates (`... WHERE run_id IS NULL`), taken in id order inside the
caller's transaction: two coordinators competing for the same hosts never both get one, and
never wait on each other in a cycle. Callers own the transaction.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import delete, insert, select, update
from sqlalchemy.orm import Session

from backend.models import FINAL_NODE_STATUSES, Run, RunNode, RunTrace, Worker

SYNC = {"synchronize_session": False}

# ---- workers ----


def get_worker(session: Session, worker_id: str) -> Worker | None:
    return session.get(Worker, worker_id)


def upsert_worker(session: Session, fields: dict[str, Any], *, now: datetime) -> Worker:
    """Insert the worker, or refresh its description and heartbeat (a reservation it holds stays)."""
    worker = session.get(Worker, fields["id"])
    if worker is None:
        worker = Worker(**fields, started_at=now, heartbeat_at=now)
        session.add(worker)
    else:
        for key, value in fields.items():
            setattr(worker, key, value)
        worker.heartbeat_at = now
    session.flush()
    return worker


def touch_worker(session: Session, worker_id: str, *, now: datetime) -> bool:
    """Renew the heartbeat; False if the row is gone (forgotten: the caller registers again)."""
    result = session.execute(update(Worker).where(Worker.id == worker_id).values(heartbeat_at=now), execution_options=SYNC)
    return bool(result.rowcount)  # type: ignore[attr-defined]


def delete_worker(session: Session, worker_id: str) -> None:
    session.execute(delete(Worker).where(Worker.id == worker_id))


def list_workers(session: Session) -> list[Worker]:
    return list(session.execute(select(Worker).order_by(Worker.pool, Worker.host, Worker.started_at)).scalars())


def live_workers(session: Session, *, alive_after: datetime, pool: str | None = None) -> list[Worker]:
    query = select(Worker).where(Worker.heartbeat_at >= alive_after)
    if pool is not None:
        query = query.where(Worker.pool == pool)
    return list(session.execute(query.order_by(Worker.pool, Worker.host)).scalars())


def idle_workers(session: Session, *, pool: str, alive_after: datetime, exclude: str, min_devices: int) -> list[Worker]:
    """Live, unreserved workers of `pool` with room for `min_devices` ranks, freshest first."""
    query = (
        select(Worker)
        .where(
            Worker.pool == pool,
            Worker.run_id.is_(None),
            Worker.heartbeat_at >= alive_after,
            Worker.id != exclude,
            Worker.device_count >= min_devices,
        )
        .order_by(Worker.heartbeat_at.desc(), Worker.id)
    )
    return list(session.execute(query).scalars())


def forget_workers(session: Session, *, dead_before: datetime) -> int:
    """Delete the rows of workers silent since `dead_before` that hold nothing."""
    result = session.execute(delete(Worker).where(Worker.heartbeat_at < dead_before, Worker.run_id.is_(None)), execution_options=SYNC)
    return int(result.rowcount)  # type: ignore[attr-defined]


def forget_dead_twins(session: Session, *, machine: str, live_pids: Iterable[int], keep: str) -> list[str]:
    """Workers recorded on this machine whose process no longer exists: dead for sure, without
    waiting for their heartbeat to age (a worker restarted at once). Returns their ids."""
    alive = set(live_pids)
    rows = session.execute(select(Worker.id, Worker.pid).where(Worker.machine == machine, Worker.id != keep)).all()
    dead = [worker_id for worker_id, pid in rows if pid not in alive]
    if dead:
        session.execute(update(Worker).where(Worker.id.in_(dead)).values(heartbeat_at=datetime(1970, 1, 1)), execution_options=SYNC)
    return dead


# ---- reservations ----


def lock_workers(session: Session, worker_ids: Sequence[str]) -> None:
    """Row locks on those of these workers that exist, taken in id order. Every reservation locks
    its hosts through here before it writes any of them (its own heartbeat included), so two
    coordinators wanting each other's host wait in one order instead of in a cycle Postgres must
    break by aborting one of them. (SQLite has no row locks: it serialises the writers.)"""
    query = select(Worker.id).where(Worker.id.in_(sorted(worker_ids))).order_by(Worker.id).with_for_update()
    session.execute(query).all()


def take_worker(session: Session, worker_id: str, *, run_id: str, node_rank: int, now: datetime, alive_after: datetime) -> bool:
    """Point an idle, live worker at `run_id`; False if it is taken (or dead) — the caller rolls back."""
    result = session.execute(
        update(Worker)
        .where(Worker.id == worker_id, Worker.run_id.is_(None), Worker.heartbeat_at >= alive_after)
        .values(run_id=run_id, node_rank=node_rank, reserved_at=now),
        execution_options=SYNC,
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


def release_worker(session: Session, worker_id: str, *, run_id: str) -> None:
    """Free a worker, if it still holds `run_id` (never another run's reservation)."""
    session.execute(
        update(Worker).where(Worker.id == worker_id, Worker.run_id == run_id).values(run_id=None, node_rank=None, reserved_at=None)
    )


def release_workers_of(session: Session, run_id: str, *, worker_ids: Sequence[str]) -> None:
    if worker_ids:
        session.execute(
            update(Worker)
            .where(Worker.id.in_(list(worker_ids)), Worker.run_id == run_id)
            .values(run_id=None, node_rank=None, reserved_at=None),
            execution_options=SYNC,
        )


def workers_by_id(session: Session, worker_ids: Sequence[str]) -> dict[str, Worker]:
    if not worker_ids:
        return {}
    return {w.id: w for w in session.execute(select(Worker).where(Worker.id.in_(list(worker_ids)))).scalars()}


# ---- nodes of a run ----


def add_nodes(session: Session, nodes: Sequence[RunNode]) -> None:
    session.add_all(nodes)
    session.flush()


def get_nodes(session: Session, run_id: str) -> list[RunNode]:
    return list(session.execute(select(RunNode).where(RunNode.run_id == run_id).order_by(RunNode.node_rank)).scalars())


def get_node_for_update(session: Session, run_id: str, node_rank: int) -> RunNode | None:
    query = select(RunNode).where(RunNode.run_id == run_id, RunNode.node_rank == node_rank).with_for_update()
    return session.execute(query).scalar_one_or_none()


def set_node_pgid(session: Session, run_id: str, node_rank: int, pgid: int | None) -> None:
    session.execute(
        update(RunNode).where(RunNode.run_id == run_id, RunNode.node_rank == node_rank).values(pgid=pgid), execution_options=SYNC
    )


def open_nodes_on(session: Session, machine: str) -> list[tuple[RunNode, str, str | None]]:
    """Nodes on `machine` not yet known to be over (status not final, or a process group still
    recorded), with their run's status and the heartbeat-holder of the node: what the reaper checks."""
    query = (
        select(RunNode, Run.status)
        .join(Run, Run.id == RunNode.run_id)
        .where(RunNode.machine == machine)
        .where(RunNode.status.not_in(list(FINAL_NODE_STATUSES)) | RunNode.pgid.is_not(None))
    )
    return [(node, status, node.worker_id) for node, status in session.execute(query).all()]


def running_runs(session: Session) -> list[Run]:
    return list(session.execute(select(Run).where(Run.status == "running")).scalars())


# ---- traces handed on by the nodes of a multi-node run ----


def add_traces(session: Session, run_id: str, traces: dict[int, bytes]) -> None:
    """Another node's rank traces, stored when its part succeeded (node 0 stores its own with the result)."""
    if traces:
        session.execute(insert(RunTrace), [{"run_id": run_id, "rank": rank, "data": data} for rank, data in traces.items()])


def delete_traces(session: Session, run_id: str) -> None:
    """A failed run keeps no trace another node stored."""
    session.execute(delete(RunTrace).where(RunTrace.run_id == run_id))
