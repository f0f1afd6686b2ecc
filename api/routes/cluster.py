"""/v1/cluster and /v1/whoami."""

from __future__ import annotations

from fastapi import APIRouter

from api.deps import Factory, User
from api.schemas import V1_ERRORS, ClusterOut, ClusterTotals, GPUOut, HolderOut, NodeOut, WhoAmI
from scheduler.core.states import JobState
from scheduler.db import transaction
from scheduler.models.cluster import Holder, capacity, cluster_view
from scheduler.models.efficiency import cluster_efficiency
from scheduler.models.jobs import count_by_state
from scheduler.models.users import Principal

router = APIRouter(prefix="/v1", tags=["cluster"], responses=V1_ERRORS)


def _holder(holder: Holder, viewer: Principal) -> HolderOut:
    # Everyone sees that a GPU is busy; only its owner and admins see which job holds it
    # (the same rule as GET /v1/jobs/{id}, so job ids cannot be probed through here).
    visible = viewer.is_admin or holder.owner_id == viewer.user_id
    return HolderOut(
        job_id=holder.job_id if visible else None,
        job_name=holder.job_name if visible else "",
        rank=holder.rank,
        spb=holder.spb if visible else {},
        utilization=holder.utilization,
    )


@router.get("/cluster")
def cluster(user: User, factory: Factory) -> ClusterOut:
    """Nodes, GPUs, who holds what, and totals."""
    with transaction(factory) as session:
        nodes = cluster_view(session)
        counts = count_by_state(session)
        gpus_by_state = capacity(session).gpus
        efficiency = cluster_efficiency(session)
    out = [
        NodeOut(
            id=n.id,
            name=n.name,
            alive=n.alive,
            schedulable=n.schedulable,
            unschedulable_reason=n.unschedulable_reason,
            drained_at=n.drained_at,
            last_heartbeat_at=n.last_heartbeat_at,
            agent_version=n.agent_version,
            gpus=[
                GPUOut(
                    id=g.id,
                    index=g.index,
                    kind=g.kind,
                    memory_bytes=g.memory_bytes,
                    virtual=g.virtual,
                    holders=[_holder(h, user) for h in g.holders],
                )
                for g in n.gpus
            ],
        )
        for n in nodes
    ]
    return ClusterOut(
        nodes=out,
        totals=ClusterTotals(
            gpus=sum(gpus_by_state.values()),
            gpus_busy=gpus_by_state["busy"],
            gpus_free=gpus_by_state["free"],
            gpus_unavailable=gpus_by_state["unavailable"],
            jobs_queued=counts.get(JobState.QUEUED, 0),
            jobs_running=counts.get(JobState.RUNNING, 0),
            jobs_by_state={state.value: counts.get(state, 0) for state in JobState},
            window_seconds=efficiency.window_seconds,
            allocation=efficiency.allocation,
            efficiency=efficiency.efficiency,
        ),
    )


@router.get("/whoami")
def whoami(user: User) -> WhoAmI:
    return WhoAmI(name=user.user_name, is_admin=user.is_admin)
