"""`ReportWriter`: what agents stream in, written to the database in batches.

gRPC handler threads only enqueue; one writer thread drains the queue and writes each
batch in few transactions (one multi-row INSERT per table, one UPDATE per touched job),
so the database sees a few large transactions a second instead of one per message. The
queue is bounded: when the database falls behind, handlers block and gRPC flow control
slows the agents down instead of the scheduler's memory growing.

Failures stay with the job that caused them. Heartbeats (liveness) are written in their
own transaction, never beside what trial code reported. When a batch's reports fail, each
job's are written again on their own, and the items of a job that still fails one by
one: only the item the database refuses is dropped (and counted), never another job's
reports. Iteration records an agent replays after a restart (its spool, see
`worker_agent.outbox`) may have been stored already: those are written only for
iterations the job has no row for, and do not move its progress.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, case, insert, select, update
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from scheduler.db import transaction
from scheduler.models.agents import record_heartbeats
from scheduler.models.metrics import record
from scheduler.orm import IterationMetric, Job, JobLog, table_of, utcnow
from scheduler.telemetry import SchedulerTelemetry

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Metrics:
    job_id: int
    rows: Sequence[dict[str, Any]]
    replayed: bool
    # When they came: what resize and start costs are measured by, not the write's time
    # (a batch of writes can hold what came a second apart).
    received: datetime


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


_JobItem = _Metrics | _Log | _Evaluation
_Item = _JobItem | _Heartbeat


@dataclass
class _Batch:
    jobs: dict[int, list[_JobItem]] = field(default_factory=dict)
    heartbeats: dict[int, datetime] = field(default_factory=dict)
    rows: int = 0  # iteration rows, which bound a batch
    items: int = 0

    def add(self, item: _Item) -> None:
        self.items += 1
        if isinstance(item, _Heartbeat):
            self.heartbeats[item.agent_id] = item.at
        else:
            self.jobs.setdefault(item.job_id, []).append(item)
            if isinstance(item, _Metrics):
                self.rows += len(item.rows)


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

    def metrics(
        self, job_id: int, rows: Sequence[dict[str, Any]], *, replayed: bool = False
    ) -> None:
        """`replayed`: rows an agent sends again after a restart (see the module)."""
        self._put(_Metrics(job_id, rows, replayed, utcnow()))

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
                batch.add(item)
                if batch.rows >= self._max_rows:
                    break
                try:
                    item = self._queue.get(timeout=max(deadline - time.monotonic(), 0.0))
                except queue.Empty:
                    break
            stopping = item is None
            self._write_heartbeats(batch.heartbeats)
            self._write_reports(batch.jobs)
            with self._idle:
                self._pending -= batch.items
                self._idle.notify_all()

    def _write_heartbeats(self, seen: dict[int, datetime]) -> None:
        if not seen:
            return
        try:
            with transaction(self._factory) as session:
                record_heartbeats(session, seen)
        except Exception:
            logger.exception("could not record the heartbeats of agents %s", sorted(seen))
            return
        self._count(_Written(heartbeats=len(seen)))

    def _write_reports(self, jobs: dict[int, list[_JobItem]]) -> None:
        """All jobs in one transaction; if that fails, each job alone, and the items of a
        job that still fails one by one. A database that is unreachable fails them all:
        then the rest is dropped at once rather than tried item by item."""
        if not jobs:
            return
        error = self._commit(jobs)
        if error is None:
            return
        logger.warning("a batch of reports failed (%s); writing job by job", _reason(error))
        for job_id, items in jobs.items():
            if len(jobs) > 1 and not _unreachable(error):
                failed = self._commit({job_id: items})
                if failed is None:
                    continue
                error = failed
            for item in items:
                if len(items) > 1 and not _unreachable(error):
                    failed = self._commit({job_id: [item]})
                    if failed is None:
                        continue
                    error = failed
                self._drop(item, error)

    def _commit(self, jobs: Mapping[int, Sequence[_JobItem]]) -> Exception | None:
        """Write these items in one transaction; the error if it rolled back."""
        try:
            with transaction(self._factory) as session:
                written = _write(session, jobs)
        except Exception as exc:
            return exc
        self._count(written)
        return None

    def _drop(self, item: _JobItem, error: Exception) -> None:
        # Reports are observations, not decisions: dropping one beats stopping the
        # writer, which would block every agent.
        size = len(item.rows) if isinstance(item, _Metrics) else 1
        if self._telemetry is not None:
            self._telemetry.reports_dropped.labels("write_failed").inc(size)
        logger.warning(
            "job %d: could not store %s (%d row(s)); dropped: %s",
            item.job_id,
            type(item).__name__.strip("_").lower(),
            size,
            _reason(error),
            extra={"job_id": item.job_id},
        )

    def _count(self, written: _Written) -> None:
        self.rows_written += written.iterations
        if self._telemetry is not None:
            reports = self._telemetry.reports
            for kind, count in vars(written).items():
                if count:
                    reports.labels(kind).inc(count)


@dataclass(frozen=True)
class _Written:
    iterations: int = 0
    logs: int = 0
    evaluations: int = 0
    heartbeats: int = 0


def _unreachable(error: Exception) -> bool:
    """The database failed, not the data: trying smaller pieces will not help."""
    return isinstance(error, OperationalError | InterfaceError)


def _reason(error: Exception) -> str:
    return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"


def _write(session: Session, jobs: Mapping[int, Sequence[_JobItem]]) -> _Written:
    # A job deleted meanwhile would fail the whole batch on its foreign key.
    existing = set(session.scalars(select(Job.id).where(Job.id.in_(jobs))))
    live: list[dict[str, Any]] = []
    replayed: list[dict[str, Any]] = []
    logs: list[dict[str, Any]] = []
    evaluations: dict[int, dict[str, float]] = {}
    for job_id in sorted(existing):
        for item in jobs[job_id]:
            if isinstance(item, _Metrics):
                rows = replayed if item.replayed else live
                rows.extend(
                    {"job_id": job_id, **row, "reported_at": item.received} for row in item.rows
                )
            elif isinstance(item, _Log):
                logs.append(
                    {
                        "job_id": job_id,
                        "rank": item.rank,
                        "level": item.level,
                        "message": item.message,
                        "created_at": item.at,
                    }
                )
            else:
                evaluations[job_id] = item.metrics
    written = record(session, [*live, *_unstored(session, replayed, live)])
    if logs:
        session.execute(insert(JobLog), logs)
    _advance(session, live)
    for job_id, metrics in evaluations.items():
        session.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(metrics=metrics)
            .execution_options(synchronize_session=False)
        )
    return _Written(iterations=written, logs=len(logs), evaluations=len(evaluations))


def _unstored(
    session: Session, replayed: list[dict[str, Any]], live: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The replayed rows of iterations that have no row yet (stored, or in this batch)."""
    if not replayed:
        return []
    seen = {(row["job_id"], row["iteration"]) for row in live}
    for job_id in {row["job_id"] for row in replayed}:
        iterations = [row["iteration"] for row in replayed if row["job_id"] == job_id]
        seen.update(
            (job_id, iteration)
            for iteration in session.scalars(
                select(IterationMetric.iteration).where(
                    IterationMetric.job_id == job_id,
                    IterationMetric.iteration.between(min(iterations), max(iterations)),
                )
            )
        )
    fresh = []
    for row in replayed:
        key = (row["job_id"], row["iteration"])
        if key not in seen:
            seen.add(key)
            fresh.append(row)
    return fresh


