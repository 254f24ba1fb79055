"""Submitting, reading and cancelling runs.

A spec is resolved once, here, at submission (`parallab.core.jobs.resolve_job`): the run row
keeps the frozen `ResolvedJob` in `job` — what the worker and the ranks run — and the resolved,
resubmittable spec in `spec`.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from backend.config import Settings
from backend.models import FINISHED_STATUSES, Run
from backend.queue import enqueue_run
from backend.services.hardware import check_precision
from backend.services.recipes import job_columns
from backend.store import runs as store
from parallab.core.jobs import Limits, ResolvedJob, resolve_job
from parallab.core.spec import JobSpec

log = logging.getLogger(__name__)


class RunNotFound(LookupError):
    pass


class RunStateError(ValueError):
    """The run is not in a state that allows what was asked."""


class QueueUnavailable(RuntimeError):
    """The job queue could not be reached: the run was stored, then marked failed, not left queued."""

    def __init__(self, run: Run):
        self.run = run
        super().__init__("the job queue is unreachable; the run was not queued")


def limits(settings: Settings) -> Limits:
    """What one job may ask of this deployment's workers."""
    return Limits(max_world_size=settings.max_world_size, max_steps=settings.max_steps)


def validate_spec(*, spec: JobSpec, settings: Settings) -> ResolvedJob:
    """Resolve and check a spec against this deployment's limits (raises SpecError)."""
    return resolve_job(spec, limits(settings))


def create_run(*, session: Session, spec: JobSpec, settings: Settings, source: str) -> Run:
    """Store a `queued` run for a valid spec, its resolved job frozen in the row (caller commits, then enqueues).

    The pool's device, when a calibration recorded it, must be able to train in the job's
    precision (`hardware.check_precision`, issue 14)."""
    job = validate_spec(spec=spec, settings=settings)
    check_precision(session=session, settings=settings, job=job)
    return store.add_run(
        session,
        Run(
            name=job.spec.name,
            status="queued",
            source=source,
            spec=job.spec.model_dump(mode="json"),
            job=job.model_dump(mode="json"),
            strategy=job.strategy,
            world_size=job.world_size,
            model=job.workload.model,
            **job_columns(job),
        ),
    )


def submit_run(*, session: Session, spec: JobSpec, settings: Settings, source: str) -> Run:
    """Commit a queued run, then enqueue it (Celery's rule: enqueue only what is committed).

    If the broker is unreachable the run is marked failed rather than left queued forever, and
    QueueUnavailable says so.
    """
    run = create_run(session=session, spec=spec, settings=settings, source=source)
    session.commit()
    try:
        enqueue_run(settings, run.id)
    except Exception as exc:  # any failure to publish: the run must not look queued
        log.exception("could not enqueue run %s", run.id)
        store.set_status(session, run, "failed", error=f"could not reach the job queue: {exc}")
        session.commit()
        raise QueueUnavailable(run) from exc
    return run


def get_run(*, session: Session, run_id: str) -> Run:
    run = store.get_run(session, run_id)
    if run is None:
        raise RunNotFound(run_id)
    return run


def list_runs(*, session: Session, limit: int, cursor: str | None, filters: dict[str, Any]) -> tuple[list[Run], str | None]:
    """A page of runs, newest first, and the cursor of the next page (None at the end)."""
    before = decode_cursor(cursor) if cursor else None
    rows = store.list_runs(session, limit=limit + 1, before=before, **filters)
    page, more = rows[:limit], len(rows) > limit
    return page, (encode_cursor(page[-1]) if more and page else None)


def encode_cursor(run: Run) -> str:
    return f"{run.created_at.isoformat()}|{run.id}"


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    try:
        created, run_id = cursor.rsplit("|", 1)
        return datetime.fromisoformat(created), run_id
    except ValueError:
        raise ValueError("cursor is not one this API returned") from None


def cancel_run(*, session: Session, run_id: str) -> Run:
    """A queued run is cancelled at once; a running one is flagged and its worker kills it (commits)."""
    run = store.get_run_for_update(session, run_id)
    if run is None:
        raise RunNotFound(run_id)
    if run.status in FINISHED_STATUSES:
        raise RunStateError(f"run is already {run.status}")
    if run.status == "queued":
        store.set_status(session, run, "cancelled", error="cancelled before it started")
    else:
        run.cancel_requested = True
    session.commit()
    return run
