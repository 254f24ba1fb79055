"""Pages of the planner: the ranking form (`/plan`), sweeps (`/sweeps`, `/sweeps/new`,
`/sweeps/{id}`, cancel) and a run page's "vary one thing" (`POST /runs/{id}/vary`).

Routes stay thin: parse, call one service, render or redirect; forms are the API's, so a form
refuses exactly what the API refuses.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from pydantic import ValidationError

from backend.api import csrf
from backend.api.deps import CancellerDep, SessionDep, SettingsDep, SubmitterDep, local_mode
from backend.api.pages.forms import CheckedFormDep, FormDep
from backend.api.pages.rendering import render, render_error
from backend.config import Settings
from backend.figures import sweeps as sweep_figs
from backend.services import plan as plan_service
from backend.services import sweep_examples
from backend.services import sweeps as sweep_service
from backend.services import vary as vary_service
from backend.services.auth import ANONYMOUS
from backend.services.hardware import UnknownDevice, calibration_advice, catalogue
from backend.services.quotas import QuotaExceeded
from backend.services.runs import QueueUnavailable, RunNotFound
from backend.services.sweeps import SweepNotFound, SweepRequest
from parallab.core.activations import SELECTIVE_POLICIES
from parallab.core.layout_families import NEAR_IDENTICAL, fold_by_family
from parallab.core.model import PRESETS
from parallab.core.problems import RecipeError, SpecError
from parallab.core.ranking import rejected_by_reason
from parallab.core.run_recipe import RunRecipe

router = APIRouter(include_in_schema=False)


# ---- /plan: the ranking ----

VARIANTS_SHOWN = 20
"""Variants listed under a family's best on the page; the rest are counted (the full table has them)."""


@router.get("/plan", response_class=HTMLResponse)
def plan_page(
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    model: str = "llama-8b",
    device: str = "h100",
    nodes: int = 2,
    gpus_per_node: int = 8,
    global_batch_size: str = "",
    top: int = 25,
    loss_parallel: bool = False,
    compiled_loss: bool = False,
    selective_policy: Annotated[str, Query(max_length=32)] = "every_matmul",
) -> HTMLResponse:
    values = {
        "model": model,
        "device": device,
        "nodes": nodes,
        "gpus_per_node": gpus_per_node,
        "global_batch_size": global_batch_size,
        "top": top,
    }
    recipe_values = {"loss_parallel": loss_parallel, "compiled_loss": compiled_loss, "selective_policy": selective_policy}
    error, ranking, advice = None, None, None
    try:
        recipe = RunRecipe(loss_parallel=loss_parallel, compiled_loss=compiled_loss, selective_policy=selective_policy)
    except RecipeError as exc:
        error, recipe = f"{exc.field}: {exc.problem}", None
    workload: dict[str, Any] = {"model": model}
    if global_batch_size.strip():
        workload["global_batch_size"] = global_batch_size.strip()
    if model not in PRESETS:
        error = f"model: unknown preset {model!r}; known: {', '.join(PRESETS)}"
    elif recipe is not None:
        try:
            hw = plan_service.ranking_hardware(
                session=session,
                settings=settings,
                device=None if device == "pool" else device,
                pool=None,
                nodes=max(nodes, 1),
                gpus_per_node=max(gpus_per_node, 1),
            )
            ranking = plan_service.rank(workload=workload, hw=hw, recipe=recipe)
            if device == "pool":
                advice = calibration_advice(session=session, settings=settings)
            else:
                values["device"] = hw.spec.key  # an alias (h100) shows, and re-ranks, as the entry it named (h100-sxm)
        except UnknownDevice as exc:
            error = f"device: {exc}"
    devices = [d.key for d in catalogue(settings).devices] + ["pool"]
    return render(
        request,
        "plan.html",
        {
            "values": values,
            "recipe": recipe_values,
            "recipe_query": {k: "true" if v is True else v for k, v in recipe_values.items() if v and v != "every_matmul"},
            "policies": SELECTIVE_POLICIES,
            "error": error,
            "advice": advice,
            "ranking": ranking,
            "rejected": rejected_by_reason(ranking.rejected) if ranking else [],
            "invalid": rejected_by_reason(ranking.invalid) if ranking else [],
            "closest": ranking.closest() if ranking and not ranking.fits else None,
            "folds": fold_by_family(ranking.fits) if ranking else [],
            "near_identical": NEAR_IDENTICAL,
            "variants_shown": VARIANTS_SHOWN,
            "presets": list(PRESETS),
            "devices": devices,
            "top": max(1, min(top, 500)),
        },
        settings=settings,
    )


