"""Liveness and readiness probes (no auth: Kubernetes and load balancers call them)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from api.errors import error_response
from api.schemas import error_responses
from scheduler.migrate import is_up_to_date

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz() -> dict[str, str]:
    """The process is up."""
    return {"status": "ok"}


@router.get("/readyz", response_model=None, responses=error_responses(503))
def readyz(request: Request) -> JSONResponse | dict[str, str]:
    """The database answers and its schema is at the head revision."""
    try:
        ready = is_up_to_date(request.app.state.engine)
    except Exception as exc:  # noqa: BLE001 - any database failure means "not ready"
        return error_response(503, f"database unreachable: {type(exc).__name__}")
    if not ready:
        return error_response(503, "database schema is not at head; run `jigsaw db upgrade`")
    return {"status": "ready"}
