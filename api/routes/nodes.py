"""/v1/nodes/{name}: an admin drains, undrains and removes nodes.

The cluster itself is read through GET /v1/cluster (which shows `drained_at`).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

from api.deps import Admin, Factory
from api.errors import ApiProblem
from api.schemas import V1_ERRORS, NodeChangeOut, error_responses
from scheduler.db import transaction
from scheduler.models import nodes
from scheduler.models.nodes import NodeBusy, NodeNotFound

router = APIRouter(prefix="/v1/nodes", tags=["nodes"], responses=V1_ERRORS)

# Node names are DNS names (the rule agents register under), at most 253 characters.
NodeName = Annotated[
    str,
    Path(
        pattern=r"^[A-Za-z0-9]([-A-Za-z0-9.]{0,251}[A-Za-z0-9])?$",
        description="The node's name, as GET /v1/cluster shows it.",
    ),
]


@router.post("/{name}/drain", responses=error_responses(404))
def drain_node(
    name: NodeName,
    admin: Admin,
    factory: Factory,
    now: Annotated[
        bool,
        Query(
            description="Also move its jobs: running ones checkpoint at their next iteration "
            "boundary and wait to be placed on other nodes."
        ),
    ] = False,
) -> NodeChangeOut:
    """Place no new jobs on the node (its jobs finish there unless `now`)."""
    try:
        with transaction(factory) as session:
            change = nodes.drain(session, name, actor=admin.user_name, evict=now)
    except NodeNotFound:
        raise ApiProblem(404, f"node {name} not found") from None
    return NodeChangeOut.of(change)


@router.post("/{name}/undrain", responses=error_responses(404))
def undrain_node(name: NodeName, admin: Admin, factory: Factory) -> NodeChangeOut:
    """Place jobs on the node again."""
    try:
        with transaction(factory) as session:
            change = nodes.undrain(session, name, actor=admin.user_name)
    except NodeNotFound:
        raise ApiProblem(404, f"node {name} not found") from None
    return NodeChangeOut.of(change)


@router.delete("/{name}", responses=error_responses(404, 409))
def remove_node(name: NodeName, admin: Admin, factory: Factory) -> NodeChangeOut:
    """Forget a drained node that no job holds and no live agent serves (409 with the
    reason otherwise); an agent registering under the name later brings it back."""
    try:
        with transaction(factory) as session:
            change = nodes.remove(session, name, actor=admin.user_name)
    except NodeNotFound:
        raise ApiProblem(404, f"node {name} not found") from None
    except NodeBusy as exc:
        raise ApiProblem(409, str(exc)) from None
    return NodeChangeOut.of(change)
