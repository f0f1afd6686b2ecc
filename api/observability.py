"""Prometheus metrics, on a registry per app (tests run several apps).

Three sources share the registry `/metrics` serves: the API's request counters (here),
the scheduler's rounds, decisions and ingested reports (`scheduler.telemetry`, fed by
the leader's loop and report writer in the same process), and counts read from the
database at scrape time (jobs by state, GPUs and nodes by state, cluster efficiency).

Labels are bounded: the route *template* (`/v1/jobs/{job_id}`), never the raw path, and
the status class (`2xx`), never a job id.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

from fastapi import FastAPI, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy.orm import Session, sessionmaker
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from scheduler.core.states import JobState
from scheduler.db import transaction
from scheduler.models.cluster import capacity
from scheduler.models.efficiency import cluster_efficiency
from scheduler.models.jobs import count_by_state
from scheduler.models.queues import QueueInfo, list_queues
from scheduler.telemetry import SchedulerTelemetry

logger = logging.getLogger(__name__)


class DatabaseCollector(Collector):
    """Gauges counted in the database when Prometheus scrapes.

    Counting at scrape time keeps them right whichever process (API replica or scheduler
    leader) changed the jobs; a database outage drops the gauges, not the scrape.
    """

    def __init__(self, factory: sessionmaker[Session]) -> None:
        self._factory = factory

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            with transaction(self._factory) as session:
                jobs = count_by_state(session)
                counts = capacity(session)
                efficiency = cluster_efficiency(session)
                queues = list_queues(session)
        except Exception:  # noqa: BLE001 - /readyz reports the database; metrics go on
            logger.warning("could not read the cluster's counts for /metrics", exc_info=True)
            return
        gauge = GaugeMetricFamily("jigsaw_jobs", "Jobs by state.", labels=["state"])
        for state in JobState:
            gauge.add_metric([state.value], jobs.get(state, 0))
        yield gauge
        gauge = GaugeMetricFamily(
            "jigsaw_gpus",
            "GPUs by state: busy (held by a job), free (placeable), unavailable (on a dead "
            "or unschedulable node).",
            labels=["state"],
        )
        for gpu_state, count in counts.gpus.items():
            gauge.add_metric([gpu_state], count)
        yield gauge
        gauge = GaugeMetricFamily(
            "jigsaw_nodes", "Nodes by state: alive, unschedulable, dead.", labels=["state"]
        )
        for node_state, count in counts.nodes.items():
            gauge.add_metric([node_state], count)
        yield gauge
        yield from _queue_gauges(queues)
        for name, value, help_text in (
            (
                "jigsaw_cluster_allocation_ratio",
                efficiency.allocation,
                "GPU-seconds held by jobs over the last hour / GPU-seconds available.",
            ),
            (
                "jigsaw_cluster_efficiency_ratio",
                efficiency.efficiency,
                "GPU-seconds held x measured utilization over the last hour / GPU-seconds "
                "available (scheduler/models/efficiency.py).",
            ),
        ):
            if value is not None:
                yield GaugeMetricFamily(name, help_text, value=value)


def _queue_gauges(queues: list[QueueInfo]) -> Iterator[GaugeMetricFamily]:
    """Per queue, in Kueue's vocabulary (its `*_pending_workloads` and so on)."""
    for name, help_text, value in (
        (
            "jigsaw_queue_pending_jobs",
            "Jobs waiting for GPUs, by queue (queued, or suspended by a policy).",
            lambda q: q.pending_jobs,
        ),
        ("jigsaw_queue_admitted_jobs", "Jobs holding GPUs, by queue.", lambda q: q.admitted_jobs),
        ("jigsaw_queue_gpus_in_use", "GPUs held by the queue's jobs.", lambda q: q.gpus_in_use),
        (
            "jigsaw_queue_borrowed_gpus",
            "GPUs the queue's jobs hold beyond its quota (lent by idle queues).",
            lambda q: q.borrowed_gpus,
        ),
    ):
        gauge = GaugeMetricFamily(name, help_text, labels=["queue"])
        for queue in queues:
            gauge.add_metric([queue.row.name], value(queue))
        yield gauge
    gauge = GaugeMetricFamily(
        "jigsaw_queue_gpu_quota",
        "GPUs guaranteed to the queue (absent for a queue whose quota is what the others "
        "leave, such as default's).",
        labels=["queue"],
    )
    for queue in queues:
        if queue.row.quota is not None:
            gauge.add_metric([queue.row.name], queue.row.quota)
    yield gauge


class ApiMetrics:
    def __init__(self, factory: sessionmaker[Session] | None = None) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "jigsaw_api_requests_total",
            "HTTP requests served.",
            ("route", "method", "status_class"),
            registry=self.registry,
        )
        self.latency = Histogram(
            "jigsaw_api_request_seconds",
            "HTTP request latency.",
            ("route", "method"),
            registry=self.registry,
        )
        self.scheduler = SchedulerTelemetry(self.registry)
        if factory is not None:
            self.registry.register(DatabaseCollector(factory))

    def observe(self, scope: Scope, status: int, seconds: float) -> None:
        # The router stores the matched route in the (shared) scope; unmatched paths such
        # as 404s for unknown URLs share one label instead of minting one per path.
        route = str(getattr(scope.get("route"), "path", "unmatched"))
        method = str(scope.get("method", ""))
        self.latency.labels(route, method).observe(seconds)
        self.requests.labels(route, method, f"{status // 100}xx").inc()


class MetricsMiddleware:
    """Plain ASGI middleware: it sees the real status, and counts unhandled errors as 5xx.

    It sits inside Starlette's ServerErrorMiddleware, so an exception passes through here
    before becoming the JSON 500; it is counted, then re-raised for that handler.
    """

    def __init__(self, app: ASGIApp, metrics: ApiMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_and_record(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_and_record)
        finally:
            self.metrics.observe(scope, status, time.perf_counter() - started)


def install(app: FastAPI) -> ApiMetrics:
    """Measure every request and serve `/metrics`; call after app.state.session_factory."""
    metrics = ApiMetrics(getattr(app.state, "session_factory", None))
    app.add_middleware(MetricsMiddleware, metrics=metrics)

    @app.get("/metrics", include_in_schema=False)
    def _scrape() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return metrics
