"""Pages of CI series: every series, and one series' history with its alerts."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse

from backend.api.deps import RowId, SeriesEditorDep, SessionDep, SettingsDep
from backend.api.pages.forms import CheckedFormDep
from backend.api.pages.rendering import render, render_error
from backend.figures import series as series_figs
from backend.services import ci_report, regression
from backend.services import series as series_service
from backend.services.series import SeriesConfigError, SeriesNotFound, SeriesView

router = APIRouter(include_in_schema=False)


@router.get("/series", response_class=HTMLResponse)
def series_list(request: Request, session: SessionDep, settings: SettingsDep) -> HTMLResponse:
    return render(request, "series_list.html", {"rows": series_service.list_series(session=session)}, settings=settings)


def figure_points(view: SeriesView, metric: str) -> list[dict[str, Any]]:
    """The history figure's points of one metric (results without it are left out)."""
    out = []
    for p in view.points:
        v = p.verdicts.get(metric)
        if v is None:
            continue
        out.append(
            {
                "label": (p.run.commit or p.run.id)[:8],
                "value": v.value,
                "lower": v.lower,
                "upper": v.upper,
                "verdict": v.verdict,
                "dismissed": v.dismissed,
                "run_id": p.run.id,
                "commit": p.run.commit,
                "branch": p.run.branch,
            }
        )
    return out


@router.get("/series/{series_id}", response_class=HTMLResponse)
def series_page(request: Request, series_id: str, session: SessionDep, settings: SettingsDep) -> HTMLResponse:
    try:
        view = series_service.series_view(session=session, series_id=series_id)
    except SeriesNotFound:
        return render_error(request, 404, "No such series", f"There is no series {series_id!r}.", settings=settings)
    report = ci_report.view_report(session=session, view=view)
    timings = {t["metric"]: t for t in report["timing"]}

    def marks(t: dict[str, Any] | None) -> list[dict[str, Any]]:
        """A search's change points, each with the run of the first result after it (where the chart draws it)."""
        return [{**c, "run_id": view.points[c["point"]].run.id} for c in (t or {}).get("change_points", [])]

    figures = {
        m.name: series_figs.history(
            figure_points(view, m.name),
            title=m.label,
            unit=m.unit,
            higher_is_better=m.higher_is_better,
            changes=marks(timings.get(m.name)),
            normalised_changes=marks(timings.get(m.name, {}).get("normalised")),
            judged_on=timings[m.name]["judged_on"] if timings.get(m.name, {}).get("normalised") else None,
        )
        for m in regression.METRICS
        if any(m.name in p.verdicts for p in view.points)
    }
    context = {"view": view, "figures": figures, "metrics": regression.METRICS, "report": report}
    return render(request, "series.html", context, settings=settings)


@router.post("/series/{series_id}/alerts/{verdict_id}/dismiss")
def dismiss(
    request: Request,
    series_id: str,
    verdict_id: RowId,
    session: SessionDep,
    settings: SettingsDep,
    principal: SeriesEditorDep,
    form: CheckedFormDep,
) -> RedirectResponse:
    """Mark an alert a false positive from the history page."""
    try:
        series_service.dismiss_alert(
            session=session, series_id=series_id, verdict_id=verdict_id, principal=principal, note=str(form.get("note") or "") or None
        )
    except SeriesConfigError as exc:
        raise HTTPException(409, detail=str(exc)) from None
    session.commit()
    return RedirectResponse(f"/series/{series_id}#alerts", status_code=303)
