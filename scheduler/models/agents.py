"""Worker agents in the database: registration of nodes and GPUs, heartbeats."""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from jigsaw import spb
from jigsaw.gpus import GpuSlot
from scheduler.core.states import JobState
from scheduler.orm import GPU, Agent, Allocation, Event, IterationMetric, Job, Node, utcnow

logger = logging.getLogger(__name__)


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
    heartbeat: bool = True,
) -> Registration:
    """Create or refresh a node, its GPUs and its agent.

    Idempotent: an agent registers again after every reconnect; an admin's drain stays
    (a removed node comes back undrained). GPUs keep their rows
    (and so their allocation history) across registrations; a GPU the agent no longer
    offers stays in the table but is logged, since jobs may still hold it.
    `heartbeat`: the registration counts as one, the agent is alive as of `now`
    (simulated nodes, which have no stream); False leaves liveness to the agent's
    stream (a real agent): a new agent is not alive until its stream's first heartbeat,
    and registering again neither revives a dead one nor makes a live one look dead for
    a moment.
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
                    sharing=slot.sharing,
                    max_jobs=slot.max_jobs,
                )
            )
        else:
            gpu.kind, gpu.memory_bytes, gpu.virtual = slot.kind, slot.memory_bytes, slot.virtual
            gpu.sharing, gpu.max_jobs = slot.sharing, slot.max_jobs
    if existing:
        logger.warning("node %s no longer offers GPUs %s", node_name, sorted(existing))
    agent = session.scalar(select(Agent).where(Agent.node_id == node.id))
    if agent is None:
        agent = Agent(node_id=node.id, alive=False)
        session.add(agent)
    agent.version = version
    agent.registered_at = now
    if heartbeat:
        agent.alive = True
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


def registered_agent(session: Session, node_name: str) -> tuple[int, int] | None:
    """(node id, agent id) of the node of that name, or None when no agent registered it."""
    row = session.execute(
        select(Node.id, Agent.id)
        .join(Agent, Agent.node_id == Node.id)
        .where(Node.name == node_name)
    ).first()
    return None if row is None else (row[0], row[1])


def set_alive(
    session: Session, agent_ids: Sequence[int], alive: bool, now: datetime | None = None
) -> None:
    """Mark these agents alive (heard from `now`) or dead, as simulated nodes do for
    themselves."""
    values: dict[str, object] = {"alive": alive}
    if alive:
        values["last_heartbeat_at"] = now or utcnow()
    session.execute(
        update(Agent)
        .where(Agent.id.in_(list(agent_ids)))
        .values(**values)
        .execution_options(synchronize_session=False)
    )


def alive_node_names(session: Session) -> set[str]:
    """The names of the nodes whose agents are alive."""
    return set(
        session.scalars(select(Node.name).join(Agent, Agent.node_id == Node.id).where(Agent.alive))
    )


@dataclass(frozen=True)
class LostAgent:
    agent_id: int
    node_id: int
    node_name: str | None
    last_heartbeat_at: datetime


def expire(session: Session, cutoff: datetime, *, actor: str) -> list[LostAgent]:
    """Mark dead every alive agent silent since before `cutoff`, each with an
    `agent_lost` event; those agents."""
    lost = session.scalars(
        select(Agent).where(Agent.alive.is_(True), Agent.last_heartbeat_at < cutoff)
    ).all()
    if not lost:
        return []
    names = dict(
        session.execute(
            select(Node.id, Node.name).where(Node.id.in_([a.node_id for a in lost]))
        ).all()
    )
    for agent in lost:
        agent.alive = False
        session.add(
            Event(
                kind="agent_lost",
                actor=actor,
                message=f"no heartbeat since {agent.last_heartbeat_at.isoformat()}",
                data={"agent_id": agent.id, "node_id": agent.node_id},
            )
        )
    return [
        LostAgent(agent.id, agent.node_id, names.get(agent.node_id), agent.last_heartbeat_at)
        for agent in lost
    ]


def ran_on(session: Session, job_id: int, node_id: int) -> bool:
    """Whether the job was ever allocated a GPU of the node."""
    allocation = session.scalar(
        select(Allocation.id)
        .join(GPU, GPU.id == Allocation.gpu_id)
        .where(Allocation.job_id == job_id, GPU.node_id == node_id)
        .limit(1)
    )
    return allocation is not None


def instance_digest(instance: str) -> str:
    """What is stored of an agent's secret instance key: enough to recognise it."""
    return hashlib.sha256(instance.encode()).hexdigest()


@dataclass(frozen=True)
class NodeRun:
    """What the database says of one job's run on one node."""

    attempt: int  # the attempt of the job's active allocations there; 0 when none
    ranks: dict[int, int]  # rank -> GPU index of those allocations
    agent_instance: str | None  # digest of the agent process they were launched to
    # Ranks allocated after the run's others: a growth in place was asked, which adds
    # them to the run only once the agent says it is done (`resize.in_place`).
    joining: frozenset[int] = frozenset()


def runs_on_node(session: Session, node_id: int, job_ids: Iterable[int]) -> dict[int, NodeRun]:
    """The runs of these jobs the node holds or held (jobs it never held are absent)."""
    ids = set(job_ids)
    if not ids:
        return {}
    held: dict[int, list[tuple[int, int, int, str | None, datetime]]] = {}
    for job_id, rank, index, attempt, instance, released_at, created_at in session.execute(
        select(
            Allocation.job_id,
            Allocation.rank,
            GPU.index,
            Allocation.attempt,
            Allocation.agent_instance,
            Allocation.released_at,
            Allocation.created_at,
        )
        .join(GPU, GPU.id == Allocation.gpu_id)
        .where(GPU.node_id == node_id, Allocation.job_id.in_(ids))
    ):
        active = held.setdefault(job_id, [])
        if released_at is None:
            active.append((rank, index, attempt, instance, created_at))
    return {
        job_id: NodeRun(
            attempt=max((attempt for _, _, attempt, _, _ in active), default=0),
            ranks={rank: index for rank, index, *_ in active},
            agent_instance=next((instance for *_, instance, _ in active), None),
            joining=frozenset(
                rank for rank, *_, created in active if created > min(c for *_, c in active)
            ),
        )
        for job_id, active in held.items()
    }


