"""The job state machine: the only place a job's state changes.

    QUEUED -> SCHEDULED -> RUNNING <-> SUSPENDED -> SUCCEEDED | FAILED | CANCELLED
    (and back to QUEUED when a launch fails, an agent dies, a crash is retried or a
    suspended job is resumed)

Every accepted transition is a compare-and-set UPDATE (`WHERE state = <expected>`), so
two processes racing on one job (the API cancelling while the scheduler places it) can
never both win, and writes an Event row in the same transaction.
"""

from __future__ import annotations

from collections.abc import Collection
from enum import StrEnum
from typing import Any

from sqlalchemy import update
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from scheduler.orm import Event, Job, utcnow


class JobState(StrEnum):
    QUEUED = "QUEUED"
    SCHEDULED = "SCHEDULED"
    RUNNING = "RUNNING"
    SUSPENDED = "SUSPENDED"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})

# Why each edge exists:
# SCHEDULED -> QUEUED: the launch could not happen (agent lost before it started).
# RUNNING -> QUEUED: the job's agent died; it resumes from its checkpoint elsewhere.
# SUSPENDED -> SCHEDULED: resumed on newly chosen GPUs (possibly another node).
# SUSPENDED -> RUNNING: resumed on GPUs it was already leased.
# SUSPENDED -> QUEUED: a user resumed it; it waits for a placement like a new job.
ALLOWED: dict[JobState, frozenset[JobState]] = {
    JobState.QUEUED: frozenset({JobState.SCHEDULED, JobState.CANCELLED}),
    JobState.SCHEDULED: frozenset(
        {JobState.RUNNING, JobState.QUEUED, JobState.FAILED, JobState.CANCELLED}
    ),
    JobState.RUNNING: frozenset(
        {
            JobState.SUSPENDED,
            JobState.QUEUED,
            JobState.SUCCEEDED,
            JobState.FAILED,
            JobState.CANCELLED,
        }
    ),
    JobState.SUSPENDED: frozenset(
        {
            JobState.SCHEDULED,
            JobState.RUNNING,
            JobState.QUEUED,
            JobState.FAILED,
            JobState.CANCELLED,
        }
    ),
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
}


class IllegalTransition(Exception):
    """The requested transition is not an edge of the state machine from the job's state,
    or not one the caller allows (`only_from`)."""

    def __init__(
        self,
        job_id: int,
        current: JobState,
        target: JobState,
        only_from: Collection[JobState] | None = None,
    ) -> None:
        self.job_id = job_id
        self.current = current
        self.target = target
        message = f"job {job_id} is {current.value}; it cannot become {target.value}"
        if only_from is not None and current not in only_from:
            message += " here (only from " + ", ".join(sorted(s.value for s in only_from)) + ")"
        super().__init__(message)


def can_transition(current: JobState, target: JobState) -> bool:
    return target in ALLOWED[current]


def _allowed(current: JobState, target: JobState, only_from: Collection[JobState] | None) -> bool:
    return can_transition(current, target) and (only_from is None or current in only_from)


def transition(
    session: Session,
    job: Job,
    target: JobState,
    *,
    actor: str,
    message: str = "",
    data: dict[str, Any] | None = None,
    only_from: Collection[JobState] | None = None,
) -> Job:
    """Move `job` to `target`, or raise IllegalTransition; records an Event.

    `only_from` narrows the edges this caller may take: a user's resume is SUSPENDED ->
    QUEUED only, although RUNNING -> QUEUED is an edge (the scheduler requeues a job
    whose agent died). The job row is re-read under the compare-and-set, so a stale
    `job` object from an earlier query cannot overwrite a newer state.
    """
    current = JobState(job.state)
    if not _allowed(current, target, only_from):
        raise IllegalTransition(job.id, current, target, only_from)
    now = utcnow()
    # A pending reason explains one wait; the scheduler states it again if it still holds.
    values: dict[str, Any] = {"state": target.value, "updated_at": now, "pending_reason": None}
    if message:
        values["message"] = message
    if target is JobState.RUNNING and job.started_at is None:
        values["started_at"] = now
    if target.terminal:
        values["finished_at"] = now
    result = session.execute(
        update(Job)
        .where(Job.id == job.id, Job.state == current.value)
        .values(**values)
        .execution_options(synchronize_session=False)
    )
    if result.rowcount != 1:  # type: ignore[attr-defined]
        # Somebody else moved the job first: report against the state they left.
        session.refresh(job)
        fresh = JobState(job.state)
        if _allowed(fresh, target, only_from):
            return transition(
                session, job, target, actor=actor, message=message, data=data, only_from=only_from
            )
        raise IllegalTransition(job.id, fresh, target, only_from)
    session.add(
        Event(
            job_id=job.id,
            kind="transition",
            from_state=current.value,
            to_state=target.value,
            actor=actor,
            message=message,
            data=data or {},
            created_at=now,
        )
    )
    for key, value in values.items():
        set_committed_value(job, key, value)
    return job
