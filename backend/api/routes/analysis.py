"""REST: comparison of runs and the lab-wide leaderboard (the pages' data, for scripts)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Response
from pydantic_core import to_json

from backend.api.deps import SessionDep
from backend.api.queries import LeaderboardDep
from backend.services import compare as compare_service
from backend.services import leaderboard as leaderboard_service

router = APIRouter(tags=["analysis"])


@router.get("/compare")
def compare(
    session: SessionDep,
    ids: Annotated[list[str], Query(description="Run ids; repeat or comma-separate.", max_length=compare_service.MAX_COMPARE)],
    baseline: str | None = None,
) -> dict[str, Any]:
    """Runs side by side: every metric, and each value relative to the baseline run."""
    run_ids = compare_service.parse_ids(ids)
    if not run_ids:
        raise HTTPException(422, detail=[{"loc": ["query", "ids"], "msg": "name at least one run", "type": "value_error"}])
    if len(run_ids) > compare_service.MAX_COMPARE:
        msg = f"{len(run_ids)} runs named; compare at most {compare_service.MAX_COMPARE}"
        raise HTTPException(422, detail=[{"loc": ["query", "ids"], "msg": msg, "type": "value_error"}])
    comparison = compare_service.compare(session=session, run_ids=run_ids, baseline_id=baseline)
    return compare_service.comparison_json(comparison)


@router.get("/leaderboard", response_model=dict[str, Any])
def leaderboard(board: LeaderboardDep) -> Response:
    """Ranked within (workload, hardware) groups; runs that are not comparable are never ranked together.
    Every run sorted by a column pages by `next_cursor` as deep as by `offset`, without its cost."""
    query = board.query
    items = leaderboard_service.export_rows(board)
    body = {"items": items, "total": board.total, "limit": query.limit, "offset": query.offset, "next_cursor": board.next_cursor}
    return Response(content=plain_json(body), media_type="application/json")


def plain_json(content: Any) -> bytes:
    """The route's dict as FastAPI writes a `dict[str, Any]` response (pydantic's JSON), without
    validating every value of every row against `Any` first."""
    return to_json(content)