# ---- sweeps ----


@router.get("/sweeps", response_class=HTMLResponse)
def sweeps_page(request: Request, session: SessionDep, settings: SettingsDep) -> HTMLResponse:
    return render(request, "sweeps.html", {"sweeps": sweep_service.list_sweeps(session=session)}, settings=settings)


def _sweep_form(
    request: Request,
    settings: Settings,
    values: dict[str, Any],
    errors: list[str],
    status_code: int = 200,
    example: sweep_examples.SweepExample | None = None,
) -> HTMLResponse:
    return render(
        request,
        "sweep_new.html",
        {
            "values": values,
            "errors": errors,
            "example": example,
            "measured": sweep_examples.measured_rows(example.measured) if example and example.measured else [],
            "examples": list(sweep_examples.EXAMPLES.values()),
            "presets": list(PRESETS),
            "max_world_size": settings.limits.max_world_size,
            "can_submit": getattr(request.state, "principal", ANONYMOUS).may("submit"),
        },
        settings=settings,
        status_code=status_code,
    )


SWEEP_DEFAULTS: dict[str, Any] = {
    "model": "small",
    "world_size": "4",
    "top": "8",
    "controls": "2",
    "steps": "",
    "precisions": ["fp32", "bf16"],
    "checkpointing": ["none", "selective", "full"],
    "accumulation": ["1", "2"],
}


@router.get("/sweeps/new", response_class=HTMLResponse)
def new_sweep(request: Request, settings: SettingsDep, example: str | None = None) -> HTMLResponse:
    """The form; `?example=KEY` fills it with that example sweep and shows its lesson."""
    chosen = sweep_examples.example(example)
    if example and chosen is None:
        known = ", ".join(sweep_examples.EXAMPLES)
        return _sweep_form(request, settings, dict(SWEEP_DEFAULTS), [f"example: no example {example!r}; known: {known}"], 404)
    return _sweep_form(request, settings, dict(chosen.values if chosen else SWEEP_DEFAULTS), [], example=chosen)


def sweep_request(form: Any) -> dict[str, Any]:
    """The sweep form as a `SweepRequest` body (empty fields: the defaults)."""

    def get(name: str) -> str:
        value = form.get(name)
        return value.strip() if isinstance(value, str) else ""

    body: dict[str, Any] = {
        "workload": {"model": get("model") or "small"},
        "world_size": get("world_size") or "4",
        "top": get("top") or "8",
        "controls": get("controls") or "0",
        "precisions": form.getlist("precisions"),
        "checkpointing": form.getlist("checkpointing"),
        "accumulation": form.getlist("accumulation"),
    }
    for name in ("steps", "name", "repeats", "pool", "nodes"):
        if get(name):
            body[name] = get(name)
    if form.getlist("strategies"):
        body["strategies"] = form.getlist("strategies")
    if form.getlist("placements"):
        body["placements"] = form.getlist("placements")
    if get("global_batch_size"):
        body["workload"]["global_batch_size"] = get("global_batch_size")
    return body


