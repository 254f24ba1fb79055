"""A run page's "vary one thing": the same job with one dimension changed, submitted."""

from __future__ import annotations

from sqlalchemy.orm import Session

from backend.config import Settings
from backend.models import Run
from backend.services.recipes import vary
from backend.services.runs import get_run, submit_run
from parallab.core.spec import JobSpec


def vary_run(
    *, session: Session, settings: Settings, run_id: str, field: str, value: str, user_id: int | None = None, local: bool = False
) -> Run:
    """Submit `run_id`'s job with `field` set to `value` (the same job otherwise) as `user_id`; the new run."""
    run = get_run(session=session, run_id=run_id)
    spec = vary(run.spec, field, value)
    spec["name"] = f"{run.name or run.strategy} · {field}={value}"[:200]
    return submit_run(session=session, spec=JobSpec.model_validate(spec), settings=settings, source="form", user_id=user_id, local=local)
