"""REST: comparison of runs and the lab-wide leaderboard (the pages' data, for scripts)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Query

from backend.api.deps import SessionDep
from backend.services import compare as compare_service
from backend.services import leaderboard as leaderboard_service

router = APIRouter(tags=["analysis"])


@router.get("/compare")
def compare(
    session: SessionDep,
    ids: Annotated[list[str], Query(description="Run ids; repeat or comma-separate.")],
    baseline: str | None = None,
) -> dict[str, Any]:
    """Runs side by side: every metric, and each value relative to the baseline run."""
    run_ids = compare_service.parse_ids(ids)
    if not run_ids:
        raise HTTPException(422, detail=[{"loc": ["query", "ids"], "msg": "name at least one run", "type": "value_error"}])
    comparison = compare_service.compare(session=session, run_ids=run_ids, baseline_id=baseline)
    return compare_service.comparison_json(comparison)


@router.get("/leaderboard")
def leaderboard(
    session: SessionDep,
    model: str | None = None,
    hardware: str | None = None,
    strategy: str | None = None,
    world_size: Annotated[int | None, Query(ge=1)] = None,
    source: str | None = None,
    branch: str | None = None,
    runs: Literal["best", "all"] = "best",
    sort: str | None = None,
    dir: Literal["asc", "desc"] = "desc",
    limit: Annotated[int, Query(ge=1, le=leaderboard_service.MAX_PAGE)] = 50,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> dict[str, Any]:
    """Ranked within (workload, hardware) groups; runs that are not comparable are never ranked together."""
    query = leaderboard_service.LeaderboardQuery(
        model=model, hardware_key=hardware, strategy=strategy, world_size=world_size, source=source, branch=branch,
        best_only=runs == "best", sort=sort, descending=dir == "desc", limit=limit, offset=offset,
    )
    board = leaderboard_service.get_leaderboard(session=session, query=query)
    return {"items": leaderboard_service.export_rows(board), "total": board.total, "limit": limit, "offset": offset}
