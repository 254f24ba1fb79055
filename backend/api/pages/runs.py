"""Pages of runs: the index, the job form (and its live check), a run's page, its live status, cancel.

Routes are sync (FastAPI runs them in its thread pool): the forms are read by an async
dependency first, so no database work ever blocks the event loop.
"""

from __future__ import annotations

import contextlib
import json
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from backend.api import csrf
from backend.api.deps import CancellerDep, LocalModeDep, SessionDep, SettingsDep, SubmitterDep, local_mode
from backend.api.formatting import fmt_when
from backend.api.pages.forms import CheckedFormDep, FormDep
from backend.api.pages.rendering import render, render_error
from backend.api.queries import RunFilters
from backend.config import Settings
from backend.figures import live as live_figs
from backend.figures import memory as memory_figs
from backend.figures import run as run_figs
from backend.models import FINISHED_STATUSES
from backend.services import auth as auth_service
from backend.services import pools, run_form
from backend.services import reproduce as reproduce_service
from backend.services import runs as run_service
from backend.services import timeline as timeline_service
from backend.services.auth import ANONYMOUS
from backend.services.quotas import QuotaExceeded
from backend.services.recipes import dimension_choices
from backend.services.redact import error_for, progress_for
from backend.services.run_view import UNCALIBRATED_NOTE, run_view
from backend.services.runs import QueueUnavailable, RunNotFound, RunStateError
from parallab.core.problems import SpecError
from parallab.core.strategies import STRATEGY_NAMES

router = APIRouter(include_in_schema=False)


@router.get("/", response_class=HTMLResponse)
def index(request: Request, session: SessionDep, settings: SettingsDep, params: Annotated[RunFilters, Query()]) -> HTMLResponse:
    status, strategy, user = params.status, params.strategy, params.user
    filters = {"status": status, "strategy": strategy, "user_id": auth_service.user_filter(session=session, email=user)}
    filters.update(tag=params.tag, search=params.q, straggler=params.straggler)
    try:
        runs, next_cursor = run_service.list_runs(session=session, limit=100, cursor=params.cursor, filters=filters)
    except ValueError as exc:  # a cursor this server did not hand out
        return render_error(request, 422, "Bad page link", str(exc), settings=settings)
    return render(
        request,
        "index.html",
        {
            "runs": runs,
            "next_cursor": next_cursor,
            "status": status or "",
            "strategy": strategy or "",
            "strategies": STRATEGY_NAMES,
            "user": user or "",
            "users": [u.email for u in auth_service.list_users(session=session)],
            "tag": params.tag or "",
            "straggler": "" if params.straggler is None else ("true" if params.straggler else "false"),
            "q": params.q or "",
            "tags": run_service.known_tags(session=session),
            "run_tags": run_service.tags_of(session=session, run_ids=[r.id for r in runs]),
        },
        settings=settings,
    )


def form_page(
    request: Request,
    settings: Settings,
    values: dict[str, Any],
    errors: dict[str, list[str]],
    status_code: int = 200,
    pools: list[run_form.PoolChoice] | None = None,
) -> HTMLResponse:
    """The job form, with what the user typed and the errors beside their fields."""
    return render(
        request,
        "run_new.html",
        {
            "values": values,
            "errors": errors,
            "presets": run_form.preset_table(),
            "strategies": list(STRATEGY_NAMES),
            "titles": run_form.strategy_titles(),
            "options": run_form.option_fields(),
            "choices": run_form.choice_values(),
            "inputs": run_form.workload_inputs(),
            "job_fields": run_form.JOB_FIELDS,
            "shape_fields": run_form.SHAPE_FIELDS,
            "recipe_fields": [*run_form.RECIPE_FIELDS, *run_form.CHOICE_FIELDS],
            "local_mode": local_mode(request),
            "can_submit": getattr(request.state, "principal", ANONYMOUS).may("submit"),
            "max_world_size": settings.limits.max_world_size,
            "trace_help": run_form.TRACE_HELP,
            "hf_config_help": run_form.HF_CONFIG_HELP,
            "repeats_help": run_form.REPEATS_HELP,
            "pools": pools or [],
        },
        status_code=status_code,
        settings=settings,
    )


@router.get("/runs/new", response_class=HTMLResponse)
def new_run(
    request: Request, session: SessionDep, settings: SettingsDep, from_: Annotated[str | None, Query(alias="from")] = None
) -> HTMLResponse:
    values = run_form.default_values()
    if from_:
        again = run_service.get_run(session=session, run_id=from_)
        values = run_form.spec_to_values(again.spec, name=again.name)
    return form_page(request, settings, values, {}, pools=run_form.pool_choices(session=session, settings=settings))


