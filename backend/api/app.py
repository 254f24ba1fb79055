"""The FastAPI application: REST under /api/v1, HTML pages, plotly.js served locally."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI

from backend.api import pages
from backend.api.errors import install_error_handlers
from backend.api.pages.assets import static_files
from backend.api.routes import analysis, plan, results, runs, sweeps

API_PREFIX = "/api/v1"


def create_app() -> FastAPI:
    app = FastAPI(
        title="parallab",
        version="0.1.0",
        description="A lab bench for distributed-training parallelism: run, measure, predict and compare strategies.",
    )
    install_error_handlers(app)
    api = APIRouter(prefix=API_PREFIX)
    api.include_router(runs.router)
    api.include_router(results.router)
    api.include_router(plan.router)
    api.include_router(analysis.router)
    api.include_router(sweeps.router)
    app.include_router(api)

    @app.get("/healthz", tags=["health"])
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    app.mount("/static", static_files(), name="static")
    for router in pages.ROUTERS:
        app.include_router(router)
    return app


app = create_app()
