"""The verdict a pull request reads: a series' exact changes, its timing change points, its noise floor.

`assemble` is pure (the series' facts in, the report dict out), so the Markdown golden files
test it without a database; `series_report` reads a series and hands it the facts.

Timing metrics are judged over *jobs*, not runs: the results of one commit uploaded together are
repetitions inside one CI job, which share that runner's luck, so they are averaged into one
value and the noise is the spread between jobs (`parallab.core.changepoints.between_job_cv`).
Where a job carries the host-speed probe (`parallab.core.hostspeed`: a fixed CPU reference timed
right before and after its ranks), each throughput and duration is also judged normalised by it —
tokens/s ÷ the probe's rate, step time × it — beside the raw metric, each with its own between-job
CV, so a team sees which is quieter on its runner. Jobs without the probe (uploads from before it,
or of another probe version) are judged raw only, and the report says how many there were.

Which of the two the verdict (`changed`, and `parallab upload --fail-on-change timing`) reads is
the *basis* (`BASES`): `raw`, `normalised`, or `auto` — normalised where every job compared
carries the probe, raw otherwise, since normalising only some jobs would compare two units. Each
timing metric says which it was judged on and why (`judged_on`, `judged_because`).

A change point's bisect hint is the range from the last uploaded commit before it to the first
after it: the commits between them were not measured.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy.orm import Session

from backend.services import exact_gates, regression
from backend.services import series as series_service
from backend.store import series as store
from parallab.core import changepoints as cp
from parallab.core import hostspeed

TIMING_METRICS = ("tokens_per_s", "step_time_p50", "exposed_comm_fraction")
MAX_JOBS = 60
"""Change points are searched over the latest this many jobs (the permutation test reruns the search per shuffle)."""
RECENT = 2 * cp.MIN_SIZE
"""A change point among the latest this many jobs makes the report say something changed."""
Basis = Literal["auto", "raw", "normalised"]
BASES: tuple[Basis, ...] = ("auto", "raw", "normalised")
"""What the timing verdict reads: the raw metric, the metric normalised by the host's speed, or
`auto` — normalised where every job compared carries the probe, raw otherwise."""


@dataclass(frozen=True)
class Job:
    """One CI job's result on a series: its commit and each metric's value (repeats averaged)."""

    commit: str | None
    values: dict[str, float]
    first_point: int
    """The index of its first result among the series' results (for the chart)."""
    ops_per_s: float | None = None
    """The host-speed probe's rate (mean over the job's results); None unless every one carries it."""


NORMALISED = {"tokens_per_s": "tokens per Mop", "step_time_p50": "Mops"}
"""The timing metrics judged normalised by the host's speed too, with their normalised unit."""


def jobs_of(points: Sequence[tuple[str | None, dict[str, float]]], speeds: Sequence[float | None] | None = None) -> list[Job]:
    """Consecutive results of one commit form one job; each metric averaged over the job, and so is
    the host-speed probe (`speeds`, by result; None where a result carries none). A job with a
    result that carries no probe has none: its averaged metric would mix in an unprobed result."""
    if speeds is not None and len(speeds) != len(points):
        raise ValueError(f"speeds: {len(speeds)} values for {len(points)} results")
    grouped: list[tuple[str | None, list[dict[str, float]], list[float | None], int]] = []
    for i, (commit, values) in enumerate(points):
        speed = speeds[i] if speeds is not None else None
        if grouped and commit is not None and grouped[-1][0] == commit:
            grouped[-1][1].append(values)
        else:
            grouped.append((commit, [values], [], i))
        grouped[-1][2].append(speed)
    out = []
    for commit, members, rates, first in grouped:
        names = {k for m in members for k in m}
        averaged = {k: sum(m[k] for m in members if k in m) / sum(1 for m in members if k in m) for k in names}
        probed = [r for r in rates if r is not None]
        out.append(Job(commit, averaged, first, sum(probed) / len(probed) if len(probed) == len(rates) else None))
    return out


def normalised_metric(metric: regression.Metric) -> regression.Metric:
    """The metric with the host's speed taken out (`parallab.core.hostspeed.normalise`)."""
    return regression.Metric(
        f"{metric.name}/host", f"{metric.label} ÷ host speed", NORMALISED[metric.name], metric.higher_is_better, lambda s: None
    )


def normalised_jobs(jobs: Sequence[Job], metric: regression.Metric) -> list[Job]:
    """Each job's metric normalised by its probe, under the normalised metric's name; a job without
    the probe keeps only its raw values (so the normalised search leaves it out)."""
    name = normalised_metric(metric).name
    out = []
    for j in jobs:
        values = dict(j.values)
        if j.ops_per_s is not None and metric.name in j.values:
            values[name] = hostspeed.normalise(j.values[metric.name], j.ops_per_s, higher_is_better=metric.higher_is_better)
        out.append(Job(j.commit, values, j.first_point, j.ops_per_s))
    return out


