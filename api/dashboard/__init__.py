"""The web dashboard: static files served from this package at /ui/ (no CDN, no build).

The page and its scripts are public (they hold no data); everything they show comes
from /v1 with the user's bearer token, which the page keeps in the browser's storage
(see static/api.js). A strict Content-Security-Policy allows only this origin's
scripts, styles and API, so an injected string cannot run or send the token anywhere.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

STATIC = Path(__file__).parent / "static"
PREFIX = "/ui"

SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
}


class SecurityHeaders:
    """Adds SECURITY_HEADERS to every response under /ui."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not str(scope.get("path", "")).startswith(PREFIX):
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers += [(k.encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)


def install(app: FastAPI) -> None:
    app.add_middleware(SecurityHeaders)
    app.mount(f"{PREFIX}/static", StaticFiles(directory=STATIC), name="dashboard-static")

    @app.get(f"{PREFIX}/", include_in_schema=False)
    def _index() -> FileResponse:
        # Revalidated on every load, so an upgraded server serves its own scripts.
        return FileResponse(STATIC / "index.html", headers={"cache-control": "no-cache"})

    @app.get(PREFIX, include_in_schema=False)
    @app.get("/", include_in_schema=False)
    def _to_index() -> RedirectResponse:
        return RedirectResponse(f"{PREFIX}/")