@router.post("/runs/new", response_class=HTMLResponse)
def submit_run(
    request: Request, form: FormDep, session: SessionDep, settings: SettingsDep, principal: SubmitterDep, local: LocalModeDep
) -> Response:
    values = run_form.form_values(form)
    try:
        csrf.verify(request, form.get(csrf.FIELD), settings.security.secret_key)  # type: ignore[arg-type]
    except csrf.CSRFError as exc:
        return form_page(request, settings, values, {"__all__": [str(exc)]}, status_code=403)
    check = run_form.check_form(form=form, settings=settings, local=local, session=session)
    if not check.ok or check.spec is None:
        pools = run_form.pool_choices(session=session, settings=settings)
        return form_page(request, settings, values, check.errors, status_code=422, pools=pools)
    try:
        runs = run_service.submit_runs(
            session=session, settings=settings, spec=check.spec, source="form", user_id=principal.user_id, local=local, job=check.job
        )
    except SpecError as exc:  # what only the submit could see (a pool that changed since the check)
        pools = run_form.pool_choices(session=session, settings=settings)
        errors = run_form.spec_errors(exc, str(form.get("strategy") or ""))
        return form_page(request, settings, values, errors, status_code=422, pools=pools)
    except QueueUnavailable as exc:
        return form_page(request, settings, values, {"__all__": [str(exc)]}, status_code=503)
    except QuotaExceeded as exc:
        return form_page(request, settings, values, {"__all__": [str(exc)]}, status_code=429)
    if len(runs) > 1:  # a repeat group: its runs side by side, the verdict on top
        return RedirectResponse(f"/compare?ids={','.join(r.id for r in runs)}", status_code=303)
    return RedirectResponse(f"/runs/{runs[0].id}", status_code=303)


@router.get("/runs/new/plan.json")
def plan_json(request: Request, session: SessionDep, settings: SettingsDep, local: LocalModeDep) -> dict[str, Any]:
    """The form's live check: errors by field, the prediction, and whether it fits this host and a live pool."""
    check = run_form.check_form(form=request.query_params, settings=settings, local=local, session=session)
    body = {"ok": check.ok, "errors": check.errors, "prediction": check.prediction, "fit": check.fit}
    return {**body, "name": check.name, "shape": check.shape}


@router.get("/runs/{run_id}", response_class=HTMLResponse)
def run_page(request: Request, run_id: str, session: SessionDep, settings: SettingsDep) -> HTMLResponse:
    try:
        view = run_view(session=session, run_id=run_id)
    except RunNotFound:
        return render_error(request, 404, "No such run", f"There is no run {run_id!r}.", settings=settings)
    viewer = getattr(request.state, "principal", ANONYMOUS)
    figures = run_figs.run_figures(view.document) if view.document else {}
    if "timeline" in figures and not view.timeline_events:  # nothing to load: say so inline
        figures["timeline"] = run_figs.timeline({})
    return render(
        request,
        "run.html",
        {
            "run": view.run,
            "run_error": error_for(viewer, view.run.error),
            "flight_dumps": run_service.flight_recorder_dumps(session=session, run_id=view.run.id) if view.run.status == "failed" else None,
            "run_log": (progress_for(viewer, view.run.progress) or {}).get("log", ""),
            "doc": view.document,
            "figures": figures,
            "memory_gaps": memory_figs.prediction_gaps(view.document) if view.document else None,
            "memory_peaks": memory_figs.peak_tables(view.document) if view.document else [],
            "agreement": view.agreement,
            "volume": view.volume,
            "step_time": view.step_time,
            "uncalibrated_note": UNCALIBRATED_NOTE,
            "scheduler": pools.describe(view.scheduler) if view.scheduler else None,
            "layout": view.layout,
            "architecture": view.architecture,
            "noisy": view.noisy,
            "repeat": view.repeat,
            "finished": view.run.status in FINISHED_STATUSES,
            "phase_names": live_figs.PHASE_NAMES,
            "trace_ranks": view.trace_ranks,
            "timeline_events": view.timeline_events,
            "reproduction": reproduce_service.reproduction_of(session=session, run=view.run),
            "can_submit": viewer.may("submit"),
            "run_tags": run_service.tags_of(session=session, run_ids=[view.run.id]).get(view.run.id, []),
            "may_tag": run_service.may_change(principal=viewer, run=view.run),
            "vary_choices": dimension_choices() if viewer.may("submit") and view.run.job is not None else {},
        },
        settings=settings,
    )


