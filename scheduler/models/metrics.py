"""Per-iteration metrics: batched writes and downsampled reads."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, and_, func, insert, select
from sqlalchemy.orm import InstrumentedAttribute, Session

from scheduler.orm import IterationMetric, table_of, utcnow

SERIES_FIELDS = (
    "step_seconds",
    "compute_seconds",
    "comm_seconds",
    "samples_per_second",
    "loss",
    "utilization",
    "spb_depth",
    "workers",
    "batch_size",
    "learning_rate",
    "progress",
)


@dataclass(frozen=True)
class SeriesPoint:
    iteration: int
    values: dict[str, float | None]


# Columns a reported row carries, in COPY order.
ROW_COLUMNS = (
    "job_id",
    "iteration",
    "step_seconds",
    "compute_seconds",
    "comm_seconds",
    "samples_per_second",
    "loss",
    "utilization",
    "peak_memory_bytes",
    "bytes_communicated",
    "spb_depth",
    "batch_size",
    "learning_rate",
    "grad_sqr",
    "grad_var",
    "co_runners",
    "workers",
    "progress",
)
# What a row that leaves a column out gets (the rest default to NULL).
_DEFAULTS = {"compute_seconds": 0.0, "comm_seconds": 0.0, "samples_per_second": 0.0}


def _values(row: Mapping[str, Any]) -> list[Any]:
    return [row.get(name, _DEFAULTS.get(name)) for name in ROW_COLUMNS]


def record(session: Session, rows: Iterable[Mapping[str, Any]]) -> int:
    """Insert many iteration rows (keys: ROW_COLUMNS, and `reported_at` when they came
    earlier than now); returns how many.

    On PostgreSQL through COPY, measured 2-3x the rows/s of a multi-row INSERT
    (benchmarks/report_ingest.py); elsewhere one executemany INSERT.
    """
    batch = list(rows)
    if not batch:
        return 0
    now = utcnow()
    if session.get_bind().dialect.name == "postgresql":
        driver = session.connection().connection.driver_connection
        columns = ", ".join((*ROW_COLUMNS, "reported_at"))
        with (
            driver.cursor() as cursor,  # type: ignore[union-attr]
            cursor.copy(f"COPY iteration_metrics ({columns}) FROM STDIN") as copy,
        ):
            for row in batch:
                copy.write_row([*_values(row), row.get("reported_at", now)])
    else:
        session.execute(
            insert(table_of(IterationMetric)),
            [
                dict(zip(ROW_COLUMNS, _values(row), strict=True))
                | {"reported_at": row.get("reported_at", now)}
                for row in batch
            ],
        )
    return len(batch)


def series(session: Session, job_id: int, *, points: int = 500) -> list[SeriesPoint]:
    """At most `points` buckets of consecutive iterations, each the mean of its rows.

    Bucketing happens in SQL (floor division of the iteration index: `/` would be true
    division, which PostgreSQL then rounds when cast), so the answer
    costs one indexed scan of the job's rows and returns O(points) rows however long
    the job ran.
    """
    bounds = session.execute(
        select(func.min(IterationMetric.iteration), func.max(IterationMetric.iteration)).where(
            IterationMetric.job_id == job_id
        )
    ).one()
    low, high = bounds
    if low is None:
        return []
    width = max(1, -(-(high - low + 1) // points))  # ceil division
    bucket = ((IterationMetric.iteration - low) // width).label("bucket")
    columns = [func.avg(getattr(IterationMetric, name)).label(name) for name in SERIES_FIELDS]
    query = (
        select(bucket, func.max(IterationMetric.iteration).label("iteration"), *columns)
        .where(IterationMetric.job_id == job_id)
        .group_by(bucket)
        .order_by(bucket)
    )
    return [
        SeriesPoint(
            iteration=int(row.iteration),
            values={
                name: (None if getattr(row, name) is None else float(getattr(row, name)))
                for name in SERIES_FIELDS
            },
        )
        for row in session.execute(query)
    ]


def newest(
    session: Session,
    job_ids: Collection[int],
    columns: tuple[InstrumentedAttribute[Any], ...],
    among: ColumnElement[bool] | None = None,
) -> dict[int, tuple[Any, ...]]:
    """Each job's `columns` at its newest reported iteration (of the rows `among` picks,
    if given), in one query; a job with no such row is absent."""
    if not job_ids:
        return {}
    chosen = IterationMetric.job_id.in_(job_ids)
    newest_rows = (
        select(IterationMetric.job_id, func.max(IterationMetric.iteration).label("iteration"))
        .where(chosen if among is None else and_(chosen, among))
        .group_by(IterationMetric.job_id)
        .subquery()
    )
    rows = session.execute(
        select(IterationMetric.job_id, *columns).join(
            newest_rows,
            and_(
                IterationMetric.job_id == newest_rows.c.job_id,
                IterationMetric.iteration == newest_rows.c.iteration,
            ),
        )
    )
    return {row[0]: tuple(row[1:]) for row in rows}


# A group of iterations' step, as `steady_step` takes it: how many, their sum, the slowest.
STEP_TOTALS = (
    func.count(),
    func.sum(IterationMetric.step_seconds),
    func.max(IterationMetric.step_seconds),
)


def steady_step(count: int, total: float, slowest: float) -> float:
    """The mean step of a group of iterations without its slowest: a run's first
    compiles, autotunes and warms caches (on an H200 30-75x a small job's steady step),
    which a group of one lease would otherwise be charged several times over."""
    return (total - slowest) / (count - 1) if count > 1 else total
