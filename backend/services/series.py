"""CI benchmark series: which series an upload joins, its verdicts, the history views.

A series is the same workload (`workload_key`), strategy and options, and hardware
(`hardware_key`), from one repository, on one branch. Series that differ only in branch form a
family; a series' baseline is the latest `window` results of its family's series on
`baseline_branch` (default `main`), so a branch is judged against main, and main against its
own recent past — the baseline moves when main moves.

Results of one upload on one series with one commit are repetitions and are judged together
(Welch's test needs several); each still gets its own verdict rows, which keep the band they
were judged against.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session

from backend.models import Run, Series, SeriesVerdict, utcnow
from backend.services import regression
from backend.services.auth import Forbidden, Principal
from backend.services.errors import DomainError, FieldError
from backend.services.leaderboard import workload_label
from backend.store import accounts as accounts_store
from backend.store import runs as runs_store
from backend.store import series as store
from parallab.core.result import ResultDocument

SERIES_PAGE = 500


class Unowned:
    """`family_key`'s default: the plain family, no owner in its hash (None is an owner: nobody's)."""


UNOWNED = Unowned()


class SeriesNotFound(DomainError, LookupError):
    """No series has this id (404)."""

    status_code = 404

    def http_detail(self) -> Any:
        return f"no series {self.args[0]!r}"


class SeriesConfigError(FieldError):
    """A series' settings are not valid; the message names the field (422)."""


def family_key(
    *,
    repository: str | None,
    workload_key: str,
    hardware_key: str,
    strategy: str,
    world_size: int,
    options: dict[str, Any],
    owner: int | None | Unowned = UNOWNED,
) -> str:
    """Hash of everything that must match for two results to share a history, the branch aside.

    `owner`: the uploader whose own family this is, given only when the plain family (the same
    fields, no owner: the key every family had before owners were in it) belongs to another
    member — so the first uploader keeps the plain key and its stored series stay where they are."""
    picked = {
        "repository": repository,
        "workload_key": workload_key,
        "hardware_key": hardware_key,
        "strategy": strategy,
        "world_size": world_size,
        "options": options,
    }
    if not isinstance(owner, Unowned):
        picked["owner"] = owner
    return hashlib.sha256(json.dumps(picked, sort_keys=True, default=str).encode()).hexdigest()[:32]


def series_id(family: str, branch: str) -> str:
    return hashlib.sha256(f"{family}\n{branch}".encode()).hexdigest()[:32]


def config_of(series: Series) -> regression.Config:
    return regression.Config(
        test=series.test,
        window=series.window,
        baseline_branch=series.baseline_branch,
        alpha=series.alpha,
        mad_k=series.mad_k,
        min_change=series.min_change,
    )


def _family_and_branch(session: Session, run: Run, document: ResultDocument) -> tuple[str, str] | None:
    """The series family and branch of an uploaded run; None without a branch (no series).

    A family is its first uploader's (the owner of its earliest series): only the owner's uploads
    (their session or a token they issued: `run.user_id`) join it. Another member's upload naming
    the same repository, branch and config gets a family of its own (`family_key`'s `owner`), so it
    never joins the owner's series nor moves their baseline."""
    source = document.source
    if source is None or not source.branch or run.workload_key is None or run.hardware_key is None:
        return None
    fields: dict[str, Any] = {
        "repository": source.repository,
        "workload_key": run.workload_key,
        "hardware_key": run.hardware_key,
        "strategy": document.strategy.name,
        "world_size": document.strategy.world_size,
        "options": document.strategy.options,
    }
    family = family_key(**fields)
    owner = store.family_owner(session, family)
    if owner is not None and owner.user_id != run.user_id:
        family = family_key(**fields, owner=run.user_id)
    return family, source.branch


def series_id_of(session: Session, run: Run, document: ResultDocument) -> str | None:
    """The id of the series an uploaded run belongs to (whether it exists yet or not)."""
    found = _family_and_branch(session, run, document)
    return series_id(*found) if found is not None else None


def join_series(*, session: Session, run: Run, document: ResultDocument) -> Series | None:
    """The series an uploaded run belongs to (created on its first result); None without a branch.

    A new series takes its family's baseline-branch series' settings, else the defaults."""
    found = _family_and_branch(session, run, document)
    if found is None:
        return None
    family, branch = found
    source = document.source
    assert source is not None
    sid = series_id(family, branch)
    series = store.get_series(session, sid)
    if series is None:
        config = regression.DEFAULTS
        model = store.family_series(session, family, config.baseline_branch)
        if model is not None:
            config = config_of(model)
        series = store.add_series(
            session,
            Series(
                id=sid,
                family=family,
                repository=source.repository,
                branch=source.branch,
                workload_key=run.workload_key,
                hardware_key=run.hardware_key,
                strategy=document.strategy.name,
                world_size=document.strategy.world_size,
                options=document.strategy.options,
                model=run.model,
                label=workload_label(run.spec, run.model)[:300],
                test=config.test,
                window=config.window,
                baseline_branch=config.baseline_branch,
                alpha=config.alpha,
                mad_k=config.mad_k,
                min_change=config.min_change,
                user_id=run.user_id,
            ),
        )
    series.updated_at = utcnow()
    run.series_id = series.id
    return series