def _advance(session: Session, rows: list[dict[str, Any]]) -> None:
    """Move each job to its highest reported iteration and that iteration's progress,
    never backwards (a job resumed from an older checkpoint re-reports iterations)."""
    newest: dict[int, dict[str, Any]] = {}
    for row in rows:
        if row["iteration"] > newest.get(row["job_id"], {"iteration": 0})["iteration"]:
            newest[row["job_id"]] = row
    if newest:
        # On the Core table: an executemany UPDATE with its own WHERE (not by primary key).
        # Both SET clauses read the row as it was, so progress moves with the iteration.
        jobs = table_of(Job)
        ahead = jobs.c.iterations_done < bindparam("done")
        session.execute(
            update(jobs)
            .where(jobs.c.id == bindparam("job"))
            .values(
                iterations_done=case((ahead, bindparam("done")), else_=jobs.c.iterations_done),
                progress=case((ahead, bindparam("progress")), else_=jobs.c.progress),
            ),
            [
                {"job": job_id, "done": row["iteration"], "progress": _progress(row)}
                for job_id, row in newest.items()
            ],
        )


def _progress(row: dict[str, Any]) -> float:
    """A record's progress; an older runtime's record says none: its iteration."""
    progress = row.get("progress")
    return float(row["iteration"]) if progress is None else float(progress)
