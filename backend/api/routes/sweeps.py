"""REST: sweeps — plan a workload's configurations, run the best predicted and a few controls, and
hold the measurement against the prediction."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, status

from backend.api.deps import CancellerDep, LocalModeDep, SessionDep, SettingsDep, SubmitterDep
from backend.api.queries import SweepListParams
from backend.services import sweeps as sweep_service
from backend.services.sweeps import SweepNotFound, SweepRequest

router = APIRouter(prefix="/sweeps", tags=["sweeps"])


def _view(session: Any, sweep_id: str, settings: Any) -> dict[str, Any]:
    try:
        return sweep_service.sweep_view(session=session, sweep_id=sweep_id, settings=settings).as_dict()
    except SweepNotFound:
        raise HTTPException(404, detail=f"no sweep {sweep_id!r}") from None


@router.post("", status_code=status.HTTP_202_ACCEPTED)
def create_sweep(
    request: SweepRequest, session: SessionDep, settings: SettingsDep, principal: SubmitterDep, local: LocalModeDep
) -> dict[str, Any]:
    """Plan every configuration of the workload on the pool, queue the `top` best predicted and
    `controls` predicted to be poor, grouped as one sweep (422 naming the field when none fits)."""
    sweep = sweep_service.create_sweep(
        session=session, settings=settings, request=request, source="api", user_id=principal.user_id, local=local
    )
    return _view(session, sweep.id, settings)


@router.get("")
def list_sweeps(session: SessionDep, params: Annotated[SweepListParams, Query()]) -> dict[str, Any]:
    """Sweeps, newest first; an unknown parameter is refused (422)."""
    items = sweep_service.list_sweeps(session=session, limit=params.limit)
    return {
        "items": [
            {
                "id": s.id,
                "name": s.name,
                "status": s.status,
                "model": s.model,
                "world_size": s.world_size,
                "created_at": s.created_at.isoformat(),
            }
            for s in items
        ],
        "limit": params.limit,
    }


@router.get("/{sweep_id}")
def read_sweep(sweep_id: str, session: SessionDep, settings: SettingsDep) -> dict[str, Any]:
    """The sweep: each candidate's prediction beside its run's measurement, Spearman's ρ, the best
    found, and where its pool's calibration stands (`calibration`: "calibrating first" while the
    calibrate run it queued is pending, its predictions re-made on the calibration once it lands)."""
    return _view(session, sweep_id, settings)


@router.post("/{sweep_id}/cancel")
def cancel_sweep(sweep_id: str, session: SessionDep, settings: SettingsDep, principal: CancellerDep) -> dict[str, Any]:
    """Cancel every run of the sweep that has not finished (a member only a sweep of their own runs)."""
    try:
        sweep_service.cancel_sweep(session=session, sweep_id=sweep_id, principal=principal)
    except SweepNotFound:
        raise HTTPException(404, detail=f"no sweep {sweep_id!r}") from None
    return _view(session, sweep_id, settings)