def baseline_series(session: Session, series: Series) -> Series | None:
    """The series whose latest results judge this one: itself on the baseline branch, else its family's."""
    if series.branch == series.baseline_branch:
        return series
    return store.family_series(session, series.family, series.baseline_branch)


def add_verdicts(*, session: Session, rows: list[dict[str, Any]]) -> list[SeriesVerdict]:
    """Store verdict rows (from `judgements`); the stored verdicts, in id order."""
    return store.add_verdicts(session, rows, returning=True)


def judgements(*, session: Session, uploads: Sequence[tuple[Run, ResultDocument]]) -> list[dict[str, Any]]:
    """The verdict rows of newly uploaded runs (each already joined to its series), judged against
    the results stored before them; reads only."""
    batch_ids = [run.id for run, _ in uploads]
    groups: dict[tuple[str, str | None], list[tuple[Run, dict[str, float]]]] = {}
    for run, document in uploads:
        if run.series_id is not None:
            values = regression.metric_values(document.summary.model_dump())
            groups.setdefault((run.series_id, run.commit), []).append((run, values))
    rows: list[dict[str, Any]] = []
    for (sid, _commit), members in groups.items():
        series = store.get_series(session, sid)
        assert series is not None
        config = config_of(series)
        base = baseline_series(session, series)
        judged = [m for m in regression.METRICS if any(m.name in values for _, values in members)]
        baselines = (
            store.latest_values(session, series_id=base.id, metrics=[m.name for m in judged], window=config.window, exclude_runs=batch_ids)
            if base is not None and judged
            else {}
        )
        for metric in judged:
            new = [values[metric.name] for _, values in members if metric.name in values]
            baseline = baselines.get(metric.name, [])
            judgement = regression.judge(baseline, new, config=config, higher_is_better=metric.higher_is_better)
            for run, values in members:
                if metric.name not in values:
                    continue
                rows.append(
                    {
                        "series_id": sid,
                        "run_id": run.id,
                        "metric": metric.name,
                        "value": values[metric.name],
                        "verdict": judgement.verdict,
                        "change": judgement.change,
                        "baseline_center": judgement.center,
                        "lower": judgement.lower,
                        "upper": judgement.upper,
                        "baseline_n": judgement.baseline_n,
                        "baseline_branch": config.baseline_branch,
                        "test": config.test,
                        "threshold": config.threshold(),
                        "p_value": judgement.p_value,
                        "dismissed": False,
                        "created_at": utcnow(),
                    }
                )
    return rows


def run_commit(*, session: Session, run_id: str) -> str | None:
    """The commit of a stored run (None when it has none or is gone)."""
    run = runs_store.get_run(session, run_id)
    return run.commit if run is not None else None


def verdicts_for_runs(*, session: Session, run_ids: Sequence[str]) -> dict[str, list[SeriesVerdict]]:
    out: dict[str, list[SeriesVerdict]] = {}
    for v in store.verdicts_for_runs(session, run_ids):
        out.setdefault(v.run_id, []).append(v)
    return out


# ---- views ----


@dataclass
class Point:
    """One result on a series, as the history page and `GET /series/{id}` show it."""

    run: Run
    user: str | None
    verdicts: dict[str, SeriesVerdict]

    @property
    def regressed(self) -> list[SeriesVerdict]:
        return [v for v in self.verdicts.values() if v.verdict == "regressed"]


@dataclass
class SeriesView:
    series: Series
    baseline: Series | None
    points: list[Point]
    siblings: list[Series] = field(default_factory=list)
    """The family's other branches."""

    @property
    def alerts(self) -> list[tuple[Point, SeriesVerdict]]:
        return [(p, v) for p in self.points for v in p.regressed]


def get_series(*, session: Session, series_id: str) -> Series:
    series = store.get_series(session, series_id)
    if series is None:
        raise SeriesNotFound(series_id)
    return series


def series_view(*, session: Session, series_id: str) -> SeriesView:
    """A series with every result on it (oldest first), their verdicts and uploaders."""
    series = get_series(session=session, series_id=series_id)
    history = store.history(session, series_id)
    emails = accounts_store.user_emails(session, [r.user_id for r, _ in history if r.user_id is not None])
    points = [Point(r, emails.get(r.user_id) if r.user_id is not None else None, {v.metric: v for v in vs}) for r, vs in history]
    siblings = [s for s in store.series_of_family(session, series.family) if s.id != series.id]
    return SeriesView(series=series, baseline=baseline_series(session, series), points=points, siblings=siblings)


def list_series(*, session: Session, limit: int = SERIES_PAGE) -> list[dict[str, Any]]:
    return store.list_series(session, limit=limit)


