"""The leaderboard page and its CSV/JSON exports, filtered by the same parser as `GET /api/v1/leaderboard`."""

from __future__ import annotations

import json

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response

from backend.api.deps import SessionDep, SettingsDep
from backend.api.pages.rendering import csv_response, render
from backend.api.queries import LeaderboardDep
from backend.services import leaderboard as leaderboard_service

router = APIRouter(include_in_schema=False)


@router.get("/leaderboard", response_class=HTMLResponse)
def leaderboard(request: Request, session: SessionDep, settings: SettingsDep, board: LeaderboardDep) -> HTMLResponse:
    options = leaderboard_service.filter_options(session=session)
    params = {k: v for k, v in request.query_params.items() if k not in ("offset", "cursor")}
    return render(request, "leaderboard.html", {"board": board, "options": options, "params": params}, settings=settings)


@router.get("/leaderboard.json")
def leaderboard_json(board: LeaderboardDep) -> JSONResponse:
    rows = leaderboard_service.export_rows(board)
    return JSONResponse(
        json.loads(json.dumps({"items": rows, "total": board.total}, default=str)),
        headers={"Content-Disposition": 'attachment; filename="parallab-leaderboard.json"'},
    )


@router.get("/leaderboard.csv")
def leaderboard_csv(board: LeaderboardDep) -> Response:
    return csv_response(leaderboard_service.csv_rows(board), "parallab-leaderboard.csv")
