"""What a resize reads and writes: the gang it runs on and the new one's GPUs, the
allocations an in-place growth takes and an in-place shrink gives back, and the cost
it measured."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from scheduler.dispatch import Worker
from scheduler.orm import GPU, Agent, Allocation, Event, IterationMetric, Node

RESIZED = "resized"  # the event kind a finished resize writes, with its cost
# How a resize was done (its event's `mechanism`).
IN_PLACE = "in-place"
RESTART = "checkpoint-restart"


def free_workers(session: Session, gpu_ids: Sequence[int]) -> tuple[Worker, ...] | None:
    """The ranks of a gang on these GPUs (rank r on gpu_ids[r]), or None unless every one
    exists, is held by no job, and is on a schedulable node with a live agent."""
    rows = {
        gpu_id: (node_id, name, index, address)
        for gpu_id, node_id, name, index, address in session.execute(
            select(GPU.id, Node.id, Node.name, GPU.index, Node.address)
            .join(Node, Node.id == GPU.node_id)
            .join(Agent, Agent.node_id == Node.id)
            .where(
                GPU.id.in_(gpu_ids),
                Agent.alive.is_(True),
                Node.schedulable.is_(True),
                Node.drained_at.is_(None),
            )
        )
    }
    held = session.scalar(
        select(func.count())
        .select_from(Allocation)
        .where(Allocation.gpu_id.in_(gpu_ids), Allocation.released_at.is_(None))
    )
    if held or len(rows) != len(gpu_ids):
        return None
    return tuple(Worker(rank, gpu_id, *rows[gpu_id]) for rank, gpu_id in enumerate(gpu_ids))


def gang(session: Session, job_id: int) -> tuple[int, tuple[Worker, ...]]:
    """The attempt the job runs and its ranks, by rank (none: it holds no GPU)."""
    rows = session.execute(
        select(
            Allocation.attempt,
            Allocation.rank,
            GPU.id,
            Node.id,
            Node.name,
            GPU.index,
            Node.address,
        )
        .join(GPU, GPU.id == Allocation.gpu_id)
        .join(Node, Node.id == GPU.node_id)
        .where(Allocation.job_id == job_id, Allocation.released_at.is_(None))
        .order_by(Allocation.rank)
    ).all()
    attempt = max((row[0] for row in rows), default=0)
    return attempt, tuple(Worker(*row[1:]) for row in rows)


def shrink(
    session: Session, job_id: int, node_name: str, indices: Sequence[int], now: datetime
) -> tuple[int, tuple[int, ...]] | None:
    """The job now runs on GPUs `indices` of `node_name` (by rank): its other allocations
    end and those kept take their new ranks. Returns how many GPUs it held and those it
    holds (by rank), or None, changing nothing, unless they are some of the GPUs it held."""
    held = {
        (node, index): allocation
        for allocation, node, index in session.execute(
            select(Allocation, Node.name, GPU.index)
            .join(GPU, GPU.id == Allocation.gpu_id)
            .join(Node, Node.id == GPU.node_id)
            .where(Allocation.job_id == job_id, Allocation.released_at.is_(None))
        )
    }
    keys = [(node_name, index) for index in indices]
    if not keys or len(set(keys)) < len(keys) or not set(keys) <= set(held):
        return None
    for key, allocation in held.items():
        if key not in keys:
            allocation.released_at = now
    for rank, key in enumerate(keys):
        held[key].rank = rank
    return len(held), tuple(held[key].gpu_id for key in keys)


def hold(session: Session, job_id: int, joiners: Sequence[Worker], now: datetime) -> None:
    """The running job also holds the GPUs of a growth in place (`joiners`, ranks and
    GPUs of the new gang) from now, in its current run's lease and attempt."""
    if not joiners:
        return
    lease = session.scalars(
        select(Allocation)
        .where(Allocation.job_id == job_id, Allocation.released_at.is_(None))
        .order_by(Allocation.rank)
        .limit(1)
    ).one()
    session.add_all(
        Allocation(
            job_id=job_id,
            gpu_id=worker.gpu_id,
            rank=worker.rank,
            spb=dict(lease.spb),
            config_version=lease.config_version,
            attempt=lease.attempt,
            lease_start_iteration=lease.lease_start_iteration,
            lease_iterations=lease.lease_iterations,
            created_at=now,
        )
        for worker in joiners
    )


