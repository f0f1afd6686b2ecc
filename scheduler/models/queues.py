"""Queue rows: create, read with usage, change, delete; who may submit where; the
queues as the quota layer sees them."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from scheduler.core.quota import DEFAULT_QUEUE, Queue, Quotas
from scheduler.core.states import JobState, SuspendedBy
from scheduler.orm import Job
from scheduler.orm import Queue as QueueRow

# Jobs that count against a queue: waiting for GPUs, or holding them.
_ACTIVE = (JobState.QUEUED, JobState.SCHEDULED, JobState.RUNNING, JobState.SUSPENDED)
_HOLDING = (JobState.SCHEDULED.value, JobState.RUNNING.value)
# Fields an admin may set; `parent` is a name here, an id in the table.
FIELDS = ("quota", "borrowing_limit", "weight", "parent", "users")


class QueueNotFound(LookupError):
    pass


class QueueConflict(Exception):
    """The change contradicts the queues as they are (a name taken, a queue in use)."""


class QueueInvalid(ValueError):
    """A field whose value the queues cannot take; `field` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class QueueInfo:
    """A queue with its parent's name and what its jobs use now."""

    row: QueueRow
    parent: str | None
    pending_jobs: int  # waiting for GPUs (queued, or suspended to be placed again)
    admitted_jobs: int  # holding GPUs
    gpus_in_use: int

    @property
    def borrowed_gpus(self) -> int:
        """GPUs held beyond the quota (a quota of None borrows nothing by definition)."""
        quota = self.row.quota
        return 0 if quota is None else max(self.gpus_in_use - quota, 0)


def _usage(session: Session) -> dict[str, tuple[int, int, int]]:
    """(pending, admitted, GPUs in use) by queue name, in one grouped scan."""
    holding = Job.state.in_(_HOLDING)
    rows = session.execute(
        select(
            Job.queue,
            func.sum(case((holding, 0), else_=1)),
            func.sum(case((holding, 1), else_=0)),
            func.sum(case((holding, Job.workers), else_=0)),
        )
        .where(Job.state.in_([state.value for state in _ACTIVE]))
        .group_by(Job.queue)
    )
    return {name: (int(p or 0), int(a or 0), int(g or 0)) for name, p, a, g in rows}


def list_queues(session: Session) -> list[QueueInfo]:
    rows = list(session.scalars(select(QueueRow).order_by(QueueRow.name)))
    names = {row.id: row.name for row in rows}
    usage = _usage(session)
    return [
        QueueInfo(
            row,
            names.get(row.parent_id) if row.parent_id is not None else None,
            *usage.get(row.name, (0, 0, 0)),
        )
        for row in rows
    ]


def get_queue(session: Session, name: str) -> QueueInfo:
    for info in list_queues(session):
        if info.row.name == name:
            return info
    raise QueueNotFound(name)


def create_queue(session: Session, name: str, fields: dict[str, Any]) -> QueueInfo:
    if session.scalar(select(QueueRow.id).where(QueueRow.name == name)) is not None:
        raise QueueConflict(f"queue {name} exists")
    row = QueueRow(name=name, users=[])
    _apply(session, row, fields)
    session.add(row)
    session.flush()
    return get_queue(session, name)


def update_queue(session: Session, name: str, fields: dict[str, Any]) -> QueueInfo:
    row = session.scalar(select(QueueRow).where(QueueRow.name == name).with_for_update())
    if row is None:
        raise QueueNotFound(name)
    _apply(session, row, fields)
    session.flush()
    return get_queue(session, name)


def delete_queue(session: Session, name: str) -> None:
    """Delete a queue no active job names and no queue has as parent."""
    row = session.scalar(select(QueueRow).where(QueueRow.name == name).with_for_update())
    if row is None:
        raise QueueNotFound(name)
    if name == DEFAULT_QUEUE:
        raise QueueConflict("the default queue cannot be deleted")
    active = session.scalar(
        select(func.count())
        .select_from(Job)
        .where(Job.queue == name, Job.state.in_([state.value for state in _ACTIVE]))
    )
    if active:
        raise QueueConflict(f"queue {name} has {active} active job(s); cancel or let them end")
    if session.scalar(select(QueueRow.id).where(QueueRow.parent_id == row.id).limit(1)):
        raise QueueConflict(f"queue {name} is the parent of other queues")
    session.delete(row)


def _apply(session: Session, row: QueueRow, fields: dict[str, Any]) -> None:
    """Set the given fields, checking what only the other queues can tell."""
    for key, value in fields.items():
        if key == "parent":
            row.parent_id = None if value is None else _parent_id(session, row, value)
        elif key == "users":
            row.users = sorted(set(value))
        else:
            setattr(row, key, value)
    if row.parent_id is not None and row.id is not None:
        child = session.scalar(select(QueueRow.id).where(QueueRow.parent_id == row.id).limit(1))
        if child is not None:
            raise QueueInvalid("parent", "a queue with child queues cannot have a parent")


def _parent_id(session: Session, row: QueueRow, name: str) -> int:
    parent = session.scalar(select(QueueRow).where(QueueRow.name == name))
    if parent is None:
        raise QueueInvalid("parent", f"no queue named {name}")
    if parent.id == row.id:
        raise QueueInvalid("parent", "a queue cannot be its own parent")
    if parent.parent_id is not None:
        raise QueueInvalid("parent", f"queue {name} has a parent itself (one level only)")
    return parent.id


def submit_refusal(session: Session, queue: str, user: str) -> str | None:
    """Why `user` may not submit to `queue` (None: they may)."""
    users = session.scalar(select(QueueRow.users).where(QueueRow.name == queue))
    if users is None:
        return f"no queue named {queue}; `jigsaw queue list` shows the queues"
    if users and user not in users:
        return f"user {user} may not submit to queue {queue}"
    return None


def quotas(session: Session) -> Quotas:
    """Every queue as the quota layer sees it."""
    rows = list(session.scalars(select(QueueRow)))
    names = {row.id: row.name for row in rows}
    return Quotas(
        Queue(
            name=row.name,
            quota=row.quota,
            borrowing_limit=row.borrowing_limit,
            weight=row.weight,
            parent=names.get(row.parent_id) if row.parent_id is not None else None,
        )
        for row in rows
    )


def waiting_positions(session: Session, job_ids: list[int]) -> dict[int, tuple[int, int]]:
    """For each of these jobs that waits for GPUs: its 1-based position among the
    waiting jobs of its queue and among all, in the order queues are served (priority,
    then submission). One scan of the waiting jobs, an index range on state."""
    if not job_ids:
        return {}
    # A suspended job waits only when a policy suspended it; a user's suspension does not.
    waiting = (Job.state == JobState.QUEUED.value) | (
        (Job.state == JobState.SUSPENDED.value) & (Job.suspended_by == SuspendedBy.POLICY.value)
    )
    rows = session.execute(
        select(Job.id, Job.queue)
        .where(waiting)
        .order_by(Job.priority.desc(), Job.created_at, Job.id)
    )
    wanted = set(job_ids)
    in_queue: dict[str, int] = defaultdict(int)
    positions: dict[int, tuple[int, int]] = {}
    for overall, (job_id, queue) in enumerate(rows, start=1):
        in_queue[queue] += 1
        if job_id in wanted:
            positions[job_id] = (in_queue[queue], overall)
    return positions
