"""An immutable picture of the cluster for one scheduling round.

Policies see only these frozen views, never ORM objects, so they stay pure functions that
unit tests can drive without a database, and cannot change state behind the loop's back.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from scheduler.jobmodel import JobModel
from scheduler.measured import ActiveJob, job_models
from scheduler.orm import GPU, Agent, Allocation, Job, Node
from scheduler.states import JobState

_HOLDING = frozenset({JobState.SCHEDULED, JobState.RUNNING})

# The message the loop writes when a policy (not a user) suspends a job: such a job waits
# to be placed again, whereas a job a user suspended waits for the user.
PREEMPTED_MESSAGE = "suspended by policy"

# Jobs a policy may act on: waiting for GPUs, or holding them.
ACTIVE_STATES: tuple[JobState, ...] = (
    JobState.QUEUED,
    JobState.SCHEDULED,
    JobState.RUNNING,
    JobState.SUSPENDED,
)


@dataclass(frozen=True)
class GPUView:
    id: int
    node_id: int
    node_name: str
    index: int
    kind: str
    memory_bytes: int
    holders: tuple[int, ...] = ()  # ids of jobs holding an active allocation on it


@dataclass(frozen=True)
class NodeView:
    id: int
    name: str
    alive: bool
    gpus: tuple[GPUView, ...] = ()
    # False on a node operators keep new work off (cordoned or tainted in Kubernetes, or
    # drained by an admin).
    schedulable: bool = True

    def free_gpus(self) -> tuple[GPUView, ...]:
        """GPUs a new job could take: none on a dead or unschedulable node, else those
        nobody holds."""
        if not (self.alive and self.schedulable):
            return ()
        return tuple(gpu for gpu in self.gpus if not gpu.holders)


@dataclass(frozen=True)
class JobView:
    id: int
    state: JobState
    priority: int
    workers: int
    created_at: datetime
    spec: dict[str, Any]  # the submitted JobSpec as JSON; policies must not mutate it
    allocated_gpu_ids: tuple[int, ...] = ()  # ordered by rank
    iterations_done: int = 0
    # The SPB configuration of its current hold (`{}`: off, or holding no GPUs).
    spb: dict[str, Any] = field(default_factory=dict)
    attained_gpu_seconds: float = 0.0  # GPUs x seconds held over all its holds so far
    held_since: datetime | None = None  # when its current hold began (None: holds none)
    preempted: bool = False  # SUSPENDED by a policy: waiting to be placed again
    model: JobModel | None = None  # what is known of its speed (None: nothing)

    @cached_property
    def waiting(self) -> bool:
        """Wants GPUs: queued, or suspended by a policy."""
        return self.state is JobState.QUEUED or (
            self.state is JobState.SUSPENDED and self.preempted
        )

    @cached_property
    def holding(self) -> bool:
        return self.state in (JobState.SCHEDULED, JobState.RUNNING)


@dataclass(frozen=True)
class ClusterSnapshot:
    nodes: tuple[NodeView, ...]
    jobs: tuple[JobView, ...]
    now: datetime
    # When the newest job of all (finished ones included) was submitted (None: unknown).
    # How long the queue has gone without new work tells a policy whether the backlog
    # is all there is to finish (JigSaw paces its longest jobs then).
    last_submitted_at: datetime | None = None

    def alive_nodes(self) -> tuple[NodeView, ...]:
        return tuple(node for node in self.nodes if node.alive)

    def alive_gpu_count(self) -> int:
        """Every GPU on an alive node, held or not: the most any one job could get."""
        return sum(len(node.gpus) for node in self.alive_nodes())

    def free_gpus_by_node(self) -> dict[int, tuple[GPUView, ...]]:
        """Free GPUs of each alive node that has any, keyed by node id."""
        free = {node.id: node.free_gpus() for node in self.nodes}
        return {node_id: gpus for node_id, gpus in free.items() if gpus}

    def gpus_by_id(self) -> dict[int, GPUView]:
        return {gpu.id: gpu for node in self.nodes for gpu in node.gpus}

    def jobs_in(self, state: JobState) -> tuple[JobView, ...]:
        return tuple(job for job in self.jobs if job.state is state)

    @property
    def seconds(self) -> float:
        """`now` in seconds since the epoch, for policies that count durations."""
        return self.now.timestamp()


def build_snapshot(session: Session, now: datetime) -> ClusterSnapshot:
    """Read the cluster in eight queries, whatever its size (nodes, GPUs, holds, service,
    jobs, the newest submission, and the jobs' recent iterations and SPB profiles for
    their models)."""
    # A node without an agent, or whose agent timed out, offers no capacity; a removed
    # node is not part of the cluster.
    node_rows = session.execute(
        select(Node.id, Node.name, Agent.alive, Node.schedulable, Node.drained_at)
        .outerjoin(Agent, Agent.node_id == Node.id)
        .where(Node.removed_at.is_(None))
        .order_by(Node.name)  # names are unique: every later iteration is deterministic
    ).all()
    holders: dict[int, list[int]] = defaultdict(list)
    held_by_job: dict[int, list[int]] = defaultdict(list)
    spb_of_job: dict[int, dict[str, Any]] = {}
    for job_id, gpu_id, spb in session.execute(
        select(Allocation.job_id, Allocation.gpu_id, Allocation.spb)
        .where(Allocation.released_at.is_(None))
        .order_by(Allocation.job_id, Allocation.rank)
    ):
        holders[gpu_id].append(job_id)
        held_by_job[job_id].append(gpu_id)
        spb_of_job[job_id] = spb  # the loop keeps every allocation of a hold alike

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
        )
        for node_id, name, alive, schedulable, drained_at in node_rows
    )

    rows = list(session.scalars(select(Job).where(Job.state.in_(active))))
    models = job_models(
        session,
        (ActiveJob(job.id, job.workers, job.spec, spb_of_job.get(job.id) or {}) for job in rows),
        active,
        max((gpu.memory_bytes for gpus in gpus_by_node.values() for gpu in gpus), default=0),
    )
    jobs = tuple(
        JobView(
            id=job.id,
            state=JobState(job.state),
            priority=job.priority,
            workers=job.workers,
            created_at=job.created_at,
            spec=job.spec,
            allocated_gpu_ids=tuple(held_by_job.get(job.id, ())),
            iterations_done=job.iterations_done,
            spb=dict(spb_of_job.get(job.id) or {}),
            attained_gpu_seconds=attained.get(job.id, 0.0),
            held_since=held_since.get(job.id),
            preempted=job.state == JobState.SUSPENDED and job.message == PREEMPTED_MESSAGE,
            model=models.get(job.id),
        )
        for job in rows
    )
    # Ids grow with submission: the newest job is the highest id (its primary key).
    newest = session.scalar(select(Job.created_at).order_by(Job.id.desc()).limit(1))
    return ClusterSnapshot(nodes=nodes, jobs=jobs, now=now, last_submitted_at=newest)
