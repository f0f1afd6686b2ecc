"""/v1/queues: everyone reads the queues and their usage; admins create, change and
delete them."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

from api.deps import Admin, Factory, User
from api.errors import ApiProblem
from api.schemas import (
    QUEUE_NAME_PATTERN,
    V1_ERRORS,
    QueueIn,
    QueueList,
    QueueOut,
    QueuePatch,
    error_responses,
)
from scheduler.db import transaction
from scheduler.models import queues
from scheduler.models.queues import QueueConflict, QueueInvalid, QueueNotFound

router = APIRouter(prefix="/v1/queues", tags=["queues"], responses=V1_ERRORS)

QueueName = Annotated[str, Path(pattern=QUEUE_NAME_PATTERN, description="The queue's name.")]


def _invalid(exc: QueueInvalid) -> ApiProblem:
    return ApiProblem(
        422, f"invalid request: {exc.field}: {exc}", [{"loc": exc.field, "message": str(exc)}]
    )


@router.get("")
def list_queues(user: User, factory: Factory) -> QueueList:
    """Every queue with its quota and what its jobs use and wait for now."""
    with transaction(factory) as session:
        return QueueList(items=[QueueOut.of(info) for info in queues.list_queues(session)])


@router.get("/{name}", responses=error_responses(404))
def get_queue(name: QueueName, user: User, factory: Factory) -> QueueOut:
    try:
        with transaction(factory) as session:
            return QueueOut.of(queues.get_queue(session, name))
    except QueueNotFound:
        raise ApiProblem(404, f"queue {name} not found") from None


@router.post("", status_code=201, responses=error_responses(400, 409))
def create_queue(body: QueueIn, admin: Admin, factory: Factory) -> QueueOut:
    """Create a queue (409 if the name is taken)."""
    fields = body.model_dump(exclude={"name"})
    try:
        with transaction(factory) as session:
            return QueueOut.of(queues.create_queue(session, body.name, fields))
    except QueueConflict as exc:
        raise ApiProblem(409, str(exc)) from None
    except QueueInvalid as exc:
        raise _invalid(exc) from None


@router.patch("/{name}", responses=error_responses(400, 404))
def update_queue(name: QueueName, body: QueuePatch, admin: Admin, factory: Factory) -> QueueOut:
    """Change the fields sent; the next scheduling round holds the jobs to them (jobs
    over a lowered quota give their GPUs back when other queues need them)."""
    try:
        with transaction(factory) as session:
            return QueueOut.of(
                queues.update_queue(session, name, body.model_dump(exclude_unset=True))
            )
    except QueueNotFound:
        raise ApiProblem(404, f"queue {name} not found") from None
    except QueueInvalid as exc:
        raise _invalid(exc) from None


@router.delete("/{name}", status_code=204, responses=error_responses(404, 409))
def delete_queue(name: QueueName, admin: Admin, factory: Factory) -> None:
    """Delete a queue that no active job names and no queue has as parent (409 with the
    reason otherwise); the default queue stays."""
    try:
        with transaction(factory) as session:
            queues.delete_queue(session, name)
    except QueueNotFound:
        raise ApiProblem(404, f"queue {name} not found") from None
    except QueueConflict as exc:
        raise ApiProblem(409, str(exc)) from None
