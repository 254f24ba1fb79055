"""`GET /metrics`: Prometheus' text format (outside /api/v1, where scrapers look)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse

from backend.api.deps import SessionDep, SettingsDep
from backend.queue import queue_lengths
from backend.services import metrics as metrics_service

router = APIRouter(tags=["health"])


@router.get("/metrics", response_class=PlainTextResponse)
def metrics(session: SessionDep, settings: SettingsDep) -> PlainTextResponse:
    """Queue length per pool, runs by status, workers alive, job durations, ingest latency, upload rejections."""
    text = metrics_service.render(session=session, settings=settings, queue_lengths=lambda pools: queue_lengths(settings, pools))
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")