def check_owner(*, principal: Principal, series: Series) -> None:
    """Forbidden unless `principal` owns the series or is an admin. A 403, not a 404: every reader
    may list and read series, so refusing with "not found" would hide nothing."""
    if not principal.owns(series.user_id):
        raise Forbidden(f"only the owner of series {series.id} or an admin may change it; {principal.name} is neither")


def configure(*, session: Session, series_id: str, changes: dict[str, Any], principal: Principal) -> Series:
    """Change how a series judges its next results (test, window, baseline branch, thresholds; its
    owner or an admin only; caller commits)."""
    series = get_series(session=session, series_id=series_id)
    check_owner(principal=principal, series=series)
    checks = {
        "test": lambda v: v in regression.TESTS or f"must be one of {', '.join(regression.TESTS)}",
        "window": lambda v: (isinstance(v, int) and 2 <= v <= 1000) or "must be an integer from 2 to 1000",
        "alpha": lambda v: (isinstance(v, (int, float)) and 0 < v < 0.5) or "must be in (0, 0.5)",
        "mad_k": lambda v: (isinstance(v, (int, float)) and 0 < v <= 100) or "must be in (0, 100]",
        "min_change": lambda v: (isinstance(v, (int, float)) and 0 <= v < 1) or "must be in [0, 1)",
        "baseline_branch": lambda v: _branch_ok(v),
    }
    for name, value in changes.items():
        if name not in checks:
            raise SeriesConfigError(name, "not a setting of a series")
        ok = checks[name](value)
        if ok is not True:
            raise SeriesConfigError(name, str(ok))
        setattr(series, name, value)
    return series


def _branch_ok(value: Any) -> bool | str:
    from parallab.core.result import check_branch

    if not isinstance(value, str) or not value or len(value) > 200:
        return "must be a branch name of 1 to 200 characters"
    try:
        check_branch(value)
    except ValueError as exc:
        return str(exc)
    return True


def dismiss_alert(*, session: Session, series_id: str, verdict_id: int, principal: Principal, note: str | None = None) -> SeriesVerdict:
    """Mark a regression alert as a false positive (the series' owner or an admin only); the
    dismissal (who, when, why) is kept (caller commits)."""
    verdict = store.get_verdict(session, verdict_id)
    if verdict is None or verdict.series_id != series_id:
        raise SeriesNotFound(f"{series_id}/alerts/{verdict_id}")
    check_owner(principal=principal, series=get_series(session=session, series_id=series_id))
    if verdict.verdict != "regressed":
        raise SeriesConfigError("alert", f"verdict {verdict_id} is {verdict.verdict}, not an alert")
    store.dismiss(session, verdict, user_id=principal.user_id, note=(note or "").strip()[:500] or None, now=utcnow())
    return verdict


def verdict_dict(v: SeriesVerdict) -> dict[str, Any]:
    """A verdict as the API returns it (the change in %, the band and the test used)."""
    metric = regression.METRICS_BY_NAME.get(v.metric)
    return {
        "id": v.id,
        "metric": v.metric,
        "higher_is_better": metric.higher_is_better if metric else None,
        "verdict": v.verdict,
        "value": v.value,
        "baseline": v.baseline_center,
        "change_pct": None if v.change is None else v.change * 100,
        "lower": v.lower,
        "upper": v.upper,
        "test": v.test,
        "threshold": v.threshold,
        "p_value": v.p_value,
        "baseline_n": v.baseline_n,
        "baseline_branch": v.baseline_branch,
        "dismissed": v.dismissed,
        "dismissed_at": v.dismissed_at,
        "dismiss_note": v.dismiss_note,
    }


def series_dict(series: Series) -> dict[str, Any]:
    return {
        "id": series.id,
        "repository": series.repository,
        "branch": series.branch,
        "label": series.label,
        "model": series.model,
        "strategy": series.strategy,
        "world_size": series.world_size,
        "options": series.options,
        "hardware_key": series.hardware_key,
        "workload_key": series.workload_key,
        "owner_id": series.user_id,
        "config": {
            "test": series.test,
            "window": series.window,
            "baseline_branch": series.baseline_branch,
            "alpha": series.alpha,
            "mad_k": series.mad_k,
            "min_change": series.min_change,
        },
        "created_at": series.created_at,
        "updated_at": series.updated_at,
    }


def view_dict(view: SeriesView) -> dict[str, Any]:
    """`GET /api/v1/series/{id}`: the series, its baseline series, and every result with its verdicts."""
    return {
        **series_dict(view.series),
        "baseline_series_id": view.baseline.id if view.baseline else None,
        "points": [
            {
                "run_id": p.run.id,
                "created_at": p.run.created_at,
                "commit": p.run.commit,
                "branch": p.run.branch,
                "pr": p.run.pr,
                "ci_url": p.run.ci_url,
                "uploaded_by": p.user,
                "verdicts": [verdict_dict(v) for v in p.verdicts.values()],
            }
            for p in view.points
        ],
        "open_alerts": sum(1 for _, v in view.alerts if not v.dismissed),
    }
