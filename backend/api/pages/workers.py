"""The /workers page: each pool, its hosts, which are alive, what each runs now, its queue length;
and the declared pools of every scheduler's kind in the registry (Slurm's, Ray's, …), with their settings."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from backend.api.deps import SessionDep, SettingsDep
from backend.api.pages.rendering import render
from backend.queue import queue_lengths
from backend.services import pools as declared
from backend.services import workers as fleet

router = APIRouter(include_in_schema=False)


@router.get("/workers", response_class=HTMLResponse)
def workers_page(request: Request, session: SessionDep, settings: SettingsDep) -> HTMLResponse:
    fleet.reconcile_lost_runs(session=session, settings=settings)
    session.commit()
    pools = fleet.fleet(session=session, settings=settings, queue_lengths=lambda names: queue_lengths(settings, names))
    scheduled = declared.scheduled_pools_by_kind(session=session)
    return render(
        request, "workers.html", {"pools": pools, "scheduled": scheduled, "ttl_s": settings.worker.worker_ttl_s}, settings=settings
    )
