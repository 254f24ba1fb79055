"""All SQL of declared pools and of the runs an outside scheduler holds. Callers own the transaction."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from backend.models import EngineJob, Pool, Run, utcnow


def get_pool(session: Session, name: str) -> Pool | None:
    return session.get(Pool, name)


def put_pool(session: Session, *, name: str, kind: str, settings: dict[str, Any]) -> Pool:
    """Declare the pool, or replace its settings (a job already submitted keeps what it was submitted with)."""
    pool = session.get(Pool, name)
    if pool is None:
        pool = Pool(name=name, kind=kind, settings=settings, created_at=utcnow())
        session.add(pool)
    else:
        pool.kind, pool.settings = kind, settings
    session.flush()
    return pool


def list_pools(session: Session) -> list[Pool]:
    return list(session.execute(select(Pool).order_by(Pool.name)).scalars())


def next_unsubmitted(session: Session, pool: str) -> Run | None:
    """The oldest queued run of `pool` not yet submitted, locked (SKIP LOCKED on Postgres: two
    agents of one pool never submit the same run)."""
    query = (
        select(Run)
        .outerjoin(EngineJob, EngineJob.run_id == Run.id)
        .where(Run.pool == pool, Run.status == "queued", EngineJob.run_id.is_(None))
        .order_by(Run.created_at, Run.id)
        .limit(1)
        .with_for_update(skip_locked=True, of=Run)
    )
    return session.execute(query).scalar_one_or_none()


def get_engine_job(session: Session, run_id: str) -> EngineJob | None:
    return session.get(EngineJob, run_id)


def get_engine_job_for_update(session: Session, run_id: str) -> EngineJob | None:
    return session.execute(select(EngineJob).where(EngineJob.run_id == run_id).with_for_update()).scalar_one_or_none()


def add_engine_job(session: Session, job: EngineJob) -> EngineJob:
    session.add(job)
    session.flush()
    return job


def open_engine_jobs(session: Session, pool: str) -> list[EngineJob]:
    """The pool's submitted jobs the agent still watches, oldest first."""
    query = select(EngineJob).where(EngineJob.pool == pool, EngineJob.finished.is_(False)).order_by(EngineJob.submitted_at)
    return list(session.execute(query).scalars())
