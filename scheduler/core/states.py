"""The job state machine: its states and the edges between them.

    QUEUED -> SCHEDULED -> RUNNING <-> SUSPENDED -> SUCCEEDED | FAILED | CANCELLED
    (and back to QUEUED when a launch fails, an agent dies, a crash is retried or a
    suspended job is resumed)

This module is the table of edges; scheduler.models.states applies them to the database.
"""

from __future__ import annotations

from collections.abc import Collection
from enum import StrEnum


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


class SuspendedBy(StrEnum):
    """Who suspended a SUSPENDED job, which says what it waits for."""

    USER = "user"  # waits for its user to resume it
    POLICY = "policy"  # waits to be placed again, like a queued job
    DRAIN = "drain"  # `drain --now`: the loop queues it again once its processes exit
    RESIZE = "resize"  # checkpointed for a resize: the loop relaunches it on its new gang


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


def allowed(current: JobState, target: JobState, only_from: Collection[JobState] | None) -> bool:
    """An edge of the machine, and one the caller allows (`only_from`, None: any)."""
    return can_transition(current, target) and (only_from is None or current in only_from)
