"""The FastAPI application: REST under /api/v1, HTML pages, plotly.js served locally."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import APIRouter, Depends, FastAPI

from backend.api import pages
from backend.api.deps import gate
from backend.api.errors import install_error_handlers
from backend.api.pages.assets import static_files
from backend.api.routes import accounts, analysis, metrics, plan, results, runs, series, workers
from backend.config import get_settings

API_PREFIX = "/api/v1"
log = logging.getLogger(__name__)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """At start-up: the env-seeded admin of a compose deployment (issue #11), read once."""
    settings = app.dependency_overrides.get(get_settings, get_settings)()
    if settings.admin_email and settings.admin_password:
        from backend.db import session_scope
        from backend.services.auth import seed_admin

        with session_scope(settings.sqlalchemy_url) as session:
            if seed_admin(session=session, email=settings.admin_email, password=settings.admin_password.get_secret_value()):
                log.warning(
                    "created the admin %s from PARALLAB_ADMIN_EMAIL; change its password after the first login", settings.admin_email
                )
    yield


def create_app() -> FastAPI:
    app = FastAPI(
        title="parallab",
        version="0.1.0",
        description="A lab bench for distributed-training parallelism: run, measure, predict and compare strategies.",
        # Every route: who is asking, and a login outside local mode (deps.PUBLIC_PATHS aside).
        dependencies=[Depends(gate)],
        lifespan=lifespan,
    )
    install_error_handlers(app)
    api = APIRouter(prefix=API_PREFIX)
    api.include_router(runs.router)
    api.include_router(results.router)
    api.include_router(plan.router)
    api.include_router(analysis.router)
    api.include_router(series.router)
    api.include_router(accounts.router)
    api.include_router(workers.router)
    app.include_router(api)
    app.include_router(metrics.router)

    @app.get("/healthz", tags=["health"])
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    app.mount("/static", static_files(), name="static")
    for router in pages.ROUTERS:
        app.include_router(router)
    return app


app = create_app()