def bind_run(
    session: Session,
    job_id: int,
    attempt: int,
    gpu_ids: Iterable[int],
    digest: str,
    memory_bytes: int | None = None,
) -> None:
    """Record which agent process the run of `attempt` on these GPUs was launched to,
    and the memory cap each rank was sent."""
    session.execute(
        update(Allocation)
        .where(
            Allocation.job_id == job_id,
            Allocation.attempt == attempt,
            Allocation.gpu_id.in_(set(gpu_ids)),
            Allocation.released_at.is_(None),
        )
        .values(agent_instance=digest, memory_bytes=memory_bytes)
        .execution_options(synchronize_session=False)
    )


# What a cap allows above a measured peak at least: the peak is what the allocator
# handed out, while the cap bounds what it reserves (rounded blocks), and a restarted
# job's library autotuning tries workspaces its steady state never holds. Measured on an
# H200: a 82 MB job capped at 1.25x its peak failed on restart.
MEMORY_SLACK_BYTES = 256 << 20
# A rank's memory cap over the largest peak its job reported (allocator and data-loader
# variation between iterations).
MEMORY_HEADROOM = 1.25
# A running job's cap lowered from what its first iterations showed: twice its peak, as
# a profiled job's launch, since they may not have seen an evaluation (every
# `eval_every` iterations) nor the allocator's full reserve.
LOWERED_CAP_HEADROOM = 2.0
# The iterations a cap is derived from: a worker reports its process's peak so far, so
# the newest say all there is.
MEMORY_RECENT_ITERATIONS = 20


def allowance(peak: int, headroom: float) -> int:
    """The memory a job whose peak was measured at `peak` bytes may take."""
    return max(math.ceil(peak * headroom), peak + MEMORY_SLACK_BYTES)


def caps_to_lower(session: Session, *, headroom: float, settle: int, recent: int) -> dict[int, int]:
    """Running jobs whose ranks' cap is at least twice what their run has shown they
    need, and that need: the largest peak of the run's last `recent` iterations (a
    worker reports its process's peak so far), of which at least `settle` are in, with
    `headroom` (`allowance`). A job launched before it had reported gets its whole GPU,
    and nothing fits beside it until this lowers it. Only runs at full backprop: a
    partial SPB worker needs less than it will again once reconfigured. Two queries,
    whatever the number of jobs."""
    caps: dict[int, float] = {}  # job -> its ranks' least cap
    partial: set[int] = set()
    for job_id, cap, whole, config in session.execute(
        select(Allocation.job_id, Allocation.memory_bytes, GPU.memory_bytes, Allocation.spb)
        .join(GPU, GPU.id == Allocation.gpu_id)
        .join(Job, Job.id == Allocation.job_id)
        .where(Allocation.released_at.is_(None), Job.state == JobState.RUNNING.value)
    ):
        if spb.resolve(config) is not None:
            partial.add(job_id)
        caps[job_id] = min(caps.get(job_id, math.inf), cap or whole)
    candidates = [job_id for job_id in caps if job_id not in partial]
    if not candidates:
        return {}
    placed_at = (
        select(Allocation.job_id, func.min(Allocation.created_at).label("since"))
        .where(Allocation.released_at.is_(None), Allocation.job_id.in_(candidates))
        .group_by(Allocation.job_id)
        .subquery()
    )
    lowered: dict[int, int] = {}
    for job_id, peak, count in session.execute(
        select(IterationMetric.job_id, func.max(IterationMetric.peak_memory_bytes), func.count())
        .join(Job, Job.id == IterationMetric.job_id)
        .join(placed_at, placed_at.c.job_id == IterationMetric.job_id)
        .where(
            IterationMetric.iteration > Job.iterations_done - recent,
            IterationMetric.reported_at >= placed_at.c.since,
        )
        .group_by(IterationMetric.job_id)
    ):
        need = allowance(int(peak or 0), headroom)
        if count >= settle and peak and 2 * need <= caps[job_id]:
            lowered[job_id] = need
    return lowered


def lower_cap(session: Session, job_id: int, memory_bytes: int) -> None:
    """Record the job's ranks' new memory cap on every GPU it holds."""
    session.execute(
        update(Allocation)
        .where(Allocation.job_id == job_id, Allocation.released_at.is_(None))
        .values(memory_bytes=memory_bytes)
        .execution_options(synchronize_session=False)
    )


def memory_cap(
    session: Session, job_id: int, gpu_ids: Iterable[int], *, headroom: float, recent: int
) -> int:
    """Each rank's memory cap on these GPUs: the largest peak the job reported in its
    last `recent` iterations with `headroom` (`allowance`), within the smallest of the
    GPUs; a job that has not reported gets the whole GPU (so nothing fits beside it)."""
    smallest = session.scalar(select(func.min(GPU.memory_bytes)).where(GPU.id.in_(set(gpu_ids))))
    whole = int(smallest or 0)
    done = select(Job.iterations_done).where(Job.id == job_id).scalar_subquery()
    peak = session.scalar(
        select(func.max(IterationMetric.peak_memory_bytes)).where(
            IterationMetric.job_id == job_id, IterationMetric.iteration > done - recent
        )
    )
    if not peak:
        return whole
    capped = allowance(int(peak), headroom)
    return min(whole, capped) if whole else capped
