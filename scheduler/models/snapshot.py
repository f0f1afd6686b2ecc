"""Read the cluster into a `ClusterSnapshot` (scheduler.core.snapshot) for one round."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from typing import Any

from pydantic import TypeAdapter, ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from jigsaw.jobspec import JobSpec, SPBSetting
from scheduler.core.snapshot import (
    ACTIVE_STATES,
    ClusterSnapshot,
    GPUView,
    JobView,
    NodeView,
)
from scheduler.core.states import JobState, SuspendedBy
from scheduler.models.measured import ActiveJob, colocated_slowdowns, job_models
from scheduler.models.resizes import grown_in_place_seconds, measured_costs
from scheduler.models.starts import typical_start_seconds
from scheduler.orm import GPU, Agent, Allocation, Job, Node

# A stored spec was validated at submission: only its SPB setting is parsed again.
_SPB_SETTING: TypeAdapter[SPBSetting] = TypeAdapter(SPBSetting)


def build_snapshot(session: Session, now: datetime) -> ClusterSnapshot:
    """Read the cluster in nine queries, whatever its size (nodes, GPUs, holds, service,
    jobs, the newest submission, the jobs' recent iterations and SPB profiles for their
    models, and their measured slowdowns beside co-runners); with elastic or adaptive
    jobs, four more (their steps by size, their gradient noise, and the measured cost of
    resizes)."""
    # A node without an agent, or whose agent timed out, offers no capacity; a removed
    # node is not part of the cluster.
    node_rows = session.execute(
        select(Node.id, Node.name, Agent.alive, Node.schedulable, Node.drained_at, Node.address)
        .outerjoin(Agent, Agent.node_id == Node.id)
        .where(Node.removed_at.is_(None))
        .order_by(Node.name)  # names are unique: every later iteration is deterministic
    ).all()
    holders: dict[int, list[int]] = defaultdict(list)
    held_by_job: dict[int, list[int]] = defaultdict(list)
    spb_of_job: dict[int, dict[str, Any]] = {}
    caps: dict[int, int] = {}
    for job_id, gpu_id, spb, cap in session.execute(
        select(Allocation.job_id, Allocation.gpu_id, Allocation.spb, Allocation.memory_bytes)
        .where(Allocation.released_at.is_(None))
        .order_by(Allocation.job_id, Allocation.rank)
    ):
        holders[gpu_id].append(job_id)
        held_by_job[job_id].append(gpu_id)
        spb_of_job[job_id] = spb  # the loop keeps every allocation of a hold alike
        if cap:
            caps[job_id] = max(caps.get(job_id, 0), cap)

    # Service attained (Tiresias) and the current hold's start, from every allocation of
    # the active jobs: one row per rank and hold, so GPU-seconds add up directly.
    attained: dict[int, float] = defaultdict(float)
    held_since: dict[int, datetime] = {}
    active = [state.value for state in ACTIVE_STATES]
    for job_id, created, released in session.execute(
        select(Allocation.job_id, Allocation.created_at, Allocation.released_at)
        .join(Job, Job.id == Allocation.job_id)
        .where(Job.state.in_(active))
    ):
        attained[job_id] += max(((released or now) - created).total_seconds(), 0.0)
        if released is None:
            held_since[job_id] = min(held_since.get(job_id, created), created)

    gpus_by_node: dict[int, list[GPUView]] = defaultdict(list)
    for gpu, node_name in session.execute(
        select(GPU, Node.name)
        .join(Node, Node.id == GPU.node_id)
        .where(Node.removed_at.is_(None))
        .order_by(GPU.index)
    ):
        gpus_by_node[gpu.node_id].append(
            GPUView(
                id=gpu.id,
                node_id=gpu.node_id,
                node_name=node_name,
                index=gpu.index,
                kind=gpu.kind,
                memory_bytes=gpu.memory_bytes,
                holders=tuple(holders.get(gpu.id, ())),
                max_jobs=gpu.max_jobs,
            )
        )
    nodes = tuple(
        NodeView(
            id=node_id,
            name=name,
            alive=bool(alive),
            gpus=tuple(gpus_by_node[node_id]),
            # Kubernetes' verdict and the admin's drain are kept apart; either stops it.
            schedulable=bool(schedulable) and drained_at is None,
            address=address,
        )
        for node_id, name, alive, schedulable, drained_at, address in node_rows
    )

    rows = list(session.scalars(select(Job).where(Job.state.in_(active))))
    node_of = {gpu.id: gpu.node_id for gpus in gpus_by_node.values() for gpu in gpus}
    models = job_models(
        session,
        (
            ActiveJob(
                job.id,
                job.workers,
                job.spec,
                spb_of_job.get(job.id) or {},
                held=len(held_by_job.get(job.id, ())),
                held_nodes=len({node_of.get(g) for g in held_by_job.get(job.id, ())}),
            )
            for job in rows
        ),
        active,
        max((gpu.memory_bytes for gpus in gpus_by_node.values() for gpu in gpus), default=0),
        per_node=max((len(gpus) for gpus in gpus_by_node.values()), default=1),
        max_nodes=max(len(node_rows), 1),
        gpu_kinds={gpu.kind for gpus in gpus_by_node.values() for gpu in gpus},
    )
    slowdowns = colocated_slowdowns(session, active)
    sizes = {job.id: _sizes(job.spec) for job in rows}
    elastic = [job_id for job_id, counts in sizes.items() if counts]
    costs = measured_costs(session, elastic)
    growth_costs = measured_costs(session, elastic, grown_in_place_seconds)
    start = typical_start_seconds(session)
    jobs = tuple(
        JobView(
            id=job.id,
            state=JobState(job.state),
            priority=job.priority,
            workers=job.workers,
            created_at=job.created_at,
            allocated_gpu_ids=tuple(held_by_job.get(job.id, ())),
            iterations_done=_done(job),
            spb=dict(spb_of_job.get(job.id) or {}),
            attained_gpu_seconds=attained.get(job.id, 0.0),
            restarts=max(job.attempts - 1, 0),
            held_since=held_since.get(job.id),
            preempted=job.state == JobState.SUSPENDED and job.suspended_by == SuspendedBy.POLICY,
            model=models.get(job.id),
            colocated_slowdown=slowdowns.get(job.id),
            spb_setting=_SPB_SETTING.validate_python(job.spec.get("spb", "off")),
            max_iterations=job.spec.get("max_iterations"),
            sizes=sizes[job.id],
            queue=str(job.spec.get("queue") or "default"),
            resize_seconds=costs.get(job.id),
            grow_seconds=growth_costs.get(job.id),
            start_seconds=start,
            memory_cap_bytes=caps.get(job.id),
        )
        for job in rows
    )
    # Ids grow with submission: the newest job is the highest id (its primary key).
    newest = session.scalar(select(Job.created_at).order_by(Job.id.desc()).limit(1))
    return ClusterSnapshot(nodes=nodes, jobs=jobs, now=now, last_submitted_at=newest)


def _done(job: Job) -> int:
    """What the job's `max_iterations` counts done: its iterations, or an adaptive
    batch's steps of its base batch (the runtime counts AdaScale's gain a step)."""
    batch = job.spec.get("batch")
    if isinstance(batch, dict) and batch.get("adaptive"):
        return int(job.progress)
    return job.iterations_done


def _sizes(spec: dict[str, Any]) -> tuple[int, ...]:
    """An elastic job's worker counts (`JobSpec.worker_counts`); empty for the rest, whose
    specs are not parsed again every round."""
    if spec.get("elastic") is None:
        return ()
    try:
        return JobSpec.model_validate(spec).worker_counts()
    except ValidationError:
        return ()
