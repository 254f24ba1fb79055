"""The verdict a pull request reads: a series' exact changes, its timing change points, its noise floor.

`assemble` is pure (the series' facts in, the report dict out), so the Markdown golden files
test it without a database; `series_report` reads a series and hands it the facts.

Timing metrics are judged over *jobs*, not runs: the results of one commit uploaded together are
repetitions inside one CI job, which share that runner's luck, so they are averaged into one
value and the noise is the spread between jobs (`parallab.core.changepoints.between_job_cv`).
A change point's bisect hint is the range from the last uploaded commit before it to the first
after it: the commits between them were not measured.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from backend.services import exact_gates, regression
from backend.services import series as series_service
from backend.store import series as store
from parallab.core import changepoints as cp

TIMING_METRICS = ("tokens_per_s", "step_time_p50", "exposed_comm_fraction")
MAX_JOBS = 60
"""Change points are searched over the latest this many jobs (the permutation test reruns the search per shuffle)."""
RECENT = 2 * cp.MIN_SIZE
"""A change point among the latest this many jobs makes the report say something changed."""


@dataclass(frozen=True)
class Job:
    """One CI job's result on a series: its commit and each metric's value (repeats averaged)."""

    commit: str | None
    values: dict[str, float]
    first_point: int
    """The index of its first result among the series' results (for the chart)."""


def jobs_of(points: Sequence[tuple[str | None, dict[str, float]]]) -> list[Job]:
    """Consecutive results of one commit form one job; each metric averaged over the job."""
    grouped: list[tuple[str | None, list[dict[str, float]], int]] = []
    for i, (commit, values) in enumerate(points):
        if grouped and commit is not None and grouped[-1][0] == commit:
            grouped[-1][1].append(values)
        else:
            grouped.append((commit, [values], i))
    out = []
    for commit, members, first in grouped:
        names = {k for m in members for k in m}
        averaged = {k: sum(m[k] for m in members if k in m) / sum(1 for m in members if k in m) for k in names}
        out.append(Job(commit, averaged, first))
    return out


def timing(jobs: Sequence[Job], metric: regression.Metric, *, window: int, alpha: float) -> dict[str, Any]:
    """One metric's change points, between-job CV and minimum detectable change."""
    judged = [(i, j) for i, j in enumerate(jobs) if metric.name in j.values][-MAX_JOBS:]
    out: dict[str, Any] = {"metric": metric.name, "label": metric.label, "unit": metric.unit, "jobs": len(judged), "needed": cp.MIN_RESULTS}
    if len(judged) < cp.MIN_RESULTS:
        return {**out, "status": "too_few", "cv": None, "mdc_pct": None, "mdc_single_pct": None, "change_points": []}
    values = [j.values[metric.name] for _, j in judged]
    found = cp.detect(values)
    cv = cp.between_job_cv(values, [c.index for c in found])
    points = []
    for c in found:
        (_, after), (_, before) = judged[c.index], judged[c.index - 1]
        worse = c.size < 0 if metric.higher_is_better else c.size > 0
        points.append(
            {
                "job": c.index,
                "point": after.first_point,
                "commit": after.commit,
                "last_before": before.commit,
                "bisect": f"{before.commit}..{after.commit}" if before.commit and after.commit else None,
                "size_pct": c.size * 100,
                "lower_pct": c.lower * 100,
                "upper_pct": c.upper * 100,
                "p_value": c.p_value,
                "worse": worse,
                "recent": c.index >= len(values) - RECENT,
            }
        )
    return {
        **out,
        "status": "judged",
        "cv": cv,
        "mdc_pct": None if cv is None else cp.min_detectable_change(cv) * 100,
        "mdc_per_side": cp.HORIZON,
        "mdc_single_pct": None if cv is None else cp.min_detectable_single(cv, window=window, alpha=alpha) * 100,
        "change_points": points,
    }


def assemble(*, series: dict[str, Any], jobs: Sequence[Job], latest: dict[str, Any] | None, window: int, alpha: float) -> dict[str, Any]:
    """The report: `latest` is the series' latest result's exact comparison ({run_id, commit,
    baseline_run_id, baseline_commit, changes} with changes marked accepted; baseline_run_id None
    when there was nothing of its config to compare with), None when the series has no counters."""
    metrics = [regression.METRICS_BY_NAME[m] for m in TIMING_METRICS if any(m in j.values for j in jobs)]
    timings = [timing(jobs, m, window=window, alpha=alpha) for m in metrics]
    open_changes = [c for c in (latest or {}).get("changes", []) if not c["accepted"]]
    recent = any(p["recent"] and p["worse"] for t in timings for p in t["change_points"])
    return {"series": series, "jobs": len(jobs), "exact": latest, "timing": timings, "changed": bool(open_changes) or recent}


def series_report(*, session: Session, series_id: str) -> dict[str, Any]:
    """`GET /api/v1/series/{id}/report`: the report of a stored series."""
    return view_report(session=session, view=series_service.series_view(session=session, series_id=series_id))


def view_report(*, session: Session, view: series_service.SeriesView) -> dict[str, Any]:
    """The report of a series already read (the series page has it)."""
    s = view.series
    series_id = s.id
    points = [(p.run.commit, {m: v.value for m, v in p.verdicts.items()}) for p in view.points]
    commits = {p.run.id: p.run.commit for p in view.points}
    history = store.counters_history(session, series_id)
    latest = None
    if history:
        row = history[-1]
        marked = exact_gates.changes_for_runs(session=session, run_ids=[row.run_id]).get(row.run_id, [])
        baseline_commit = commits.get(row.baseline_run_id or "")
        if baseline_commit is None and row.baseline_run_id is not None:
            baseline_commit = series_service.run_commit(session=session, run_id=row.baseline_run_id)
        latest = {
            "run_id": row.run_id,
            "commit": commits.get(row.run_id),
            "baseline_run_id": row.baseline_run_id,
            "baseline_commit": baseline_commit,
            "changes": marked,
        }
    info = {
        "id": s.id,
        "label": s.label,
        "branch": s.branch,
        "repository": s.repository,
        "strategy": s.strategy,
        "world_size": s.world_size,
    }
    return assemble(series=info, jobs=jobs_of(points), latest=latest, window=s.window, alpha=s.alpha)
