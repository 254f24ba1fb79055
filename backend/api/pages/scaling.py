"""The scaling page: throughput against world size per strategy, beside the ideal line."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from backend.api.deps import SessionDep, SettingsDep
from backend.api.pages.rendering import render
from backend.figures import scaling as scaling_figs
from backend.services import leaderboard as leaderboard_service

router = APIRouter(include_in_schema=False)


@router.get("/scaling", response_class=HTMLResponse)
def scaling(
    request: Request, session: SessionDep, settings: SettingsDep, workload: str | None = None, hardware: str | None = None
) -> HTMLResponse:
    result = leaderboard_service.get_scaling(session=session, workload_key=workload, hardware_key=hardware)
    figures = {"throughput": scaling_figs.throughput(result.points), "efficiency": scaling_figs.efficiency(result.points)}
    return render(request, "scaling.html", {"scaling": result, "figures": figures}, settings=settings)