def host_speed_note(jobs: Sequence[Job]) -> dict[str, Any]:
    """How many jobs carry the probe, and what that means for the verdict."""
    probed = sum(1 for j in jobs if j.ops_per_s is not None)
    if probed == 0:
        note = "no job carries a host-speed probe: timings are judged raw only"
    elif probed < len(jobs):
        note = (
            f"{len(jobs) - probed} of {len(jobs)} jobs carry no host-speed probe: they are judged raw only; "
            f"the normalised metrics cover the {probed} that do"
        )
    else:
        note = f"every job carries the host-speed probe ({hostspeed.PROBE} v{hostspeed.PROBE_VERSION})"
    return {"probe": hostspeed.PROBE, "version": hostspeed.PROBE_VERSION, "jobs": len(jobs), "jobs_with_probe": probed, "note": note}


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


def judged_on(jobs: Sequence[Job], metric: str, normalised: dict[str, Any] | None, basis: Basis) -> tuple[str, str]:
    """(`raw` or `normalised`, why): which of a metric's two searches its verdict reads."""
    compared = [j for j in jobs if metric in j.values][-MAX_JOBS:]
    unprobed = sum(1 for j in compared if j.ops_per_s is None)
    if basis not in BASES:
        raise ValueError(f"basis: {basis!r} is not one of {', '.join(BASES)}")
    if metric not in NORMALISED:
        return "raw", "this metric is not normalised by the host's speed"
    if normalised is None:
        return "raw", "no job compared carries the host-speed probe"
    if basis == "raw":
        return "raw", "asked for raw"
    if basis == "normalised":
        left_out = f"; the {unprobed} jobs without the probe are left out" if unprobed else ""
        return "normalised", f"asked for normalised{left_out}"
    if unprobed:
        return "raw", f"{unprobed} of the {len(compared)} jobs compared carry no host-speed probe"
    return "normalised", f"every one of the {len(compared)} jobs compared carries the host-speed probe"


def judged(t: dict[str, Any]) -> dict[str, Any]:
    """The search a timing metric's verdict reads (itself or its normalised twin)."""
    return t["normalised"] if t["judged_on"] == "normalised" else t


def assemble(
    *,
    series: dict[str, Any],
    jobs: Sequence[Job],
    latest: dict[str, Any] | None,
    window: int,
    alpha: float,
    basis: Basis = "auto",
) -> dict[str, Any]:
    """The report: `latest` is the series' latest result's exact comparison ({run_id, commit,
    baseline_run_id, baseline_commit, changes} with changes marked accepted; baseline_run_id None
    when there was nothing of its config to compare with), None when the series has no counters.
    `basis` chooses what the timing verdict reads (`BASES`)."""
    metrics = [regression.METRICS_BY_NAME[m] for m in TIMING_METRICS if any(m in j.values for j in jobs)]
    timings = []
    for m in metrics:
        t = timing(jobs, m, window=window, alpha=alpha)
        if m.name in NORMALISED and any(j.ops_per_s is not None for j in jobs):
            t["normalised"] = timing(normalised_jobs(jobs, m), normalised_metric(m), window=window, alpha=alpha)
        t["judged_on"], t["judged_because"] = judged_on(jobs, m.name, t.get("normalised"), basis)
        timings.append(t)
    open_changes = [c for c in (latest or {}).get("changes", []) if not c["accepted"]]
    recent = any(p["recent"] and p["worse"] for t in timings for p in judged(t)["change_points"])
    return {
        "series": series,
        "jobs": len(jobs),
        "exact": latest,
        "timing": timings,
        "basis": basis,
        "host_speed": host_speed_note(jobs),
        "timing_changed": recent,
        "changed": bool(open_changes) or recent,
    }


def series_report(*, session: Session, series_id: str, basis: Basis = "auto") -> dict[str, Any]:
    """`GET /api/v1/series/{id}/report`: the report of a stored series."""
    return view_report(session=session, view=series_service.series_view(session=session, series_id=series_id), basis=basis)


def view_report(*, session: Session, view: series_service.SeriesView, basis: Basis = "auto") -> dict[str, Any]:
    """The report of a series already read (the series page has it)."""
    s = view.series
    series_id = s.id
    points = [(p.run.commit, {m: v.value for m, v in p.verdicts.items()}) for p in view.points]
    probes = store.host_speeds(session, [p.run.id for p in view.points])
    speeds = [_ops_per_s(probes.get(p.run.id)) for p in view.points]
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
    return assemble(series=info, jobs=jobs_of(points, speeds), latest=latest, window=s.window, alpha=s.alpha, basis=basis)


def _ops_per_s(stored: Any) -> float | None:
    """A stored result's probe rate, when it carries one of this probe's definition and version."""
    if not isinstance(stored, dict):
        return None
    try:
        speed = hostspeed.HostSpeed.model_validate(stored)
    except ValueError:
        return None
    return speed.ops_per_s if speed.version == hostspeed.PROBE_VERSION and speed.ops == hostspeed.PROBE_OPS else None
