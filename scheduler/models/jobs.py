"""Job rows: submit, read with owner isolation, list with filters, cancel."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import NamedTuple

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from jigsaw.jobspec import JobSpec
from scheduler.core.states import JobState
from scheduler.models.states import transition
from scheduler.models.users import Principal
from scheduler.orm import GPU, Allocation, Event, Job, JobLog, Node, User


def submit(session: Session, spec: JobSpec, owner: Principal) -> Job:
    if owner.user_id is None:
        raise ValueError("only users submit jobs")
    job = Job(
        name=spec.name,
        owner_id=owner.user_id,
        queue=spec.queue,
        priority=spec.priority,
        workers=spec.workers,
        spec=spec.model_dump(mode="json"),
        state=JobState.QUEUED.value,
        code_digest=spec.code,
    )
    session.add(job)
    session.flush()
    session.add(
        Event(
            job_id=job.id,
            kind="transition",
            from_state=None,
            to_state=JobState.QUEUED.value,
            actor=owner.user_name,
            message="submitted",
            created_at=job.created_at,
        )
    )
    return job


def visible_job(session: Session, job_id: int, viewer: Principal) -> Job | None:
    """The job if it exists and the viewer may see it (owner or admin), else None.

    Callers answer 404 for both cases, so a user cannot probe other users' job ids.
    """
    job = session.get(Job, job_id)
    if job is None or not (viewer.is_admin or job.owner_id == viewer.user_id):
        return None
    return job


def list_jobs(
    session: Session,
    viewer: Principal,
    *,
    states: Sequence[JobState] = (),
    owner: str | None = None,
    after_id: int | None = None,
    limit: int = 50,
) -> tuple[list[tuple[Job, str]], int]:
    """A page of (job, owner name), newest first, and the total matching the filters.

    Keyset pagination on id (`after_id` = last id of the previous page): stable while
    jobs are being submitted, and O(page) however deep the page.
    """
    query = select(Job, User.name).join(User, Job.owner_id == User.id)
    if not viewer.is_admin:
        query = query.where(Job.owner_id == viewer.user_id)
    if owner is not None:
        query = query.where(User.name == owner)
    if states:
        query = query.where(Job.state.in_([s.value for s in states]))
    total = session.scalar(select(func.count()).select_from(query.subquery())) or 0
    if after_id is not None:
        query = query.where(Job.id < after_id)
    rows = session.execute(query.order_by(Job.id.desc()).limit(limit)).all()
    return [(job, name) for job, name in rows], total


# What a user may do to a job, and from which states. Narrower than the state machine,
# whose edges also serve the scheduler: RUNNING -> QUEUED is its requeue of a job whose
# agent died, never a user's resume of a running job.
class UserAction(NamedTuple):
    target: JobState
    sources: frozenset[JobState]
    message: str  # the job's message and its event's


USER_ACTIONS: dict[str, UserAction] = {
    "cancel": UserAction(
        JobState.CANCELLED,
        frozenset(state for state in JobState if not state.terminal),
        "cancelled",
    ),
    "suspend": UserAction(JobState.SUSPENDED, frozenset({JobState.RUNNING}), "suspended"),
    "resume": UserAction(JobState.QUEUED, frozenset({JobState.SUSPENDED}), "resumed"),
}


def act(session: Session, job: Job, action: str, actor: Principal) -> Job:
    """Apply a user's action to a job, or raise IllegalTransition (nothing changes)."""
    target, sources, message = USER_ACTIONS[action]
    return transition(
        session, job, target, actor=actor.user_name, message=message, only_from=sources
    )


def cancel(session: Session, job: Job, actor: Principal) -> Job:
    """Cancel a job in any non-terminal state (raises IllegalTransition otherwise).

    The scheduler releases the job's GPUs and stops its workers on its next round.
    """
    return act(session, job, "cancel", actor)


def suspend(session: Session, job: Job, actor: Principal) -> Job:
    """Suspend a RUNNING job: on its next round the scheduler has its workers checkpoint
    at the next iteration boundary and frees its GPUs."""
    return act(session, job, "suspend", actor)


def resume(session: Session, job: Job, actor: Principal) -> Job:
    """Queue a SUSPENDED job again (only a suspended one); it continues from its
    checkpoint wherever it lands."""
    return act(session, job, "resume", actor)


# Jobs that wait for GPUs: queued, or suspended by a policy that will place them again.
_WAITING = (JobState.QUEUED.value, JobState.SUSPENDED.value)


