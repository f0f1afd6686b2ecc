"""Per-iteration metrics: batched writes and downsampled reads."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, insert, select
from sqlalchemy.orm import Session

from scheduler.orm import IterationMetric

SERIES_FIELDS = (
    "step_seconds",
    "compute_seconds",
    "comm_seconds",
    "samples_per_second",
    "loss",
    "utilization",
)


@dataclass(frozen=True)
class SeriesPoint:
    iteration: int
    values: dict[str, float | None]


def record(session: Session, rows: Iterable[Mapping[str, Any]]) -> int:
    """Insert many iteration rows in one executemany; returns how many."""
    batch = list(rows)
    if batch:
        session.execute(insert(IterationMetric), batch)
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
