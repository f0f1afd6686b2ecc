"""Every error the API returns is JSON: {"error": {"status", "message", "details"}}.

Client mistakes map to 4xx with a readable message (422 carries the field path of each
invalid field); anything unexpected is logged and answered 500 without internals.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from scheduler.core.states import IllegalTransition

logger = logging.getLogger(__name__)


class ApiProblem(Exception):
    """Raised by routes for an expected client-facing error."""

    def __init__(
        self,
        status: int,
        message: str,
        details: list[dict[str, Any]] | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.details = details or []
        self.headers = headers


def error_response(
    status: int,
    message: str,
    details: list[dict[str, Any]] | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    return JSONResponse(
        status_code=status,
        content={"error": {"status": status, "message": message, "details": details or []}},
        headers=headers,
    )


def _field_path(loc: tuple[Any, ...]) -> str:
    # FastAPI prefixes where the value came from ("body", "query", "path"); users know
    # their spec's fields, so a body error is reported by its path inside the spec.
    parts = list(loc)
    if parts and parts[0] == "body":
        parts = parts[1:]
    return ".".join(str(p) for p in parts) or "body"


def _validation_details(exc: RequestValidationError) -> list[dict[str, Any]]:
    details = []
    for error in exc.errors():
        loc = tuple(error.get("loc", ()))
        message = str(error.get("msg", "invalid value"))
        if error.get("type") == "json_invalid":
            # FastAPI puts the character offset where a field name would go.
            reason = error.get("ctx", {}).get("error", "syntax error")
            where = f" at character {loc[-1]}" if len(loc) > 1 else ""
            details.append(
                {"loc": "body", "message": f"request body is not valid JSON: {reason}{where}"}
            )
            continue
        # Our validators raise ValueError; pydantic's "Value error, " prefix is noise.
        message = message.removeprefix("Value error, ")
        details.append({"loc": _field_path(loc), "message": message})
    return details


_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")


def _methods_of(request: Request) -> list[str]:
    """Every method some route serves at this request's path."""
    return [
        method
        for method in _METHODS
        if any(
            route.matches({**request.scope, "method": method})[0] is Match.FULL
            for route in request.app.router.routes
        )
    ]


def install(app: FastAPI) -> None:
    @app.exception_handler(ApiProblem)
    async def _problem(_request: Request, exc: ApiProblem) -> JSONResponse:
        return error_response(exc.status, exc.message, exc.details, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        details = _validation_details(exc)
        summary = "; ".join(f"{d['loc']}: {d['message']}" for d in details[:5])
        return error_response(422, f"invalid request: {summary}", details)

    @app.exception_handler(IllegalTransition)
    async def _conflict(_request: Request, exc: IllegalTransition) -> JSONResponse:
        return error_response(409, str(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # Unknown routes: the path may be long or odd, so it is not echoed back.
        message = str(exc.detail) if exc.status_code != 404 else "not found"
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            # Starlette names only the first route of the path; GET and POST /v1/jobs
            # are two routes.
            headers["Allow"] = ", ".join(_methods_of(request))
        return error_response(exc.status_code, message, headers=headers)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        logger.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
        return error_response(500, "internal error; see the server log")
