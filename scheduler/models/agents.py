"""Worker agents in the database: registration of nodes and GPUs, heartbeats."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from scheduler.orm import GPU, Agent, Allocation, Node, utcnow

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GpuSlot:
    index: int
    kind: str
    memory_bytes: int
    virtual: bool


@dataclass(frozen=True)
class Registration:
    agent_id: int
    node_id: int


def register(
    session: Session,
    *,
    node_name: str,
    address: str,
    gpus: Sequence[GpuSlot],
    version: str,
    now: datetime | None = None,
) -> Registration:
    """Create or refresh a node, its GPUs and its agent (alive as of `now`).

    Idempotent: an agent registers again after every reconnect; an admin's drain stays
    (a removed node comes back undrained). GPUs keep their rows
    (and so their allocation history) across registrations; a GPU the agent no longer
    offers stays in the table but is logged, since jobs may still hold it.
    """
    now = now or utcnow()
    node = session.scalar(select(Node).where(Node.name == node_name))
    if node is None:
        node = Node(name=node_name, address=address, created_at=now)
        session.add(node)
        session.flush()
    elif node.removed_at is not None:
        # An admin removed the node; an agent serving it again makes it a fresh node.
        logger.info("node %s registers again after its removal", node_name)
        node.removed_at = node.drained_at = None
    node.address = address
    existing = {
        gpu.index: gpu for gpu in session.scalars(select(GPU).where(GPU.node_id == node.id))
    }
    for slot in gpus:
        gpu = existing.pop(slot.index, None)
        if gpu is None:
            session.add(
                GPU(
                    node_id=node.id,
                    index=slot.index,
                    kind=slot.kind,
                    memory_bytes=slot.memory_bytes,
                    virtual=slot.virtual,
                )
            )
        else:
            gpu.kind, gpu.memory_bytes, gpu.virtual = slot.kind, slot.memory_bytes, slot.virtual
    if existing:
        logger.warning("node %s no longer offers GPUs %s", node_name, sorted(existing))
    agent = session.scalar(select(Agent).where(Agent.node_id == node.id))
    if agent is None:
        agent = Agent(node_id=node.id)
        session.add(agent)
    agent.version = version
    agent.alive = True
    agent.registered_at = now
    agent.last_heartbeat_at = now
    session.flush()
    return Registration(agent_id=agent.id, node_id=node.id)


def record_heartbeats(session: Session, seen: Mapping[int, datetime]) -> None:
    """Agents (by id) heard from at these times; each is alive again."""
    if seen:
        session.execute(
            update(Agent),
            [
                {"id": agent_id, "last_heartbeat_at": at, "alive": True}
                for agent_id, at in seen.items()
            ],
        )


def node_addresses(session: Session, node_names: Iterable[str]) -> dict[str, str]:
    """Where peers on other nodes reach each node (for torch.distributed rendezvous)."""
    return dict(
        session.execute(select(Node.name, Node.address).where(Node.name.in_(set(node_names)))).all()
    )


def ran_on(session: Session, job_id: int, node_id: int) -> bool:
    """Whether the job was ever allocated a GPU of the node."""
    allocation = session.scalar(
        select(Allocation.id)
        .join(GPU, GPU.id == Allocation.gpu_id)
        .where(Allocation.job_id == job_id, GPU.node_id == node_id)
        .limit(1)
    )
    return allocation is not None
