"""Job transitions applied to the database: the only place a job's state changes.

Every accepted transition is a compare-and-set UPDATE (`WHERE state = <expected>`), so
two processes racing on one job (the API cancelling while the scheduler places it) can
never both win, and writes an Event row in the same transaction.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from sqlalchemy import update
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from scheduler.core.states import IllegalTransition, JobState, SuspendedBy, allowed
from scheduler.orm import Event, Job, utcnow


def transition(
    session: Session,
    job: Job,
    target: JobState,
    *,
    actor: str,
    message: str = "",
    data: dict[str, Any] | None = None,
    only_from: Collection[JobState] | None = None,
    suspended_by: SuspendedBy = SuspendedBy.USER,
) -> Job:
    """Move `job` to `target`, or raise IllegalTransition; records an Event.

    `only_from` narrows the edges this caller may take: a user's resume is SUSPENDED ->
    QUEUED only, although RUNNING -> QUEUED is an edge (the scheduler requeues a job
    whose agent died). The job row is re-read under the compare-and-set, so a stale
    `job` object from an earlier query cannot overwrite a newer state. A suspension
    records who made it (`suspended_by`); leaving SUSPENDED clears it.
    """
    current = JobState(job.state)
    if not allowed(current, target, only_from):
        raise IllegalTransition(job.id, current, target, only_from)
    now = utcnow()
    # A pending reason explains one wait; the scheduler states it again if it still holds.
    values: dict[str, Any] = {"state": target.value, "updated_at": now, "pending_reason": None}
    if message:
        values["message"] = message
    if target is JobState.SUSPENDED:
        values["suspended_by"] = suspended_by.value
    elif current is JobState.SUSPENDED:
        values["suspended_by"] = None
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
        if allowed(fresh, target, only_from):
            return transition(
                session,
                job,
                target,
                actor=actor,
                message=message,
                data=data,
                only_from=only_from,
                suspended_by=suspended_by,
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
