"""`ReportWriter`: what agents stream in, written to the database in batches.

gRPC handler threads only enqueue; one writer thread drains the queue and writes each
batch in one transaction (one multi-row INSERT per table, one UPDATE per touched job or
agent), so the database sees a few large transactions a second instead of one per
message. The queue is bounded: when the database falls behind, handlers block and gRPC
flow control slows the agents down instead of the scheduler's memory growing.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, case, insert, select, update
from sqlalchemy.orm import Session, sessionmaker

from scheduler.db import transaction
from scheduler.models.agents import record_heartbeats
from scheduler.models.metrics import record
from scheduler.orm import Job, JobLog, table_of, utcnow
from scheduler.telemetry import SchedulerTelemetry

logger = logging.getLogger(__name__)


@dataclass
class _Batch:
    metrics: list[dict[str, Any]] = field(default_factory=list)
    logs: list[dict[str, Any]] = field(default_factory=list)
    evaluations: dict[int, dict[str, float]] = field(default_factory=dict)
    heartbeats: dict[int, datetime] = field(default_factory=dict)
    items: int = 0


@dataclass(frozen=True)
class _Metrics:
    job_id: int
    rows: Sequence[dict[str, Any]]


@dataclass(frozen=True)
class _Log:
    job_id: int
    rank: int
    level: str
    message: str
    at: datetime


@dataclass(frozen=True)
class _Evaluation:
    job_id: int
    metrics: dict[str, float]


@dataclass(frozen=True)
class _Heartbeat:
    agent_id: int
    at: datetime


_Item = _Metrics | _Log | _Evaluation | _Heartbeat


class ReportWriter:
    def __init__(
        self,
        factory: sessionmaker[Session],
        *,
        max_rows: int = 5000,
        max_delay_seconds: float = 0.2,
        capacity: int = 10_000,
        telemetry: SchedulerTelemetry | None = None,
    ) -> None:
        self._factory = factory
        self._telemetry = telemetry
        self._max_rows = max_rows
        self._max_delay = max_delay_seconds
        self._queue: queue.Queue[_Item | None] = queue.Queue(maxsize=capacity)
        self._thread = threading.Thread(target=self._run, name="jigsaw-report-writer", daemon=True)
        self._idle = threading.Condition()
        self._pending = 0
        self.rows_written = 0

    def start(self) -> None:
        self._thread.start()

    def close(self, timeout: float = 10.0) -> None:
        """Write what is queued, then stop."""
        self._queue.put(None)
        self._thread.join(timeout)

    # -- producers (gRPC handler threads) --------------------------------------------

    def metrics(self, job_id: int, rows: Sequence[dict[str, Any]]) -> None:
        self._put(_Metrics(job_id, rows))

    def log(self, job_id: int, rank: int, level: str, message: str) -> None:
        self._put(_Log(job_id, rank, level, message, utcnow()))

    def evaluation(self, job_id: int, metrics: dict[str, float]) -> None:
        self._put(_Evaluation(job_id, metrics))

    def heartbeat(self, agent_id: int) -> None:
        self._put(_Heartbeat(agent_id, utcnow()))

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until everything queued so far is written (tests, shutdown)."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)

    def _put(self, item: _Item) -> None:
        with self._idle:
            self._pending += 1
        self._queue.put(item)

    # -- the writer thread ------------------------------------------------------------

    def _run(self) -> None:
        stopping = False
        while not stopping:
            item = self._queue.get()
            batch = _Batch()
            deadline = time.monotonic() + self._max_delay
            while item is not None:
                _add(batch, item)
                if len(batch.metrics) >= self._max_rows:
                    break
                try:
                    item = self._queue.get(timeout=max(deadline - time.monotonic(), 0.0))
                except queue.Empty:
                    break
            stopping = item is None
            if batch.items:
                self._write(batch)
            with self._idle:
                self._pending -= batch.items
                self._idle.notify_all()

    def _write(self, batch: _Batch) -> None:
        try:
            with transaction(self._factory) as session:
                _write(session, batch)
            self.rows_written += len(batch.metrics)
            if self._telemetry is not None:
                reports = self._telemetry.reports
                reports.labels("iterations").inc(len(batch.metrics))
                reports.labels("logs").inc(len(batch.logs))
                reports.labels("evaluations").inc(len(batch.evaluations))
                reports.labels("heartbeats").inc(len(batch.heartbeats))
        except Exception:
            if self._telemetry is not None:
                self._telemetry.reports_dropped.labels("write_failed").inc(
                    len(batch.metrics) + len(batch.logs)
                )
            # Reports are observations, not decisions: losing one batch beats stopping
            # the writer, which would block every agent.
            logger.exception(
                "could not write %d iteration rows and %d log lines; dropped",
                len(batch.metrics),
                len(batch.logs),
            )


def _add(batch: _Batch, item: _Item) -> None:
    batch.items += 1
    if isinstance(item, _Metrics):
        batch.metrics.extend({"job_id": item.job_id, **row} for row in item.rows)
    elif isinstance(item, _Log):
        batch.logs.append(
            {
                "job_id": item.job_id,
                "rank": item.rank,
                "level": item.level,
                "message": item.message,
                "created_at": item.at,
            }
        )
    elif isinstance(item, _Evaluation):
        batch.evaluations[item.job_id] = item.metrics
    else:
        batch.heartbeats[item.agent_id] = item.at


def _write(session: Session, batch: _Batch) -> None:
    touched = (
        {row["job_id"] for row in batch.metrics}
        | {row["job_id"] for row in batch.logs}
        | set(batch.evaluations)
    )
    # A job deleted meanwhile would fail the whole batch on its foreign key.
    existing = set(session.scalars(select(Job.id).where(Job.id.in_(touched)))) if touched else set()
    record(session, (row for row in batch.metrics if row["job_id"] in existing))
    logs = [row for row in batch.logs if row["job_id"] in existing]
    if logs:
        session.execute(insert(JobLog), logs)
    progress: dict[int, int] = {}
    for row in batch.metrics:
        if row["job_id"] in existing:
            progress[row["job_id"]] = max(progress.get(row["job_id"], 0), row["iteration"])
    if progress:
        # Never backwards: a job resumed from an older checkpoint re-reports iterations.
        # On the Core table: an executemany UPDATE with its own WHERE (not by primary key).
        jobs = table_of(Job)
        session.execute(
            update(jobs)
            .where(jobs.c.id == bindparam("job"))
            .values(
                iterations_done=case(
                    (jobs.c.iterations_done < bindparam("done"), bindparam("done")),
                    else_=jobs.c.iterations_done,
                )
            ),
            [{"job": job_id, "done": done} for job_id, done in progress.items()],
        )
    for job_id, metrics in batch.evaluations.items():
        if job_id in existing:
            session.execute(
                update(Job)
                .where(Job.id == job_id)
                .values(metrics=metrics)
                .execution_options(synchronize_session=False)
            )
    record_heartbeats(session, batch.heartbeats)
