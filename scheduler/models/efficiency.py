"""Cluster efficiency over a recent window (the dashboard's "last hour" and /metrics).

    allocation = GPU-seconds held by jobs / GPU-seconds available
    efficiency = GPU-seconds held x the holder's measured utilization / GPU-seconds available

Available is the GPUs of nodes whose agent is alive now, times the window (a node that
joined or died inside the window counts as if it had been there all along: this reads
the cluster's current size, not its history). A job's utilization is the mean of what
its iterations reported inside the window; a job that reported none counts as 0, so
efficiency never claims work nobody measured. This is live telemetry; the simulator's
cluster efficiency (useful progress per GPU-second, with SPB's statistical efficiency)
is defined on whole workloads instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from scheduler.orm import GPU, Agent, Allocation, IterationMetric, utcnow

DEFAULT_WINDOW = timedelta(hours=1)


@dataclass(frozen=True)
class Efficiency:
    window_seconds: float
    available_gpu_seconds: float
    allocated_gpu_seconds: float
    utilized_gpu_seconds: float

    @property
    def allocation(self) -> float | None:
        if not self.available_gpu_seconds:
            return None
        return min(self.allocated_gpu_seconds / self.available_gpu_seconds, 1.0)

    @property
    def efficiency(self) -> float | None:
        if not self.available_gpu_seconds:
            return None
        return min(self.utilized_gpu_seconds / self.available_gpu_seconds, 1.0)


def cluster_efficiency(
    session: Session, now: datetime | None = None, window: timedelta = DEFAULT_WINDOW
) -> Efficiency:
    """Three queries: alive GPUs, allocations overlapping the window, mean utilizations."""
    now = now or utcnow()
    start = now - window
    gpus = session.scalar(
        select(func.count(GPU.id))
        .join(Agent, Agent.node_id == GPU.node_id)
        .where(Agent.alive.is_(True))
    )
    held: dict[int, float] = {}
    for job_id, created, released in session.execute(
        select(Allocation.job_id, Allocation.created_at, Allocation.released_at).where(
            Allocation.created_at < now,
            Allocation.released_at.is_(None) | (Allocation.released_at > start),
        )
    ):
        end = min(released or now, now)
        seconds = (end - max(created, start)).total_seconds()
        if seconds > 0:
            held[job_id] = held.get(job_id, 0.0) + seconds
    utilization: dict[int, float] = {}
    if held:
        utilization = {
            job_id: float(mean)
            for job_id, mean in session.execute(
                select(IterationMetric.job_id, func.avg(IterationMetric.utilization))
                .where(
                    IterationMetric.job_id.in_(held),
                    IterationMetric.reported_at >= start,
                    IterationMetric.utilization.is_not(None),
                )
                .group_by(IterationMetric.job_id)
            )
            if mean is not None
        }
    return Efficiency(
        window_seconds=window.total_seconds(),
        available_gpu_seconds=(gpus or 0) * window.total_seconds(),
        allocated_gpu_seconds=sum(held.values()),
        utilized_gpu_seconds=sum(
            seconds * min(max(utilization.get(job_id, 0.0), 0.0), 1.0)
            for job_id, seconds in held.items()
        ),
    )