def set_pending_reasons(
    session: Session, reasons: Mapping[int, str | None], *, actor: str, now: datetime
) -> list[int]:
    """Store why each waiting job in `reasons` did not start (None: it did), with a
    `pending` event where a reason appears or changes; the jobs whose reason changed.

    A job that stopped waiting meanwhile is left alone (its transition cleared it)."""
    stored = dict(
        session.execute(
            select(Job.id, Job.pending_reason).where(
                Job.state.in_(_WAITING), Job.pending_reason.is_not(None)
            )
        ).all()
    )
    changed = []
    for job_id in set(reasons) | set(stored):
        reason = reasons.get(job_id)
        if reason == stored.get(job_id):
            continue
        result = session.execute(
            update(Job)
            .where(Job.id == job_id, Job.state.in_(_WAITING))
            .values(pending_reason=reason)
            .execution_options(synchronize_session=False)
        )
        if result.rowcount != 1:  # type: ignore[attr-defined]
            continue
        changed.append(job_id)
        if reason is not None:
            session.add(
                Event(job_id=job_id, kind="pending", actor=actor, message=reason, created_at=now)
            )
    return sorted(changed)


def set_estimated_starts(session: Session, starts: Mapping[int, datetime]) -> None:
    """Store when each waiting job is expected to start; clear it for the other
    waiting jobs that had one."""
    stored = dict(
        session.execute(
            select(Job.id, Job.estimated_start_at).where(
                Job.state.in_(_WAITING), Job.estimated_start_at.is_not(None)
            )
        ).all()
    )
    for job_id in set(starts) | set(stored):
        when = starts.get(job_id)
        if when != stored.get(job_id):
            session.execute(
                update(Job)
                .where(Job.id == job_id, Job.state.in_(_WAITING))
                .values(estimated_start_at=when)
                .execution_options(synchronize_session=False)
            )


def gpus_registered(session: Session) -> int:
    """Every GPU the cluster has registered, on nodes alive or not: the most GPUs any
    job could ever be given."""
    return session.scalar(select(func.count()).select_from(GPU)) or 0


def logs(session: Session, job_id: int, *, after_id: int = 0, limit: int = 1000) -> list[JobLog]:
    """Log lines of the job with ids above `after_id`, oldest first."""
    return list(
        session.scalars(
            select(JobLog)
            .where(JobLog.job_id == job_id, JobLog.id > after_id)
            .order_by(JobLog.id)
            .limit(limit)
        )
    )


def count_by_state(session: Session) -> dict[JobState, int]:
    """How many jobs are in each state (states with none are absent); one indexed scan."""
    rows = session.execute(select(Job.state, func.count()).group_by(Job.state))
    return {JobState(state): count for state, count in rows}


def events(session: Session, job_id: int, *, after_id: int = 0, limit: int = 500) -> list[Event]:
    return list(
        session.scalars(
            select(Event)
            .where(Event.job_id == job_id, Event.id > after_id)
            .order_by(Event.id)
            .limit(limit)
        )
    )


def allocations(
    session: Session, job_id: int, *, limit: int = 500
) -> list[tuple[Allocation, str, int]]:
    """The job's holds on GPUs, newest lease first, with each GPU's node name and index:
    where it ran, under which SPB configuration, for which iterations."""
    rows = session.execute(
        select(Allocation, Node.name, GPU.index)
        .join(GPU, GPU.id == Allocation.gpu_id)
        .join(Node, Node.id == GPU.node_id)
        .where(Allocation.job_id == job_id)
        .order_by(Allocation.id.desc())
        .limit(limit)
    ).all()
    return [(allocation, node, index) for allocation, node, index in rows]


def owners(session: Session, job_ids: Iterable[int]) -> dict[int, int]:
    """Owner id of each of these jobs that still exists."""
    ids = set(job_ids)
    if not ids:
        return {}
    rows = session.execute(select(Job.id, Job.owner_id).where(Job.id.in_(ids)))
    return {job_id: owner_id for job_id, owner_id in rows}


def get(session: Session, job_id: int) -> Job | None:
    """The job, whoever owns it (the scheduler's view; the API uses `visible_job`)."""
    return session.get(Job, job_id)


def by_id(session: Session, job_ids: Iterable[int]) -> dict[int, Job]:
    """These jobs (those that exist), keyed by id."""
    return {job.id: job for job in session.scalars(select(Job).where(Job.id.in_(set(job_ids))))}


def states(session: Session, job_ids: Iterable[int]) -> dict[int, str]:
    """The state of each of these jobs that exists."""
    rows = session.execute(select(Job.id, Job.state).where(Job.id.in_(set(job_ids))))
    return {job_id: state for job_id, state in rows}
