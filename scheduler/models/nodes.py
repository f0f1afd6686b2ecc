"""An admin's hold on nodes: drain (no new placements), undrain, remove.

The drain is its own field (`nodes.drained_at`), apart from `schedulable`, which the
Kubernetes inventory owns (scheduler/kube.py): neither undoes the other, and the
snapshot offers a node's GPUs only when both allow it. Removal hides the node from
every view and from the scheduler; its GPUs' allocation history stays, and an agent
registering under the same name later brings it back as a new, undrained node.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from scheduler.core.states import IllegalTransition, JobState, SuspendedBy
from scheduler.models import allocations
from scheduler.models.states import transition
from scheduler.orm import GPU, Agent, Allocation, Event, Job, Node, utcnow

# The message of a RUNNING job `drain --now` suspended (`SuspendedBy.DRAIN`). The
# scheduler loop queues such a job again once its processes have checkpointed and exited
# (whatever the policy), so it waits for GPUs elsewhere, not for its user.
DRAINED_MESSAGE = "suspended: its node was drained"


class NodeNotFound(LookupError):
    """No node of that name (or it was removed)."""


class NodeBusy(Exception):
    """The node cannot be removed yet; the message says why and what to do."""


@dataclass(frozen=True)
class NodeChange:
    name: str
    drained_at: datetime | None
    removed_at: datetime | None = None
    suspended: list[int] = field(default_factory=list)  # RUNNING jobs sent to wait elsewhere
    requeued: list[int] = field(default_factory=list)  # SCHEDULED jobs sent back to the queue


def drain(
    session: Session, name: str, *, actor: str, evict: bool = False, now: datetime | None = None
) -> NodeChange:
    """Keep new jobs off the node; with `evict`, also move its jobs elsewhere: each
    RUNNING job holding a GPU there is suspended (its processes checkpoint at the next
    iteration boundary and exit; the loop then queues it again, see DRAINED_MESSAGE); a
    job being launched there goes back to the queue at once. Draining a drained node again only
    evicts (when asked)."""
    now = now or utcnow()
    node = _live_node(session, name)
    if node.drained_at is None:
        node.drained_at = now
        session.add(
            Event(
                kind="node_drained",
                actor=actor,
                message=f"{node.name}: drained by {actor}",
                data={"node_id": node.id, "node": node.name},
                created_at=now,
            )
        )
    suspended: list[int] = []
    requeued: list[int] = []
    if evict:
        holding = (
            select(Allocation.job_id)
            .join(GPU, GPU.id == Allocation.gpu_id)
            .where(GPU.node_id == node.id, Allocation.released_at.is_(None))
        )
        for job in session.scalars(select(Job).where(Job.id.in_(holding)).order_by(Job.id)):
            data = {"node": node.name}
            try:
                if job.state == JobState.RUNNING:
                    transition(
                        session, job, JobState.SUSPENDED, actor=actor,
                        message=DRAINED_MESSAGE, data=data, suspended_by=SuspendedBy.DRAIN,
                    )  # fmt: skip
                    suspended.append(job.id)
                elif job.state == JobState.SCHEDULED:
                    transition(
                        session, job, JobState.QUEUED, actor=actor,
                        message=f"node {node.name} drained before the launch", data=data,
                    )  # fmt: skip
                    requeued.append(job.id)
            except IllegalTransition:
                continue  # it ended or moved meanwhile: nothing left to evict
        # The loop frees a suspended job's GPUs itself; a queued job must not keep any.
        allocations.release(session, requeued, now)
    return NodeChange(node.name, node.drained_at, None, suspended, requeued)


def undrain(session: Session, name: str, *, actor: str) -> NodeChange:
    """Let the scheduler place jobs on the node again (if Kubernetes allows it too)."""
    node = _live_node(session, name)
    if node.drained_at is not None:
        node.drained_at = None
        session.add(
            Event(
                kind="node_undrained",
                actor=actor,
                message=f"{node.name}: undrained by {actor}",
                data={"node_id": node.id, "node": node.name},
            )
        )
    return NodeChange(node.name, None)


def remove(session: Session, name: str, *, actor: str, now: datetime | None = None) -> NodeChange:
    """Forget a drained node that no job holds and no agent serves; raises NodeBusy
    with the reason otherwise."""
    now = now or utcnow()
    node = _live_node(session, name)
    if node.drained_at is None:
        raise NodeBusy(f"node {name} is not drained: run `jigsaw node drain {name}` first")
    jobs = sorted(
        set(
            session.scalars(
                select(Allocation.job_id)
                .join(GPU, GPU.id == Allocation.gpu_id)
                .where(GPU.node_id == node.id, Allocation.released_at.is_(None))
            )
        )
    )
    if jobs:
        raise NodeBusy(
            f"node {name} still holds GPUs of jobs {jobs}: wait for them to end, or "
            f"`jigsaw node drain --now {name}` to move them"
        )
    agent = session.scalar(select(Agent).where(Agent.node_id == node.id))
    if agent is not None and agent.alive:
        raise NodeBusy(
            f"the agent of node {name} is alive (last heartbeat "
            f"{agent.last_heartbeat_at.isoformat()}): stop it first; the scheduler "
            "declares it lost after JIGSAW_SCHEDULER_AGENT_TIMEOUT_SECONDS"
        )
    node.removed_at = now
    session.add(
        Event(
            kind="node_removed",
            actor=actor,
            message=f"{node.name}: removed by {actor}",
            data={"node_id": node.id, "node": node.name},
            created_at=now,
        )
    )
    return NodeChange(node.name, node.drained_at, now)


def _live_node(session: Session, name: str) -> Node:
    """The node, locked against a concurrent drain, placement check or removal."""
    node = session.scalar(
        select(Node).where(Node.name == name, Node.removed_at.is_(None)).with_for_update()
    )
    if node is None:
        raise NodeNotFound(name)
    return node


def on_drained_node(session: Session, gpu_ids: list[int]) -> bool:
    """Whether any of these GPUs is on a drained (or removed) node: the loop's last check
    before it places a job, since a drain may land between its snapshot and the
    placement. The nodes stay share-locked until the placement commits, so a concurrent
    `drain --now` either comes first (and this says so) or sees the placement."""
    rows = session.execute(
        select(Node.drained_at, Node.removed_at)
        .where(Node.id.in_(select(GPU.node_id).where(GPU.id.in_(gpu_ids))))
        .with_for_update(read=True)
    ).all()
    return any(drained is not None or removed is not None for drained, removed in rows)


def suspended_to_requeue(session: Session) -> list[Job]:
    """The suspended jobs the loop queues again once their processes are gone: those
    `drain --now` suspended, and those checkpointed for a resize (the loop drops the
    ones whose resize it still holds)."""
    return list(
        session.scalars(
            select(Job).where(
                Job.state == JobState.SUSPENDED,
                Job.suspended_by.in_([SuspendedBy.DRAIN, SuspendedBy.RESIZE]),
            )
        )
    )