def record_asked(
    session: Session, job_id: int, gpu_ids: Sequence[int], held: int, *, actor: str, now: datetime
) -> None:
    """The event of a resize asked of a running job, before it reaches its boundary."""
    session.add(
        Event(
            job_id=job_id,
            kind="resize",
            actor=actor,
            message=f"to {len(gpu_ids)} GPU(s) at the next boundary",
            data={"gpu_ids": list(gpu_ids), "from_workers": held},
            created_at=now,
        )
    )


def resize_seconds(session: Session, job_id: int, boundary: int) -> float | None:
    """From the old gang's report of the boundary's iteration to the new gang's first
    report after it, as the scheduler received them (both are sent at once: a run's
    last records on its exit, its first record alone); None until both are in."""
    at_boundary = session.scalar(
        select(func.max(IterationMetric.reported_at)).where(
            IterationMetric.job_id == job_id, IterationMetric.iteration == boundary
        )
    )
    first_after = session.scalar(
        select(func.min(IterationMetric.reported_at)).where(
            IterationMetric.job_id == job_id, IterationMetric.iteration == boundary + 1
        )
    )
    if at_boundary is None or first_after is None:
        return None
    return max((first_after - at_boundary).total_seconds(), 0.0)


def record_resized(
    session: Session, job_id: int, details: dict[str, Any], *, actor: str, now: datetime
) -> None:
    """The event a policy reads a resize's measured cost from."""
    session.add(
        Event(
            job_id=job_id,
            kind=RESIZED,
            actor=actor,
            message=(
                f"resized from {details['from_workers']} to {details['to_workers']} GPU(s) "
                f"at iteration {details['iteration']} in {details['seconds']:.2f} s "
                f"({'in place' if details.get('mechanism') == IN_PLACE else 'by a restart'})"
            ),
            data=details,
            created_at=now,
        )
    )


RECENT_RESIZES = 20  # of any job: what a job that never resized is expected to pay


def measured_costs(
    session: Session,
    job_ids: Sequence[int],
    read: Callable[[Any], float | None] | None = None,
) -> dict[int, float]:
    """What moving each job (a move: a restart) is expected to cost, in seconds: the
    mean of its own restarted resizes, else of the cluster's newest `RECENT_RESIZES`
    (absent: none measured yet); in-place shrinks, an order of magnitude cheaper, would
    understate it. With `read=grown_in_place_seconds`, what growing it in place is
    expected to cost, from those growths alike. Two queries."""
    if not job_ids:
        return {}
    read = read or _restart_seconds
    own: dict[int, list[float]] = {}
    for job_id, data in session.execute(
        select(Event.job_id, Event.data).where(Event.kind == RESIZED, Event.job_id.in_(job_ids))
    ):
        seconds = read(data)
        if seconds is not None:
            own.setdefault(job_id, []).append(seconds)
    recent = newest_seconds(session, RESIZED, RECENT_RESIZES, read)
    costs = {job_id: sum(values) / len(values) for job_id, values in own.items()}
    if recent:
        typical = sum(recent) / len(recent)
        costs.update({job_id: typical for job_id in job_ids if job_id not in costs})
    return costs


def newest_seconds(
    session: Session,
    kind: str,
    limit: int,
    read: Callable[[Any], float | None] | None = None,
) -> list[float]:
    """The `seconds` the newest `limit` events of `kind` measured (a cost's events), as
    `read` takes them from an event's data (None: not such a cost; default: any)."""
    read = read or _seconds
    return [
        seconds
        for data in session.scalars(
            select(Event.data).where(Event.kind == kind).order_by(Event.id.desc()).limit(limit)
        )
        if (seconds := read(data)) is not None
    ]


def _restart_seconds(data: Any) -> float | None:
    if isinstance(data, dict) and data.get("mechanism") == IN_PLACE:
        return None
    return _seconds(data)


def grown_in_place_seconds(data: Any) -> float | None:
    """The cost a `resized` event measured when it grew its job in place, else None."""
    if not isinstance(data, dict) or data.get("mechanism") != IN_PLACE:
        return None
    before, after = data.get("from_workers"), data.get("to_workers")
    if not isinstance(before, int) or not isinstance(after, int) or after <= before:
        return None
    return _seconds(data)


def _seconds(data: Any) -> float | None:
    seconds = data.get("seconds") if isinstance(data, dict) else None
    if not isinstance(seconds, int | float) or not 0 <= seconds < math.inf:
        return None
    return float(seconds)
