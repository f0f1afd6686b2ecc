"""A small synchronous Python client for the JigSaw REST API (used by the CLI).

Every method returns the parsed JSON body. Any failure is an `ApiError`: an HTTP error
carries the server's status, message and field details; a transport failure (server
down, timeout) carries status 0 and says what to check. Idempotent GETs are retried a
few times on connection errors only; POSTs are never retried.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote

import httpx
from tenacity import (
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential,
)

DEFAULT_TIMEOUT = 10.0
GET_ATTEMPTS = 3


class ApiError(Exception):
    """A failed API call. `status` is the HTTP status, or 0 when no response came back."""

    def __init__(
        self, status: int, message: str, details: list[dict[str, Any]] | None = None
    ) -> None:
        self.status = status
        self.message = message
        self.details = details or []
        super().__init__(str(self))

    def __str__(self) -> str:
        text = self.message
        if self.details:
            parts = []
            for detail in self.details:
                loc = detail.get("loc")
                where = ".".join(str(p) for p in loc) if isinstance(loc, list | tuple) else loc
                msg = detail.get("message", "")
                parts.append(f"{where}: {msg}" if where else str(msg))
            text = f"{text}: " + "; ".join(parts)
        return f"{text} (HTTP {self.status})" if self.status else text

    @classmethod
    def from_response(cls, response: httpx.Response) -> ApiError:
        """Build from the API's `{"error": {...}}` body, tolerating any other body."""
        try:
            body: Any = response.json()
        except ValueError:
            body = None
        if isinstance(body, dict) and isinstance(body.get("error"), dict):
            error = body["error"]
            details = error.get("details")
            return cls(
                int(error.get("status") or response.status_code),
                str(error.get("message") or response.reason_phrase),
                details if isinstance(details, list) else [],
            )
        if isinstance(body, dict) and "detail" in body:  # FastAPI's default shape
            detail = body["detail"]
            if isinstance(detail, list):
                return cls(
                    response.status_code,
                    response.reason_phrase or "request failed",
                    [
                        {"loc": d.get("loc"), "message": d.get("msg", "")}
                        for d in detail
                        if isinstance(d, dict)
                    ],
                )
            return cls(response.status_code, str(detail))
        text = response.text.strip()[:200] or response.reason_phrase or "request failed"
        return cls(response.status_code, text)


