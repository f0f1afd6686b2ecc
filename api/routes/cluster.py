"""/v1/cluster and /v1/whoami."""

from __future__ import annotations

from fastapi import APIRouter

from api.deps import Factory, User
from api.schemas import ClusterOut, ClusterTotals, GPUOut, HolderOut, NodeOut, WhoAmI
from scheduler.db import transaction
from scheduler.models.cluster import Holder, cluster_view
from scheduler.models.jobs import count_by_state
from scheduler.models.users import Principal
from scheduler.states import JobState

router = APIRouter(prefix="/v1", tags=["cluster"])


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
    out = [
        NodeOut(
            id=n.id,
            name=n.name,
            alive=n.alive,
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
    gpus = [g for n in out for g in n.gpus]
    busy = sum(1 for g in gpus if g.holders)
    return ClusterOut(
        nodes=out,
        totals=ClusterTotals(
            gpus=len(gpus),
            gpus_busy=busy,
            gpus_free=len(gpus) - busy,
            jobs_queued=counts.get(JobState.QUEUED, 0),
            jobs_running=counts.get(JobState.RUNNING, 0),
        ),
    )


@router.get("/whoami")
def whoami(user: User) -> WhoAmI:
    return WhoAmI(name=user.user_name, is_admin=user.is_admin)
