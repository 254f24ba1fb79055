"""The HTML pages: index, the job form, a run (live), compare, leaderboard, scaling, and exports.

Routes stay thin: parse, call one service, render a template from frontend/templates. Figures are
built by backend.figures (pure) and drawn by the plotly.js that the installed plotly package ships.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Annotated, Any

import plotly
import plotly.graph_objects as go
from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from starlette.concurrency import run_in_threadpool
from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape
from markupsafe import Markup

import frontend
from backend.api import csrf, formatting
from backend.api.deps import SessionDep, SettingsDep
from backend.api.routes.runs import submit
from backend.figures import compare as compare_figs
from backend.figures import run as run_figs
from backend.figures import scaling as scaling_figs
from backend.models import FINISHED_STATUSES
from backend.schemas.spec import STRATEGIES
from backend.services import compare as compare_service
from backend.services import leaderboard as leaderboard_service
from backend.services import run_form
from backend.services import runs as run_service
from backend.services.run_view import run_view
from backend.services.runs import RunNotFound, RunStateError

FRONTEND = Path(frontend.__file__).parent
PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"


def figure_json(fig: go.Figure) -> Markup:
    """A figure as JSON that is safe inside <script type="application/json"> (no '<', '>', '&')."""
    text = fig.to_json().replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return Markup(text)


def _environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(FRONTEND / "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(formatting.FILTERS)
    env.globals["figure_json"] = figure_json
    return env


templates = Jinja2Templates(env=_environment())


def _render(request: Request, name: str, context: dict[str, Any], *, status_code: int = 200, settings=None) -> HTMLResponse:
    """Render a page; every page gets a CSRF token (and its cookie) for the forms it may carry."""
    secret = settings.secret_key if settings is not None else ""
    nonce, token = csrf.issue(request, secret) if secret else ("", "")
    response = templates.TemplateResponse(request, name, {"csrf_token": token, "page": name.removesuffix(".html"), **context},
                                          status_code=status_code)
    if nonce and request.cookies.get(csrf.COOKIE) != nonce:
        csrf.set_cookie(response, nonce, secure=request.url.scheme == "https")
    return response


def _host_memory(settings) -> int | None:
    """This host's memory, when the ranks run here (local mode)."""
    if not settings.local_mode:
        return None
    import psutil

    return int(psutil.virtual_memory().total)


def _csv(rows: list[list[Any]], filename: str) -> Response:
    buf = io.StringIO()
    writer = csv.writer(buf)
    for row in rows:
        writer.writerow(["" if v is None else v for v in row])
    return Response(buf.getvalue(), media_type="text/csv; charset=utf-8", headers={"Content-Disposition": f'attachment; filename="{filename}"'})


def _leaderboard_query(request: Request) -> leaderboard_service.LeaderboardQuery:
    q = request.query_params

    def text(name: str) -> str | None:
        return (q.get(name) or "").strip() or None

    def integer(name: str, default: int | None) -> int | None:
        try:
            return int(q[name]) if q.get(name) else default
        except ValueError:
            raise HTTPException(422, detail=f"{name} must be a whole number") from None

    return leaderboard_service.LeaderboardQuery(
        model=text("model"), hardware_key=text("hardware"), strategy=text("strategy"), world_size=integer("world_size", None),
        source=text("source"), branch=text("branch"), best_only=q.get("runs", "best") != "all", sort=text("sort"),
        descending=q.get("dir", "desc") != "asc", limit=integer("limit", 50) or 50, offset=integer("offset", 0) or 0,
    )


