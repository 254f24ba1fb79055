"""All SQL for CI series and their verdicts. Callers own the transaction."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import func, insert, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from backend.models import Run, RunResult, Series, SeriesAccept, SeriesCounters, SeriesVerdict


def get_series(session: Session, series_id: str) -> Series | None:
    return session.get(Series, series_id)


def add_series(session: Session, series: Series) -> Series:
    """Insert a new series, or take the one a concurrent upload inserted first (the insert waits
    for it on the primary key, then does nothing), and return the stored row.

    One Core statement on the session's connection: no flush of what else is pending (an
    upload's own run stays unwritten until its one flush), no savepoint whose rollback would
    take that run's changes with it."""
    conn = session.connection()
    values = {c.key: getattr(series, c.key) for c in Series.__table__.columns if getattr(series, c.key) is not None}
    statement = (postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert)(Series)
    conn.execute(statement.values(values).on_conflict_do_nothing(index_elements=["id"]))
    query = select(Series).where(Series.id == series.id).execution_options(populate_existing=True)
    return session.execute(query).scalar_one()


def family_series(session: Session, family: str, branch: str) -> Series | None:
    return session.execute(select(Series).where(Series.family == family, Series.branch == branch)).scalar_one_or_none()


def family_owner(session: Session, family: str) -> Series | None:
    """The family's earliest series (its owner is the family's), or None for a family not started."""
    query = select(Series).where(Series.family == family).order_by(Series.created_at, Series.id).limit(1)
    return session.execute(query).scalar_one_or_none()


def series_of_family(session: Session, family: str) -> list[Series]:
    return list(session.execute(select(Series).where(Series.family == family).order_by(Series.branch)).scalars())


def list_series(session: Session, *, limit: int) -> list[dict[str, Any]]:
    """Every series, latest result first, with how many results and open alerts it has."""
    results = (
        select(SeriesVerdict.series_id, func.count(func.distinct(SeriesVerdict.run_id)).label("results"))
        .group_by(SeriesVerdict.series_id)
        .subquery()
    )
    alerts = (
        select(SeriesVerdict.series_id, func.count().label("open_alerts"))
        .where(SeriesVerdict.verdict == "regressed", SeriesVerdict.dismissed.is_(False))
        .group_by(SeriesVerdict.series_id)
        .subquery()
    )
    query = (
        select(Series, func.coalesce(results.c.results, 0), func.coalesce(alerts.c.open_alerts, 0))
        .outerjoin(results, results.c.series_id == Series.id)
        .outerjoin(alerts, alerts.c.series_id == Series.id)
        .order_by(Series.updated_at.desc(), Series.id)
        .limit(limit)
    )
    return [{"series": s, "results": n, "open_alerts": a} for s, n, a in session.execute(query).tuples()]


def baseline_values(session: Session, *, series_id: str, metric: str, window: int, exclude_runs: Sequence[str]) -> list[float]:
    """The metric's values of the latest `window` results on a series, oldest first (results in `exclude_runs` left out)."""
    query = (
        select(SeriesVerdict.value)
        .join(Run, Run.id == SeriesVerdict.run_id)
        .where(SeriesVerdict.series_id == series_id, SeriesVerdict.metric == metric)
        .order_by(Run.created_at.desc(), SeriesVerdict.id.desc())
        .limit(window)
    )
    if exclude_runs:
        query = query.where(SeriesVerdict.run_id.not_in(list(exclude_runs)))
    return list(reversed(session.execute(query).scalars().all()))


def latest_values(
    session: Session, *, series_id: str, metrics: Sequence[str], window: int, exclude_runs: Sequence[str]
) -> dict[str, list[float]]:
    """`baseline_values` of each of `metrics` (the same lists), without reading the whole series per
    metric: the series' latest `window` + 1 runs and their verdicts, in one query.

    The latest `window` results of a metric are among the latest `window` runs when those runs
    hold `window` values of it (a verdict is stored on its run's series, and an older run's
    verdict sorts after each of theirs). A metric with fewer values there while older runs exist,
    or a tie on `created_at` at the window's edge, is read the full way (`baseline_values`)."""
    runs = select(Run.id, Run.created_at).where(Run.series_id == series_id).order_by(Run.created_at.desc(), Run.id.desc()).limit(window + 1)
    if exclude_runs:
        runs = runs.where(Run.id.not_in(list(exclude_runs)))
    latest_runs = runs.subquery()
    # one query: the latest runs (at most window + 1, so the planner joins their verdicts by run id)
    rows = session.execute(
        select(
            latest_runs.c.id, latest_runs.c.created_at, SeriesVerdict.id, SeriesVerdict.series_id, SeriesVerdict.metric, SeriesVerdict.value
        )
        .select_from(latest_runs)
        .outerjoin(SeriesVerdict, SeriesVerdict.run_id == latest_runs.c.id)
        .order_by(latest_runs.c.created_at.desc(), latest_runs.c.id.desc(), SeriesVerdict.id.desc())
    ).all()
    latest: list[tuple[str, Any]] = []
    for row in rows:
        if not latest or latest[-1][0] != row[0]:
            latest.append((row[0], row[1]))
    more = len(latest) > window
    tied = more and latest[window - 1][1] == latest[window][1]
    found: dict[str, list[tuple[Any, int, float]]] = {}
    if latest and not tied:
        kept = {run_id for run_id, _ in latest[:window]}
        wanted = set(metrics)
        for run_id, created_at, verdict_id, verdict_series, metric, value in rows:
            if run_id in kept and verdict_id is not None and verdict_series == series_id and metric in wanted:
                found.setdefault(metric, []).append((created_at, verdict_id, value))
    out: dict[str, list[float]] = {}
    for metric in metrics:
        newest = [value for _, _, value in sorted(found.get(metric, []), reverse=True)[:window]]
        if tied or (more and len(newest) < window):
            out[metric] = baseline_values(session, series_id=series_id, metric=metric, window=window, exclude_runs=exclude_runs)
        else:
            out[metric] = list(reversed(newest))
    return out


