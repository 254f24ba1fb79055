"""Submitting, reading and cancelling runs."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from backend.config import Settings
from backend.models import FINISHED_STATUSES, Run
from backend.schemas.spec import JobSpec
from backend.services.validation import ResolvedJob, resolve_job
from backend.store import runs as store


class RunNotFound(LookupError):
    pass


class RunStateError(ValueError):
    """The run is not in a state that allows what was asked."""


def validate_spec(*, spec: JobSpec, settings: Settings) -> ResolvedJob:
    """Resolve and check a spec against this deployment's limits (raises SpecError)."""
    return resolve_job(spec, max_world_size=settings.max_world_size, max_steps=settings.max_steps)


def create_run(*, session: Session, spec: JobSpec, settings: Settings, source: str) -> Run:
    """Store a `queued` run for a valid spec (caller commits, then enqueues)."""
    job = validate_spec(spec=spec, settings=settings)
    return store.add_run(
        session,
        Run(
            name=spec.name,
            status="queued",
            source=source,
            spec=job.to_spec_dict(),
            strategy=job.strategy,
            world_size=job.world_size,
            model=spec.workload.model,
        ),
    )


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
    """A queued run is cancelled at once; a running one is flagged and its worker kills it."""
    run = store.get_run_for_update(session, run_id)
    if run is None:
        raise RunNotFound(run_id)
    if run.status in FINISHED_STATUSES:
        raise RunStateError(f"run is already {run.status}")
    if run.status == "queued":
        store.set_status(session, run, "cancelled", error="cancelled before it started")
    else:
        run.cancel_requested = True
    return run