def install(app: FastAPI) -> None:
    """Mount the static files, plotly.js and every page on `app`."""
    app.mount("/static", StaticFiles(directory=FRONTEND / "static"), name="static")

    @app.get("/vendor/plotly.min.js", include_in_schema=False)
    def plotly_js() -> FileResponse:
        return FileResponse(PLOTLY_JS, media_type="text/javascript", headers={"Cache-Control": "public, max-age=86400"})

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def index(request: Request, session: SessionDep, settings: SettingsDep, status: str | None = None, strategy: str | None = None):
        runs, next_cursor = run_service.list_runs(session=session, limit=100, cursor=request.query_params.get("cursor"),
                                                  filters={"status": status or None, "strategy": strategy or None})
        return _render(request, "index.html", {"runs": runs, "next_cursor": next_cursor, "status": status or "",
                                                "strategy": strategy or "", "strategies": STRATEGIES}, settings=settings)

    def form_page(request: Request, settings, values: dict[str, Any], errors: dict[str, list[str]], status_code: int = 200):
        return _render(request, "run_new.html", {
            "values": values, "errors": errors, "presets": run_form.preset_table(), "strategies": [s for s in STRATEGIES],
            "options": run_form.option_fields(), "choices": run_form.choice_values(), "shape_fields": run_form.SHAPE_FIELDS,
            "local_mode": settings.local_mode, "max_world_size": settings.max_world_size,
        }, status_code=status_code, settings=settings)

    @app.get("/runs/new", response_class=HTMLResponse, include_in_schema=False)
    def new_run(request: Request, session: SessionDep, settings: SettingsDep, from_: Annotated[str | None, Query(alias="from")] = None):
        values = run_form.default_values()
        if from_:
            values = run_form.spec_to_values(run_service.get_run(session=session, run_id=from_).spec)
        return form_page(request, settings, values, {})

    @app.post("/runs/new", response_class=HTMLResponse, include_in_schema=False)
    async def submit_run(request: Request, session: SessionDep, settings: SettingsDep):
        form = await request.form()
        values = run_form.form_values(form)
        try:
            csrf.verify(request, form.get(csrf.FIELD), settings.secret_key)  # type: ignore[arg-type]
        except csrf.CSRFError as exc:
            return form_page(request, settings, values, {"__all__": [str(exc)]}, status_code=403)
        if not settings.local_mode:
            return form_page(request, settings, values, {"__all__": ["this server is not in local mode: submit through the API with a token"]},
                             status_code=403)
        check = await run_in_threadpool(run_form.check_form, form=form, settings=settings, host_memory_bytes=_host_memory(settings))
        if not check.ok or check.spec is None:
            return form_page(request, settings, values, check.errors, status_code=422)
        try:
            run = await run_in_threadpool(submit, session=session, settings=settings, spec=check.spec, source="form")
        except HTTPException as exc:
            return form_page(request, settings, values, {"__all__": [str(exc.detail)]}, status_code=exc.status_code)
        return RedirectResponse(f"/runs/{run.id}", status_code=303)

    @app.get("/runs/new/plan.json", include_in_schema=False)
    def plan_json(request: Request, settings: SettingsDep) -> dict[str, Any]:
        """The form's live check: errors by field, the prediction, and whether it fits this host."""
        check = run_form.check_form(form=request.query_params, settings=settings, host_memory_bytes=_host_memory(settings))
        return {"ok": check.ok, "errors": check.errors, "prediction": check.prediction, "fit": check.fit}

    @app.get("/runs/{run_id}", response_class=HTMLResponse, include_in_schema=False)
    def run_page(request: Request, run_id: str, session: SessionDep, settings: SettingsDep):
        try:
            view = run_view(session=session, run_id=run_id)
        except RunNotFound:
            return _render(request, "error.html", {"title": "No such run", "message": f"There is no run {run_id!r}."},
                           status_code=404, settings=settings)
        figures = run_figs.run_figures(view.document) if view.document else {}
        return _render(request, "run.html", {"run": view.run, "doc": view.document, "figures": figures, "agreement": view.agreement,
                                              "finished": view.run.status in FINISHED_STATUSES, "trace_ranks": view.trace_ranks},
                       settings=settings)

    @app.get("/runs/{run_id}/status.json", include_in_schema=False)
    def run_status(run_id: str, session: SessionDep) -> dict[str, Any]:
        run = _get_run(session, run_id)
        return {"id": run.id, "status": run.status, "progress": run.progress, "error": run.error,
                "cancel_requested": run.cancel_requested, "finished": run.status in FINISHED_STATUSES}

    @app.post("/runs/{run_id}/cancel", include_in_schema=False)
    async def cancel(request: Request, run_id: str, session: SessionDep, settings: SettingsDep):
        form = await request.form()
        try:
            csrf.verify(request, form.get(csrf.FIELD), settings.secret_key)  # type: ignore[arg-type]
        except csrf.CSRFError as exc:
            raise HTTPException(403, detail=str(exc)) from None
        if not settings.local_mode:
            raise HTTPException(403, detail="this server is not in local mode: cancel through the API with a token")
        try:
            run_service.cancel_run(session=session, run_id=run_id)
            session.commit()
        except RunNotFound:
            raise HTTPException(404, detail=f"no run {run_id!r}") from None
        except RunStateError:
            pass  # already finished: the run page says so
        return RedirectResponse(f"/runs/{run_id}", status_code=303)

    @app.get("/compare", response_class=HTMLResponse, include_in_schema=False)
    def compare_page(request: Request, session: SessionDep, settings: SettingsDep, ids: Annotated[list[str], Query()] = [],  # noqa: B006
                     baseline: str | None = None):
        comparison = compare_service.compare(session=session, run_ids=compare_service.parse_ids(ids), baseline_id=baseline)
        labelled = [(r.label, r.document) for r in comparison.runs if r.document]
        figures = compare_figs.compare_figures(labelled) if labelled else {}
        query = "&".join(f"ids={r.id}" for r in comparison.runs)
        return _render(request, "compare.html", {"cmp": comparison, "figures": figures, "ids_query": query}, settings=settings)

    @app.get("/compare.json", include_in_schema=False)
    def compare_json(session: SessionDep, ids: Annotated[list[str], Query()] = [], baseline: str | None = None):  # noqa: B006
        comparison = compare_service.compare(session=session, run_ids=compare_service.parse_ids(ids), baseline_id=baseline)
        return JSONResponse(compare_service.comparison_json(comparison), headers={"Content-Disposition": 'attachment; filename="parallab-compare.json"'})

    @app.get("/compare.csv", include_in_schema=False)
    def compare_csv(session: SessionDep, ids: Annotated[list[str], Query()] = [], baseline: str | None = None):  # noqa: B006
        comparison = compare_service.compare(session=session, run_ids=compare_service.parse_ids(ids), baseline_id=baseline)
        return _csv(compare_service.comparison_table(comparison), "parallab-compare.csv")

    @app.get("/leaderboard", response_class=HTMLResponse, include_in_schema=False)
    def leaderboard(request: Request, session: SessionDep, settings: SettingsDep):
        query = _leaderboard_query(request)
        board = leaderboard_service.get_leaderboard(session=session, query=query)
        options = leaderboard_service.filter_options(session=session)
        params = {k: v for k, v in request.query_params.items() if k not in ("offset",)}
        return _render(request, "leaderboard.html", {"board": board, "options": options, "params": params}, settings=settings)

    @app.get("/leaderboard.json", include_in_schema=False)
    def leaderboard_json(request: Request, session: SessionDep):
        board = leaderboard_service.get_leaderboard(session=session, query=_leaderboard_query(request))
        rows = leaderboard_service.export_rows(board)
        return JSONResponse(json.loads(json.dumps({"items": rows, "total": board.total}, default=str)),
                            headers={"Content-Disposition": 'attachment; filename="parallab-leaderboard.json"'})

    @app.get("/leaderboard.csv", include_in_schema=False)
    def leaderboard_csv(request: Request, session: SessionDep):
        board = leaderboard_service.get_leaderboard(session=session, query=_leaderboard_query(request))
        fields = leaderboard_service.EXPORT_FIELDS
        return _csv([list(fields), *([row[k] for k in fields] for row in leaderboard_service.export_rows(board))], "parallab-leaderboard.csv")

    @app.get("/scaling", response_class=HTMLResponse, include_in_schema=False)
    def scaling(request: Request, session: SessionDep, settings: SettingsDep, workload: str | None = None, hardware: str | None = None):
        result = leaderboard_service.get_scaling(session=session, workload_key=workload, hardware_key=hardware)
        figures = {"throughput": scaling_figs.throughput(result.points), "efficiency": scaling_figs.efficiency(result.points)}
        return _render(request, "scaling.html", {"scaling": result, "figures": figures}, settings=settings)


def _get_run(session, run_id: str):
    try:
        return run_service.get_run(session=session, run_id=run_id)
    except RunNotFound:
        raise HTTPException(404, detail=f"no run {run_id!r}") from None

