"""SQL for the planner's tables: hardware profiles and sweeps. Callers own the transaction."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from backend.models import HardwareProfileRow, Run, Sweep
from parallab.core.strategies.calibrate import Calibrate


def add_profile(session: Session, row: HardwareProfileRow) -> HardwareProfileRow:
    session.add(row)
    session.flush()
    return row


def latest_profile(session: Session, pool: str) -> HardwareProfileRow | None:
    """The newest profile measured on `pool`."""
    query = select(HardwareProfileRow).where(HardwareProfileRow.pool == pool).order_by(HardwareProfileRow.id.desc()).limit(1)
    return session.execute(query).scalar_one_or_none()


def pending_calibration(session: Session, pool: str) -> Run | None:
    """The oldest `calibrate` run of `pool` still queued or running (None: none is)."""
    query = (
        select(Run)
        .where(Run.pool == pool, Run.strategy == Calibrate.name, Run.status.in_(("queued", "running")))
        .order_by(Run.created_at, Run.id)
        .limit(1)
    )
    return session.execute(query).scalar_one_or_none()


def list_profiles(session: Session, limit: int = 50) -> list[HardwareProfileRow]:
    return list(session.execute(select(HardwareProfileRow).order_by(HardwareProfileRow.id.desc()).limit(limit)).scalars())


def add_sweep(session: Session, sweep: Sweep) -> Sweep:
    session.add(sweep)
    session.flush()
    return sweep


def get_sweep(session: Session, sweep_id: str) -> Sweep | None:
    return session.get(Sweep, sweep_id)


def get_sweep_for_update(session: Session, sweep_id: str) -> Sweep | None:
    return session.execute(select(Sweep).where(Sweep.id == sweep_id).with_for_update()).scalar_one_or_none()


def sweep_runs(session: Session, sweep_id: str) -> list[Run]:
    return list(session.execute(select(Run).where(Run.sweep_id == sweep_id).order_by(Run.created_at, Run.id)).scalars())


def set_sweep_of(session: Session, run_ids: Sequence[str], sweep_id: str) -> None:
    if run_ids:
        session.execute(update(Run).where(Run.id.in_(list(run_ids))).values(sweep_id=sweep_id))


def list_sweeps(session: Session, limit: int = 50) -> list[Sweep]:
    return list(session.execute(select(Sweep).order_by(Sweep.created_at.desc(), Sweep.id.desc()).limit(limit)).scalars())


def run_documents(session: Session, run_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The result documents of the finished runs among `run_ids` (sweeps are small: tens of runs)."""
    from backend.store.runs import get_documents

    return get_documents(session, run_ids)
