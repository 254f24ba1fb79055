"""The comparison page and its JSON/CSV exports: runs side by side, relative to a baseline."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response

from backend.api.deps import SessionDep, SettingsDep
from backend.api.pages.rendering import csv_response, render
from backend.figures import compare as compare_figs
from backend.services import compare as compare_service
from backend.services.memory_answer import memory_answer

router = APIRouter(include_in_schema=False)

IdsParam = Annotated[list[str], Query(description="Run ids; repeat or comma-separate.", max_length=compare_service.MAX_COMPARE)]


@router.get("/compare", response_class=HTMLResponse)
def compare_page(
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    ids: IdsParam = [],  # noqa: B006
    baseline: str | None = None,
    group: str | None = None,
) -> HTMLResponse:
    where = {d: request.query_params.get(d, "") for d in compare_service.FILTER_DIMENSIONS}
    comparison = compare_service.compare(
        session=session, run_ids=compare_service.parse_ids(ids), baseline_id=baseline, group_by=group, where=where
    )
    labelled = [(r.label, r.document) for r in comparison.runs if r.document]
    answer = memory_answer(labelled)
    figures = compare_figs.compare_figures(labelled) if labelled else {}
    query = "&".join(f"ids={r.id}" for r in comparison.runs)
    return render(
        request,
        "compare.html",
        {
            "cmp": comparison,
            "figures": figures,
            "ids_query": query,
            "where": where,
            "dimensions": compare_service.FILTER_DIMENSIONS,
            "memory_answer": answer,
        },
        settings=settings,
    )


@router.get("/compare.json")
def compare_json(session: SessionDep, ids: IdsParam = [], baseline: str | None = None) -> JSONResponse:  # noqa: B006
    comparison = compare_service.compare(session=session, run_ids=compare_service.parse_ids(ids), baseline_id=baseline)
    return JSONResponse(
        compare_service.comparison_json(comparison), headers={"Content-Disposition": 'attachment; filename="parallab-compare.json"'}
    )


@router.get("/compare.csv")
def compare_csv(session: SessionDep, ids: IdsParam = [], baseline: str | None = None) -> Response:  # noqa: B006
    comparison = compare_service.compare(session=session, run_ids=compare_service.parse_ids(ids), baseline_id=baseline)
    return csv_response(compare_service.comparison_table(comparison), "parallab-compare.csv")