@router.get("/runs/{run_id}/timeline.json")
def run_timeline_figure(
    run_id: str, session: SessionDep, buckets: Annotated[int, Query(ge=100, le=10_000)] = timeline_service.DEFAULT_BUCKETS
) -> Response:
    """The run page's timeline figure (Plotly JSON), loaded after the page: downsampled to about
    `buckets` bars per lane (the chart's width), so the page stays small whatever the document holds."""
    timeline = timeline_service.run_timeline(session=session, run_id=run_id, buckets=buckets)
    fig = run_figs.timeline({"timeline": timeline.events, "timeline_total": timeline.total})
    return Response(content=fig.to_json(), media_type="application/json")


@router.get("/runs/{run_id}/status.json")
def run_status(request: Request, run_id: str, session: SessionDep) -> dict[str, Any]:
    """What the run page's live part polls: status, true timestamps, the phase, the live chart
    (Plotly JSON, built here like every figure) and the log's tail."""
    run = run_service.get_run(session=session, run_id=run_id)
    scheduled = pools.engine_job(session=session, run_id=run.id)
    viewer = getattr(request.state, "principal", ANONYMOUS)
    progress = dict(progress_for(viewer, run.progress) or {})
    history = progress.pop("history", None) or []
    return {
        "id": run.id,
        "status": run.status,
        "scheduler": pools.describe(scheduled) if scheduled else None,
        "started": fmt_when(run.started_at),
        "progress": progress,
        "phase_names": live_figs.PHASE_NAMES,
        "chart": json.loads(live_figs.live_figure(history).to_json()) if history else None,
        "error": error_for(viewer, run.error),
        "cancel_requested": run.cancel_requested,
        "finished": run.status in FINISHED_STATUSES,
    }


@router.get("/watch.json")
def watch(session: SessionDep, ids: Annotated[str, Query(description="Run ids, comma-separated.")] = "") -> dict[str, Any]:
    """What a page waiting for runs polls (frontend/static/watch.js): each run's status, one query."""
    wanted = [i for i in (x.strip() for x in ids.split(",")) if i]
    try:
        return run_service.watch_states(session=session, run_ids=wanted)
    except ValueError as exc:
        raise HTTPException(422, detail=[{"loc": ["query", "ids"], "msg": str(exc), "type": "value_error"}]) from None


@router.post("/runs/{run_id}/tags", response_model=None)
def edit_tags(
    request: Request, run_id: str, session: SessionDep, settings: SettingsDep, principal: CancellerDep, form: CheckedFormDep
) -> Response:
    """The run page's tag box: replace the run's tags (its owner or an admin, CSRF-checked)."""
    run_service.check_owner(principal=principal, run=run_service.get_run(session=session, run_id=run_id))
    try:
        run_service.set_run_tags(session=session, run_id=run_id, text=str(form.get("tags") or ""))
    except SpecError as exc:
        return render_error(request, 422, "Cannot set those tags", "; ".join(f"tags: {p.msg}" for p in exc.problems), settings=settings)
    return RedirectResponse(f"/runs/{run_id}#run-tags", status_code=303)


@router.post("/runs/{run_id}/cancel")
def cancel(
    request: Request, run_id: str, session: SessionDep, settings: SettingsDep, principal: CancellerDep, form: CheckedFormDep
) -> RedirectResponse:
    run_service.check_owner(principal=principal, run=run_service.get_run(session=session, run_id=run_id))
    with contextlib.suppress(RunStateError):  # already finished: the run page says so
        run_service.cancel_run(session=session, run_id=run_id, settings=settings)
    return RedirectResponse(f"/runs/{run_id}", status_code=303)


@router.post("/runs/{run_id}/reproduce", response_model=None)
def reproduce(
    request: Request,
    run_id: str,
    session: SessionDep,
    settings: SettingsDep,
    principal: SubmitterDep,
    local: LocalModeDep,
    form: CheckedFormDep,
) -> Response:
    """The upload page's Reproduce button: the lab re-runs the upload (`services.reproduce`), then its page."""
    try:
        run = reproduce_service.reproduce(
            session=session, settings=settings, upload_id=run_id, source="form", user_id=principal.user_id, local=local
        )
    except (reproduce_service.NotAnUpload, SpecError, QueueUnavailable, QuotaExceeded) as exc:
        code = next(code for kind, code in REPRODUCE_REFUSALS.items() if isinstance(exc, kind))
        return render_error(request, code, "Cannot reproduce", str(exc), settings=settings)
    return RedirectResponse(f"/runs/{run.id}", status_code=303)


REPRODUCE_REFUSALS: dict[type[Exception], int] = {
    reproduce_service.NotAnUpload: 409,
    SpecError: 422,
    QueueUnavailable: 503,
    QuotaExceeded: 429,
}
"""The status of each reason the Reproduce button can be refused."""