class JigsawClient:
    """`JigsawClient(base_url, token)`; use as a context manager or call `close()`."""

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        headers = {"Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._http = httpx.Client(
            base_url=self.base_url, headers=headers, timeout=timeout, transport=transport
        )

    def __enter__(self) -> JigsawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # -- endpoints ------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        return self._get("/healthz")

    def ready(self) -> dict[str, Any]:
        return self._get("/readyz")

    def whoami(self) -> dict[str, Any]:
        return self._get("/v1/whoami")

    def submit(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        return self._request("POST", "/v1/jobs", json=dict(spec))

    def upload_code(self, archive: bytes) -> dict[str, Any]:
        """Store a code archive (`jigsaw.codearchive.pack`); answers its digest."""
        return self._request(
            "POST",
            "/v1/code",
            content=archive,
            headers={"content-type": "application/octet-stream"},
        )

    def list_jobs(
        self,
        *,
        states: Iterable[str] = (),
        owner: str | None = None,
        limit: int | None = None,
        after: int | None = None,
    ) -> dict[str, Any]:
        params: list[tuple[str, str | int]] = [("state", str(state)) for state in states]
        if owner is not None:
            params.append(("owner", owner))
        if limit is not None:
            params.append(("limit", limit))
        if after is not None:
            params.append(("after", after))
        return self._get("/v1/jobs", params=params)

    def get_job(self, job_id: int) -> dict[str, Any]:
        return self._get(f"/v1/jobs/{int(job_id)}")

    def cancel(self, job_id: int) -> dict[str, Any]:
        return self._request("POST", f"/v1/jobs/{int(job_id)}/cancel")

    def suspend(self, job_id: int) -> dict[str, Any]:
        return self._request("POST", f"/v1/jobs/{int(job_id)}/suspend")

    def resume(self, job_id: int) -> dict[str, Any]:
        return self._request("POST", f"/v1/jobs/{int(job_id)}/resume")

    def logs(self, job_id: int, *, after: int = 0, limit: int | None = None) -> dict[str, Any]:
        params: dict[str, int] = {"after": after}
        if limit is not None:
            params["limit"] = limit
        return self._get(f"/v1/jobs/{int(job_id)}/logs", params=params)

    def events(self, job_id: int) -> dict[str, Any]:
        return self._get(f"/v1/jobs/{int(job_id)}/events")

    def allocations(self, job_id: int) -> dict[str, Any]:
        """The job's holds on GPUs, newest first (when, where, which rank)."""
        return self._get(f"/v1/jobs/{int(job_id)}/allocations", params={"limit": 5000})

    def metrics(self, job_id: int, *, points: int | None = None) -> dict[str, Any]:
        params = {"points": points} if points is not None else None
        return self._get(f"/v1/jobs/{int(job_id)}/metrics", params=params)

    def cluster(self) -> dict[str, Any]:
        return self._get("/v1/cluster")

    def rounds(self, *, limit: int = 100, decisions: bool = False) -> dict[str, Any]:
        """Recent scheduling rounds, newest first (only those that decided something)."""
        return self._get("/v1/scheduler/rounds", params={"limit": limit, "decisions": decisions})

    def profiles(self) -> dict[str, Any]:
        return self._get("/v1/profiles")

    def put_profile(self, workload: str, profile: Mapping[str, Any]) -> dict[str, Any]:
        return self._request("PUT", f"/v1/profiles/{quote(workload, safe='')}", json=dict(profile))

    def tokens(self, *, user: str | None = None, revoked: bool = False) -> dict[str, Any]:
        params: dict[str, str | bool] = {"revoked": revoked}
        if user is not None:
            params["user"] = user
        return self._get("/v1/tokens", params=params)

    def create_token(self, request: Mapping[str, Any]) -> dict[str, Any]:
        return self._request("POST", "/v1/tokens", json=dict(request))

    def revoke_token(self, key: str) -> dict[str, Any]:
        return self._request("DELETE", f"/v1/tokens/{quote(key, safe='')}")

    def drain_node(self, name: str, *, now: bool = False) -> dict[str, Any]:
        return self._request("POST", f"/v1/nodes/{quote(name, safe='')}/drain", params={"now": now})

    def undrain_node(self, name: str) -> dict[str, Any]:
        return self._request("POST", f"/v1/nodes/{quote(name, safe='')}/undrain")

    def remove_node(self, name: str) -> dict[str, Any]:
        return self._request("DELETE", f"/v1/nodes/{quote(name, safe='')}")

    def queues(self) -> dict[str, Any]:
        return self._get("/v1/queues")

    def get_queue(self, name: str) -> dict[str, Any]:
        return self._get(f"/v1/queues/{quote(name, safe='')}")

    def create_queue(self, fields: Mapping[str, Any]) -> dict[str, Any]:
        return self._request("POST", "/v1/queues", json=dict(fields))

    def update_queue(self, name: str, fields: Mapping[str, Any]) -> dict[str, Any]:
        return self._request("PATCH", f"/v1/queues/{quote(name, safe='')}", json=dict(fields))

    def delete_queue(self, name: str) -> dict[str, Any]:
        return self._request("DELETE", f"/v1/queues/{quote(name, safe='')}")

    # -- plumbing -------------------------------------------------------------------

    def _get(self, path: str, *, params: Any = None) -> dict[str, Any]:
        retrying = Retrying(
            stop=stop_after_attempt(GET_ATTEMPTS),
            wait=wait_exponential(multiplier=0.2, max=2),
            retry=retry_if_exception_type(httpx.ConnectError),
            reraise=True,
        )
        try:
            response = retrying(self._http.request, "GET", path, params=params)
        except httpx.HTTPError as exc:
            raise self._transport_error(exc) from None
        return self._parse(response)

    def _request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise self._transport_error(exc) from None
        return self._parse(response)

    def _transport_error(self, exc: httpx.HTTPError) -> ApiError:
        if isinstance(exc, httpx.ConnectError):
            return ApiError(
                0, f"cannot reach the JigSaw API at {self.base_url} — is `jigsaw up` running?"
            )
        if isinstance(exc, httpx.TimeoutException):
            return ApiError(0, f"the JigSaw API at {self.base_url} did not answer in time")
        return ApiError(0, f"request to the JigSaw API at {self.base_url} failed: {exc}")

    @staticmethod
    def _parse(response: httpx.Response) -> dict[str, Any]:
        if response.is_error:
            raise ApiError.from_response(response)
        if not response.content:
            return {}
        try:
            body = response.json()
        except ValueError:
            raise ApiError(
                response.status_code, "the API answered with a body that is not JSON"
            ) from None
        return body if isinstance(body, dict) else {"items": body}
