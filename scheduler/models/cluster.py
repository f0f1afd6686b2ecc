"""Read model of the cluster: nodes, their GPUs, agent liveness and who holds what."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from scheduler.models.metrics import newest
from scheduler.orm import GPU, Agent, Allocation, IterationMetric, Job, Node


@dataclass
class Holder:
    job_id: int
    job_name: str
    owner_id: int
    rank: int
    spb: dict[str, Any]
    utilization: float | None


@dataclass
class GPURow:
    id: int
    index: int
    kind: str
    memory_bytes: int
    virtual: bool
    holders: list[Holder] = field(default_factory=list)


@dataclass
class NodeRow:
    id: int
    name: str
    alive: bool
    last_heartbeat_at: datetime | None
    agent_version: str
    schedulable: bool = True
    unschedulable_reason: str = ""
    drained_at: datetime | None = None  # set while an admin drains it
    gpus: list[GPURow] = field(default_factory=list)


def cluster_view(session: Session) -> list[NodeRow]:
    """Every node (but removed ones) with its GPUs and their current holders; four
    queries in all."""
    nodes: dict[int, NodeRow] = {}
    for node, agent in session.execute(
        select(Node, Agent)
        .outerjoin(Agent, Agent.node_id == Node.id)
        .where(Node.removed_at.is_(None))
        .order_by(Node.name)
    ):
        nodes[node.id] = NodeRow(
            id=node.id,
            name=node.name,
            alive=bool(agent and agent.alive),
            last_heartbeat_at=agent.last_heartbeat_at if agent else None,
            agent_version=agent.version if agent else "",
            schedulable=node.schedulable,
            unschedulable_reason=node.unschedulable_reason,
            drained_at=node.drained_at,
        )
    gpus: dict[int, GPURow] = {}
    for gpu in session.scalars(
        select(GPU).where(GPU.node_id.in_(nodes)).order_by(GPU.node_id, GPU.index)
    ):
        row = GPURow(gpu.id, gpu.index, gpu.kind, gpu.memory_bytes, gpu.virtual)
        gpus[gpu.id] = row
        nodes[gpu.node_id].gpus.append(row)
    held = session.execute(
        select(Allocation, Job.name, Job.owner_id)
        .join(Job, Job.id == Allocation.job_id)
        .where(Allocation.released_at.is_(None))
    ).all()
    utilization = _latest_utilization(session, {alloc.job_id for alloc, _, _ in held})
    for alloc, job_name, owner_id in held:
        gpus[alloc.gpu_id].holders.append(
            Holder(
                alloc.job_id,
                job_name,
                owner_id,
                alloc.rank,
                alloc.spb,
                utilization.get(alloc.job_id),
            )
        )
    return list(nodes.values())


def _latest_utilization(session: Session, job_ids: set[int]) -> dict[int, float | None]:
    latest = newest(session, job_ids, (IterationMetric.utilization,))
    return {job_id: utilization for job_id, (utilization,) in latest.items()}


@dataclass(frozen=True)
class Capacity:
    """GPUs by state (busy: held; free: placeable now; unavailable: on a dead,
    unschedulable or drained node) and nodes by state (alive, unschedulable (drained
    included), dead), removed nodes left out."""

    gpus: dict[str, int]
    nodes: dict[str, int]


def capacity(session: Session) -> Capacity:
    """Counts for /metrics and the dashboard's totals; two queries."""
    held = set(session.scalars(select(Allocation.gpu_id).where(Allocation.released_at.is_(None))))
    nodes = {"alive": 0, "unschedulable": 0, "dead": 0}
    usable: dict[int, bool] = {}
    for node_id, alive, schedulable, drained_at in session.execute(
        select(Node.id, Agent.alive, Node.schedulable, Node.drained_at)
        .outerjoin(Agent, Agent.node_id == Node.id)
        .where(Node.removed_at.is_(None))
    ):
        takes_jobs = schedulable and drained_at is None
        state = "dead" if not alive else "alive" if takes_jobs else "unschedulable"
        nodes[state] += 1
        usable[node_id] = state == "alive"
    gpus = {"busy": 0, "free": 0, "unavailable": 0}
    for gpu_id, node_id in session.execute(select(GPU.id, GPU.node_id)):
        if node_id not in usable:
            continue  # a removed node's
        state = "busy" if gpu_id in held else "free" if usable[node_id] else "unavailable"
        gpus[state] += 1
    return Capacity(gpus=gpus, nodes=nodes)
