"""The FastAPI application. It serves HTTP only; `api/server.py` migrates and runs it."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi_offline import FastAPIOffline

from api import dashboard, errors, observability
from api.guards import RequestGuard
from api.routes import cluster, code, health, jobs, nodes, profiles, queues, scheduler, tokens
from scheduler.db import engine_from_settings, session_factory
from scheduler.models.users import TokenVerifier
from scheduler.settings import Settings, get_settings


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    # /docs and /redoc from files in the package: no CDN, so they work offline.
    app = FastAPIOffline(
        title="JigSaw",
        version="1",
        description="Iteration-level GPU cluster scheduler for deep-learning training.",
    )
    app.state.settings = settings
    app.state.engine = engine_from_settings(settings)
    app.state.session_factory = session_factory(app.state.engine)
    app.state.tokens = TokenVerifier(app.state.session_factory, settings.api.auth_cache_seconds)
    errors.install(app)
    # Middleware added later wraps what was added before: the guard runs inside the
    # metrics (its refusals are counted) and before any route reads a body.
    app.add_middleware(
        RequestGuard,
        tokens=app.state.tokens,
        max_body_bytes=settings.api.max_body_bytes,
        # Only the code upload reads more: up to its own limit.
        route_limits={code.PATH: settings.api.max_code_bytes},
    )
    app.state.metrics = observability.install(app)
    # The scheduler leader in this process (api/server.py) reports through it.
    app.state.telemetry = app.state.metrics.scheduler
    for router in (
        health.router,
        jobs.router,
        code.router,
        cluster.router,
        scheduler.router,
        profiles.router,
        tokens.router,
        nodes.router,
        queues.router,
    ):
        app.include_router(router)
    dashboard.install(app)
    return app