def add_verdicts(session: Session, rows: list[dict[str, Any]], *, returning: bool = False) -> list[SeriesVerdict]:
    """One batched insert of verdict rows; with `returning`, the stored verdicts in id order (from
    the insert itself, no second query)."""
    if not rows:
        return []
    if not returning:
        session.execute(insert(SeriesVerdict), rows)
        return []
    added = session.scalars(insert(SeriesVerdict).returning(SeriesVerdict, sort_by_parameter_order=True), rows).all()
    return sorted(added, key=lambda v: v.id)


def verdicts_for_runs(session: Session, run_ids: Sequence[str]) -> list[SeriesVerdict]:
    if not run_ids:
        return []
    return list(session.execute(select(SeriesVerdict).where(SeriesVerdict.run_id.in_(list(run_ids))).order_by(SeriesVerdict.id)).scalars())


def history(session: Session, series_id: str) -> list[tuple[Run, list[SeriesVerdict]]]:
    """Every result on a series in order (oldest first), with its verdicts; summary columns only, no documents."""
    runs = list(session.execute(select(Run).where(Run.series_id == series_id).order_by(Run.created_at, Run.id)).scalars())
    verdicts: dict[str, list[SeriesVerdict]] = {}
    for v in verdicts_for_runs(session, [r.id for r in runs]):
        verdicts.setdefault(v.run_id, []).append(v)
    return [(r, verdicts.get(r.id, [])) for r in runs]


def host_speeds(session: Session, run_ids: Sequence[str]) -> dict[str, Any]:
    """Each run's stored `host_speed` (the document's field only), where its result has one."""
    if not run_ids:
        return {}
    field = RunResult.document["host_speed"]
    rows = session.execute(select(RunResult.run_id, field).where(RunResult.run_id.in_(list(run_ids)))).all()
    return {run_id: value for run_id, value in rows if value is not None}


def get_verdict(session: Session, verdict_id: int) -> SeriesVerdict | None:
    return session.get(SeriesVerdict, verdict_id)


def dismiss(session: Session, verdict: SeriesVerdict, *, user_id: int | None, note: str | None, now: datetime) -> None:
    verdict.dismissed = True
    verdict.dismissed_by = user_id
    verdict.dismissed_at = now
    verdict.dismiss_note = note


# ---- exact counters and accepted changes ----


def latest_counters(session: Session, *, series_id: str, config_key: str, exclude_runs: Sequence[str]) -> SeriesCounters | None:
    """The series' latest result's counters of one config (results in `exclude_runs` left out)."""
    query = (
        select(SeriesCounters)
        .where(SeriesCounters.series_id == series_id, SeriesCounters.config_key == config_key)
        .order_by(SeriesCounters.created_at.desc(), SeriesCounters.run_id.desc())
        .limit(1)
    )
    if exclude_runs:
        query = query.where(SeriesCounters.run_id.not_in(list(exclude_runs)))
    return session.execute(query).scalar_one_or_none()


def add_counters(session: Session, rows: Sequence[SeriesCounters]) -> None:
    session.add_all(rows)


def counters_for_runs(session: Session, run_ids: Sequence[str]) -> list[SeriesCounters]:
    if not run_ids:
        return []
    return list(session.execute(select(SeriesCounters).where(SeriesCounters.run_id.in_(list(run_ids)))).scalars())


def counters_history(session: Session, series_id: str) -> list[SeriesCounters]:
    """Every result's counters on a series, oldest first."""
    query = select(SeriesCounters).where(SeriesCounters.series_id == series_id).order_by(SeriesCounters.created_at, SeriesCounters.run_id)
    return list(session.execute(query).scalars())


def accepts_of_family(session: Session, family: str) -> set[tuple[str, float]]:
    """The (counter, value) changes accepted on any series of a family."""
    rows = session.execute(select(SeriesAccept.counter, SeriesAccept.value).where(SeriesAccept.family == family)).tuples()
    return {(c, v) for c, v in rows}


def add_accepts(session: Session, rows: Sequence[SeriesAccept]) -> None:
    session.add_all(rows)
