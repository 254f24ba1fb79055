"""REST: the prediction for a spec, before anything runs (what `parallab plan` prints)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from backend.schemas.plan import PlanQuery
from backend.services import plan as plan_service

router = APIRouter(tags=["plan"])


@router.get("/plan")
def plan(query: Annotated[PlanQuery, Query()]) -> dict[str, Any]:
    """Predicted model state per rank, communication per step and bubble, for any world size.

    Every workload field and every strategy option is a parameter of the same name; an option the
    chosen strategy does not have is refused (422), as in a job spec.
    """
    return plan_service.plan(spec=query.to_spec())
