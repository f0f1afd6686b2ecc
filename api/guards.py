"""What every HTTP request must pass before a route sees it, checked in one place.

A plain ASGI middleware in front of the routes (see api/app.py for its place):
  1. a body larger than `api.max_body_bytes` (on a route of `route_limits`, its own
     limit, e.g. `api.max_code_bytes` for code uploads) is refused 413 without being read:
     at once when its Content-Length says so, else (chunked) as soon as what arrived
     passes the limit;
  2. a NUL character in the path or the query string is refused 422 with where it was
     (PostgreSQL text cannot hold NUL; no legitimate name or value needs one);
  3. under /v1 the bearer token is verified before the body is read: FastAPI reads a
     body before it resolves dependencies, so without this an anonymous caller could
     make the server read and parse anything; the principal is left in the request's
     state for api.deps;
  4. a JSON body is checked as a whole: a NUL character in any string or key, a key
     given twice in one object (JSON parsers keep the last silently) and nesting deeper
     than strict_json.MAX_DEPTH are refused 422 with the field path; the body then goes
     on to the route unchanged.
Its refusals close the connection, so an unread body is never drained either.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import parse_qsl

from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api import strict_json
from api.deps import authenticate
from api.errors import ApiProblem, error_response
from scheduler.models.users import TokenVerifier

_AUTHENTICATED_PREFIX = "/v1/"
_CLOSE = {"connection": "close"}
NUL = strict_json.NUL_MESSAGE


def _nul_in_url(scope: Scope) -> list[dict[str, str]]:
    if "\x00" in scope.get("path", ""):
        return [{"loc": "path", "message": NUL}]
    # Decoded as Starlette decodes it for the routes.
    query = scope.get("query_string", b"").decode("latin-1")
    return [
        {"loc": "query" if "\x00" in name else f"query.{name}", "message": NUL}
        for name, value in parse_qsl(query, keep_blank_values=True)
        if "\x00" in name or "\x00" in value
    ]


def _is_json(headers: Headers) -> bool:
    # FastAPI parses a body as JSON when it says so, or says nothing.
    content_type = headers.get("content-type", "").split(";")[0].strip().lower()
    return content_type in {"", "application/json"} or content_type.endswith("+json")


class _Disconnected(Exception):
    pass


class _TooLarge(Exception):
    pass


class RequestGuard:
    def __init__(
        self,
        app: ASGIApp,
        *,
        tokens: TokenVerifier,
        max_body_bytes: int,
        route_limits: Mapping[str, int] | None = None,
    ) -> None:
        """`route_limits`: the body limit of these paths (exactly), instead of
        `max_body_bytes`."""
        self.app = app
        self.tokens = tokens
        self.max_body_bytes = max_body_bytes
        self.route_limits = dict(route_limits or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        limit = self.route_limits.get(scope.get("path", "").rstrip("/"), self.max_body_bytes)
        declared = headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await self._refuse(scope, receive, send, *_too_large(limit))
            return
        if scope.get("path", "").startswith(_AUTHENTICATED_PREFIX):
            try:
                principal = await run_in_threadpool(
                    authenticate, self.tokens, headers.get("authorization", "")
                )
            except ApiProblem as problem:
                await self._refuse(
                    scope, receive, send, problem.status, problem.message, [], problem.headers
                )
                return
            scope.setdefault("state", {})["principal"] = principal
        nul = _nul_in_url(scope)
        if nul:
            await self._refuse(scope, receive, send, *_invalid(nul))
            return
        try:
            body = await _read_body(receive, limit)
        except _Disconnected:
            return
        except _TooLarge:
            await self._refuse(scope, receive, send, *_too_large(limit))
            return
        if body and _is_json(headers):
            problems = strict_json.problems_in(body)
            if problems:
                await self._refuse(scope, receive, send, *_invalid(problems))
                return
        await self.app(scope, _replay(body, receive), send)

    @staticmethod
    async def _refuse(
        scope: Scope,
        receive: Receive,
        send: Send,
        status: int,
        message: str,
        details: list[dict[str, str]],
        headers: dict[str, str] | None = None,
    ) -> None:
        response = error_response(status, message, list(details), {**(headers or {}), **_CLOSE})
        await response(scope, receive, send)


async def _read_body(receive: Receive, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise _Disconnected
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _TooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _too_large(limit: int) -> tuple[int, str, list[dict[str, str]]]:
    return 413, f"request body larger than {limit} bytes", []


def _invalid(problems: list[dict[str, str]]) -> tuple[int, str, list[dict[str, str]]]:
    summary = "; ".join(f"{p['loc']}: {p['message']}" for p in problems[:5])
    return 422, f"invalid request: {summary}", problems


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that hands the route the body already read, then the connection's
    later messages (a disconnect)."""
    pending = True

    async def replay() -> Message:
        nonlocal pending
        if pending:
            pending = False
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