@router.post("/sweeps/new", response_class=HTMLResponse)
def submit_sweep(request: Request, form: FormDep, session: SessionDep, settings: SettingsDep, principal: SubmitterDep) -> Response:
    values = {
        k: (form.getlist(k) if k in ("precisions", "checkpointing", "accumulation", "strategies", "placements") else form.get(k))
        for k in form
        if k != csrf.FIELD
    }
    try:
        csrf.verify(request, form.get(csrf.FIELD), settings.security.secret_key)  # type: ignore[arg-type]
    except csrf.CSRFError as exc:
        return _sweep_form(request, settings, values, [str(exc)], status_code=403)
    try:
        body = SweepRequest.model_validate(sweep_request(form))
        sweep = sweep_service.create_sweep(
            session=session, settings=settings, request=body, source="form", user_id=principal.user_id, local=local_mode(request)
        )
    except ValidationError as exc:
        return _sweep_form(request, settings, values, [f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()], 422)
    except SpecError as exc:
        return _sweep_form(request, settings, values, [str(p) for p in exc.problems], 422)
    except QuotaExceeded as exc:
        return _sweep_form(request, settings, values, [str(exc)], 429)
    return RedirectResponse(f"/sweeps/{sweep.id}", status_code=303)


@router.get("/sweeps/{sweep_id}", response_class=HTMLResponse)
def sweep_page(request: Request, sweep_id: str, session: SessionDep, settings: SettingsDep) -> HTMLResponse:
    try:
        view = sweep_service.sweep_view(session=session, sweep_id=sweep_id, settings=settings)
    except SweepNotFound:
        return render_error(request, 404, "No such sweep", f"There is no sweep {sweep_id!r}.", settings=settings)
    points = [
        {
            "label": p.candidate["label"],
            "role": p.candidate["role"],
            "status": p.status,
            "predicted_tokens_per_s": p.predicted_tokens_per_s,
            "measured_tokens_per_s": p.measured_tokens_per_s,
            "predicted_memory_bytes": p.predicted_memory_bytes,
            "measured_memory_bytes": p.measured_memory_bytes,
        }
        for p in view.points
    ]
    figures = sweep_figs.sweep_figures(points, spearman=view.spearman)
    ids = [r.id for p in view.points for r in p.runs if r.status == "succeeded"]
    cal = view.calibration
    waiting = [{"id": cal["run_id"], "label": "calibrate", "status": cal["run_status"]}] if cal.get("run_id") else []
    waiting += [
        {"id": r.id, "label": p.candidate["label"] + (f" #{i}" if len(p.runs) > 1 else ""), "status": r.status}
        for p in view.points
        for i, r in enumerate(p.runs, start=1)
    ]
    context = {"view": view, "figures": figures, "compare_ids": ",".join(ids), "waiting_runs": waiting}
    return render(request, "sweep.html", context, settings=settings)


@router.post("/sweeps/{sweep_id}/cancel")
def cancel_sweep(
    request: Request, sweep_id: str, session: SessionDep, settings: SettingsDep, principal: CancellerDep, form: CheckedFormDep
) -> RedirectResponse:
    try:
        sweep_service.cancel_sweep(session=session, sweep_id=sweep_id, principal=principal)
    except SweepNotFound:
        raise HTTPException(404, detail=f"no sweep {sweep_id!r}") from None
    return RedirectResponse(f"/sweeps/{sweep_id}", status_code=303)


# ---- a run's "vary one thing" ----


@router.post("/runs/{run_id}/vary")
def vary_run(
    request: Request, run_id: str, session: SessionDep, settings: SettingsDep, principal: SubmitterDep, form: CheckedFormDep
) -> Response:
    """Submit the run's job with one dimension changed, then open the comparison of the two."""
    field, value = str(form.get("field") or ""), str(form.get("value") or "")
    try:
        run = vary_service.vary_run(
            session=session,
            settings=settings,
            run_id=run_id,
            field=field,
            value=value,
            user_id=principal.user_id,
            local=local_mode(request),
        )
    except RunNotFound:
        raise HTTPException(404, detail=f"no run {run_id!r}") from None
    except (SpecError, ValidationError) as exc:
        message = "; ".join(str(p) for p in exc.problems) if isinstance(exc, SpecError) else str(exc)
        return render_error(request, 422, "Cannot vary that", message, settings=settings)
    except QueueUnavailable as exc:
        return render_error(request, 503, "Queue unavailable", str(exc), settings=settings)
    return RedirectResponse(f"/compare?ids={run_id},{run.id}&baseline={run_id}", status_code=303)
