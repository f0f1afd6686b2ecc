"""Prometheus metrics of the API, on a registry per app (tests run several apps).

Labels are bounded: the route *template* (`/v1/jobs/{job_id}`), never the raw path, and
the status class (`2xx`), never a job id.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)


class ApiMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        labels = ("route", "method", "status_class")
        self.requests = Counter(
            "jigsaw_api_requests_total", "HTTP requests served.", labels, registry=self.registry
        )
        self.latency = Histogram(
            "jigsaw_api_request_seconds",
            "HTTP request latency.",
            ("route", "method"),
            registry=self.registry,
        )


def _route_template(request: Request) -> str:
    # The router records the matched route in the scope; unmatched paths share one label.
    route = request.scope.get("route")
    return str(getattr(route, "path", "unmatched"))


def install(app: FastAPI) -> ApiMetrics:
    metrics = ApiMetrics()

    @app.middleware("http")
    async def _measure(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        started = time.perf_counter()
        response = await call_next(request)
        route = _route_template(request)
        metrics.latency.labels(route, request.method).observe(time.perf_counter() - started)
        status_class = f"{response.status_code // 100}xx"
        metrics.requests.labels(route, request.method, status_class).inc()
        return response

    @app.get("/metrics", include_in_schema=False)
    def _scrape() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return metrics
