"""The FastAPI application: REST under /api/v1, HTML pages, plotly.js served locally."""

from __future__ import annotations

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.routing import Route

from backend.api import pages
from backend.api.body import BoundedBodies
from backend.api.deps import gate
from backend.api.errors import install_error_handlers
from backend.api.lifespan import lifespan
from backend.api.openapi import install_openapi
from backend.api.pages.assets import static_files
from backend.api.routes import accounts, analysis, docs, metrics, plan, results, runs, series, sweeps, workers
from backend.api.security import SecurityMiddleware, settings_for
from backend.services.health import health

API_PREFIX = "/api/v1"


async def healthz(request: Request) -> JSONResponse:
    """Health: the database and the broker, each "ok" or the error; 503 when either is down (public)."""
    code, body = await health(settings_for({"app": request.app}))
    return JSONResponse(body, status_code=code)


def create_app() -> FastAPI:
    app = FastAPI(
        title="parallab",
        version="0.1.0",
        description="A lab bench for distributed-training parallelism: run, measure, predict and compare strategies.",
        # Every route: who is asking, and a login outside local mode (deps.PUBLIC_PATHS aside).
        dependencies=[Depends(gate)],
        lifespan=lifespan,
        # Served by routes.docs instead, from local files and behind the gate like every route (docs_public opens them).
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
    )
    install_error_handlers(app)
    install_openapi(app)
    app.add_middleware(BoundedBodies)  # inside the security middleware: its refusals carry the security headers too
    app.add_middleware(SecurityMiddleware, docs_paths=[docs.DOCS_URL, docs.REDOC_URL, docs.OAUTH2_REDIRECT_URL])
    docs.mount_assets(app)
    api = APIRouter(prefix=API_PREFIX)
    api.include_router(runs.router)
    api.include_router(results.router)
    api.include_router(plan.router)
    api.include_router(analysis.router)
    api.include_router(series.router)
    api.include_router(accounts.router)
    api.include_router(workers.router)
    api.include_router(sweeps.router)
    app.include_router(api)
    app.include_router(metrics.router)
    app.include_router(docs.router)

    # Not a FastAPI route: those all take the app's dependencies (a database session, the caller's
    # identity), each a hop through the request thread pool. This one awaits its two checks on a
    # pool of their own (services.health), so a pool saturated by uploads does not hold it up.
    app.router.routes.append(Route("/healthz", healthz, methods=["GET"]))

    app.mount("/static", static_files(), name="static")
    for router in pages.ROUTERS:
        app.include_router(router)
    return app


app = create_app()
