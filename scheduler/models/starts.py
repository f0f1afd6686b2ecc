"""What starting a job costs on this cluster, measured: from its placement to its first
iteration's report (the process, the runtime's set-up, restoring a checkpoint, the first
step). JigSaw weighs it before displacing a running job for a waiting one."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from scheduler.models.resizes import newest_seconds
from scheduler.orm import Allocation, Event, IterationMetric

STARTED = "started"  # the event kind a measured start writes, with its seconds
RECENT_STARTS = 20  # the newest, of any job: what the next start is expected to cost


def start_seconds(session: Session, job_id: int, first_iteration: int) -> float | None:
    """From the job's current allocation to the report of `first_iteration` (both as the
    scheduler stored them); None until that report is in."""
    placed = session.scalar(
        select(func.min(Allocation.created_at)).where(
            Allocation.job_id == job_id, Allocation.released_at.is_(None)
        )
    )
    reported = session.scalar(
        select(func.min(IterationMetric.reported_at)).where(
            IterationMetric.job_id == job_id, IterationMetric.iteration == first_iteration
        )
    )
    if placed is None or reported is None:
        return None
    return max((reported - placed).total_seconds(), 0.0)


def record_started(
    session: Session, job_id: int, iteration: int, seconds: float, *, actor: str
) -> None:
    session.add(
        Event(
            job_id=job_id,
            kind=STARTED,
            actor=actor,
            message=f"first iteration ({iteration}) reported {seconds:.2f} s after placement",
            data={"iteration": iteration, "seconds": seconds},
        )
    )


def typical_start_seconds(session: Session) -> float | None:
    """The mean of the newest `RECENT_STARTS` measured starts (None: none yet)."""
    measured = newest_seconds(session, STARTED, RECENT_STARTS)
    return sum(measured) / len(measured) if measured else None
