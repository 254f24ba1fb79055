"""SQL behind `/metrics`: counts over the runs table, read at scrape time (one query each)."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Float, case, cast, func, select
from sqlalchemy.orm import Session

from backend.models import Run


def runs_by_status(session: Session) -> dict[str, int]:
    return {status: count for status, count in session.execute(select(Run.status, func.count()).group_by(Run.status)).all()}


def job_durations(session: Session, buckets: Sequence[float]) -> dict[str, tuple[list[int], float, int]]:
    """Per final status of worker runs (CI uploads have no duration): the cumulative count of runs
    that took ≤ each bucket's seconds, the sum of seconds and the count — one aggregate query."""
    if session.get_bind().dialect.name == "sqlite":
        seconds = (func.julianday(Run.finished_at) - func.julianday(Run.started_at)) * 86400.0
    else:
        seconds = cast(func.extract("epoch", Run.finished_at - Run.started_at), Float)
    columns = [func.sum(case((seconds <= bound, 1), else_=0)) for bound in buckets]
    query = (
        select(Run.status, func.count(), func.coalesce(func.sum(seconds), 0.0), *columns)
        .where(Run.started_at.is_not(None), Run.finished_at.is_not(None), Run.source != "ci")
        .group_by(Run.status)
    )
    return {
        status: ([int(c or 0) for c in cumulative], float(total), int(count))
        for status, count, total, *cumulative in session.execute(query).all()
    }
