"""Allocations (a job's hold on GPUs): leases, releases, reconfigurations, and which jobs
hold what where, for the scheduler loop and the simulated nodes of `jigsaw up`."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from scheduler.core.states import JobState
from scheduler.orm import GPU, Allocation, Event, Job, Node


def release(session: Session, job_ids: Iterable[int], now: datetime) -> None:
    """End every active allocation of these jobs."""
    ids = list(job_ids)
    if ids:
        session.execute(
            update(Allocation)
            .where(Allocation.job_id.in_(ids), Allocation.released_at.is_(None))
            .values(released_at=now)
            .execution_options(synchronize_session=False)
        )


def holders_on_nodes(session: Session, node_ids: Collection[int]) -> list[Job]:
    """The jobs holding an active allocation on any GPU of these nodes."""
    # A subquery, not DISTINCT over jobs: PostgreSQL cannot compare JSON columns.
    holding = (
        select(Allocation.job_id)
        .join(GPU, GPU.id == Allocation.gpu_id)
        .where(GPU.node_id.in_(list(node_ids)), Allocation.released_at.is_(None))
    )
    return list(session.scalars(select(Job).where(Job.id.in_(holding))))


def virtual_holders(session: Session) -> list[Job]:
    """The jobs holding an active allocation on a virtual (simulated) GPU."""
    holding = (
        select(Allocation.job_id)
        .join(GPU, GPU.id == Allocation.gpu_id)
        .where(GPU.virtual.is_(True), Allocation.released_at.is_(None))
    )
    return list(session.scalars(select(Job).where(Job.id.in_(holding))))


def held_in(session: Session, states: Iterable[JobState]) -> list[int]:
    """Ids of the jobs in these states that still hold an active allocation."""
    return list(
        session.scalars(
            select(Allocation.job_id)
            .join(Job, Job.id == Allocation.job_id)
            .where(
                Allocation.released_at.is_(None),
                Job.state.in_([state.value for state in states]),
            )
            .distinct()
        )
    )


def placed_nodes(
    session: Session, job_ids: Iterable[int], node_names: Iterable[str]
) -> dict[int, set[str]]:
    """The nodes each job is allocated on, for these jobs and every job allocated on
    these nodes."""
    placed: dict[int, set[str]] = {}
    for job_id, node_name in session.execute(
        select(Allocation.job_id, Node.name)
        .join(GPU, GPU.id == Allocation.gpu_id)
        .join(Node, Node.id == GPU.node_id)
        .where(
            Allocation.released_at.is_(None),
            Allocation.job_id.in_(list(job_ids)) | Node.name.in_(list(node_names)),
        )
    ):
        placed.setdefault(job_id, set()).add(node_name)
    return placed


@dataclass(frozen=True)
class Lease:
    """What a placement gives a job: its GPUs by rank, and its first lease."""

    gpu_ids: tuple[int, ...]
    nodes: tuple[str, ...]  # the node of each rank
    spb: Mapping[str, Any]
    lease_iterations: int


def lease(
    session: Session, job: Job, lease: Lease, *, actor: str, policy: str, now: datetime
) -> int:
    """Allocate the job its GPUs (it was just SCHEDULED) with a decision event; counts
    and returns the attempt, so that no two launches ever carry the same one."""
    job.attempts += 1
    session.add_all(
        Allocation(
            job_id=job.id,
            gpu_id=gpu_id,
            rank=rank,
            spb=dict(lease.spb),
            lease_start_iteration=job.iterations_done,
            lease_iterations=lease.lease_iterations,
            attempt=job.attempts,
            created_at=now,
        )
        for rank, gpu_id in enumerate(lease.gpu_ids)
    )
    session.add(
        Event(
            job_id=job.id,
            kind="decision",
            actor=actor,
            message=f"{len(lease.gpu_ids)} GPU(s) on {sorted(set(lease.nodes))}",
            data={
                "policy": policy,
                "gpu_ids": list(lease.gpu_ids),
                "nodes": list(lease.nodes),
                "spb": dict(lease.spb),
            },
        )
    )
    return job.attempts


def reconfigure(
    session: Session,
    job: Job,
    spb: Mapping[str, Any],
    *,
    actor: str,
    policy: str,
    now: datetime,
) -> int | None:
    """Give a RUNNING job's allocations this SPB configuration and the next version,
    with a `reconfigure` event; the new version, or None when they have it already.
    Raises LookupError when the job holds no allocation."""
    held = session.scalars(
        select(Allocation).where(Allocation.job_id == job.id, Allocation.released_at.is_(None))
    ).all()
    if not held:
        raise LookupError(f"job {job.id} holds no GPUs")
    if all(allocation.spb == spb for allocation in held):
        return None
    version = max(allocation.config_version for allocation in held) + 1
    for allocation in held:
        allocation.spb = dict(spb)
        allocation.config_version = version
    session.add(
        Event(
            job_id=job.id,
            kind="reconfigure",
            actor=actor,
            message=f"SPB {dict(spb) or 'off'} from iteration {job.iterations_done}",
            data={
                "policy": policy,
                "spb": dict(spb),
                "config_version": version,
                "iteration": job.iterations_done,
            },
            created_at=now,
        )
    )
    return version
