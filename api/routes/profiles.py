"""/v1/profiles: workloads' measured per-stage costs, which policies price SPB with."""

from __future__ import annotations

from fastapi import APIRouter

from api.deps import Factory, User
from api.errors import ApiProblem
from api.schemas import V1_ERRORS, ProfileIn, ProfileOut, ProfilePage, error_responses
from jigsaw.jobspec import checked_workload
from jigsaw.spb import SPBProfile, StageProfile
from scheduler.db import transaction
from scheduler.models.profiles import list_profiles, save_profile

router = APIRouter(prefix="/v1/profiles", tags=["profiles"], responses=V1_ERRORS)


@router.get("")
def profiles(user: User, factory: Factory) -> ProfilePage:
    """Every stored profile (costs of workloads, not anybody's data: all users see them)."""
    with transaction(factory) as session:
        return ProfilePage(items=[ProfileOut.of(row) for row in list_profiles(session)])


@router.get("/{workload}", responses=error_responses(404))
def workload_profiles(workload: str, user: User, factory: Factory) -> ProfilePage:
    """The profiles of one workload, one per batch size and device kind."""
    with transaction(factory) as session:
        rows = list_profiles(session, workload)
    if not rows:
        raise ApiProblem(404, f"no profile of workload {workload!r}: run `jigsaw profile`")
    return ProfilePage(items=[ProfileOut.of(row) for row in rows])


@router.put("/{workload}", responses=error_responses(400))
def put_profile(workload: str, body: ProfileIn, user: User, factory: Factory) -> ProfileOut:
    """Store (or replace) a profile of `workload`. Admins only: it steers scheduling."""
    if not user.is_admin:
        raise ApiProblem(403, "only admins may store profiles")
    try:
        checked_workload(workload)  # the names a job spec accepts
    except ValueError as exc:
        raise ApiProblem(
            422,
            f"invalid request: path.workload: {exc}",
            [{"loc": "path.workload", "message": str(exc)}],
        ) from None
    profile = SPBProfile(
        workload=workload,
        per_worker_batch=body.per_worker_batch,
        stages=tuple(StageProfile(**stage.model_dump()) for stage in body.stages),
        steps_ratio=body.steps_ratio,
    )
    with transaction(factory) as session:
        stored = save_profile(
            session,
            profile,
            body.device_kind,
            body.utilization,
            peak_memory_bytes=body.peak_memory_bytes,
        )
        return ProfileOut.of(stored)
