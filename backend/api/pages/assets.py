"""Static files and the plotly.js that the installed plotly package ships (labs are often offline: no CDN)."""

from __future__ import annotations

from pathlib import Path

import plotly
from fastapi import APIRouter
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

from backend.api.pages.rendering import FRONTEND

PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"

router = APIRouter(include_in_schema=False)


def static_files() -> StaticFiles:
    """frontend/static, for the app to mount at /static."""
    return StaticFiles(directory=FRONTEND / "static")


@router.get("/vendor/plotly.min.js")
def plotly_js() -> FileResponse:
    return FileResponse(PLOTLY_JS, media_type="text/javascript", headers={"Cache-Control": "public, max-age=86400"})
