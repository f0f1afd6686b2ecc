"""/v1/jobs: submit, list, get, cancel, suspend, resume, events, logs, metrics."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request
from sqlalchemy.orm import Session

from api.deps import Factory, User
from api.errors import ApiProblem
from api.schemas import (
    V1_ERRORS,
    AllocationOut,
    AllocationPage,
    EventOut,
    EventPage,
    JobOut,
    JobPage,
    LogLine,
    LogPage,
    MetricPoint,
    MetricSeries,
    error_responses,
)
from jigsaw.jobspec import JobSpec
from scheduler.core.states import JobState
from scheduler.db import transaction
from scheduler.models import code as code_models
from scheduler.models import jobs as job_models
from scheduler.models import metrics as metric_models
from scheduler.models import queues as queue_models
from scheduler.models.users import Principal
from scheduler.orm import Job

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], responses=V1_ERRORS)

_NOT_FOUND = error_responses(404)
_ACTION_ERRORS = error_responses(404, 409)

# Ids are BIGINT: anything larger cannot exist, and must not reach the database driver.
JobId = Annotated[int, Path(ge=1, le=2**63 - 1, description="Job id.")]


def _owned(session: Session, job_id: int, viewer: Principal) -> Job:
    job = job_models.visible_job(session, job_id, viewer)
    if job is None:
        raise ApiProblem(404, f"job {job_id} not found")
    return job


def _out(session: Session, job: Job, owner: str) -> JobOut:
    """The job with its place among the waiting jobs, if it waits."""
    return JobOut.of(job, owner, queue_models.waiting_positions(session, [job.id]).get(job.id))


@router.post("", status_code=201, responses=error_responses(400))
def submit_job(request: Request, spec: JobSpec, user: User, factory: Factory) -> JobOut:
    """Queue a job; it belongs to the caller. Its `queue` must exist and admit the
    caller (422 otherwise). One asking for more GPUs than the cluster has ever
    registered is refused (422) unless settings.api.refuse_unplaceable is off; a job
    that waits says why in `pending_reason` and where it stands in `position`. A
    spec's `code` must name an archive the caller uploaded with POST /v1/code (else
    422, the same whether the digest is unknown or someone else's)."""
    with transaction(factory) as session:
        if request.app.state.settings.api.refuse_unplaceable:
            registered = job_models.gpus_registered(session)
            # No GPU registered yet: the cluster is starting, its size unknown.
            if 0 < registered < spec.workers:
                message = (
                    f"needs {spec.workers} GPUs; the cluster has registered {registered} "
                    "in all (JIGSAW_API_REFUSE_UNPLACEABLE=false queues such jobs anyway)"
                )
                raise ApiProblem(
                    422,
                    f"invalid request: workers: {message}",
                    [{"loc": "workers", "message": message}],
                )
        if spec.code is not None and not code_models.owned(session, spec.code, user):
            message = (
                f"you have no code archive {spec.code}: upload it first (POST /v1/code, "
                "or `jigsaw submit --code DIR`)"
            )
            raise ApiProblem(
                422, f"invalid request: code: {message}", [{"loc": "code", "message": message}]
            )
        refusal = queue_models.submit_refusal(session, spec.queue, user.user_name)
        if refusal is not None:
            raise ApiProblem(
                422, f"invalid request: queue: {refusal}", [{"loc": "queue", "message": refusal}]
            )
        job = job_models.submit(session, spec, user)
        return _out(session, job, user.user_name)


@router.get("")
def list_jobs(
    request: Request,
    user: User,
    factory: Factory,
    state: Annotated[list[JobState] | None, Query(description="Filter by state.")] = None,
    owner: Annotated[str | None, Query(max_length=64, description="Owner name.")] = None,
    limit: Annotated[
        int, Query(ge=1, description="Page size, at most settings.api.page_size_max.")
    ] = 50,
    after: Annotated[
        int | None, Query(ge=1, le=2**63 - 1, description="next_after of the previous page.")
    ] = None,
) -> JobPage:
    """Jobs newest first; non-admins see only their own (an owner filter naming someone
    else yields nothing rather than an error, so it reveals nothing either)."""
    # The bound is a setting, so it is checked here rather than in the Query declaration.
    page_size_max = request.app.state.settings.api.page_size_max
    if limit > page_size_max:
        message = f"Input should be less than or equal to {page_size_max}"
        raise ApiProblem(
            422,
            f"invalid request: query.limit: {message}",
            [{"loc": "query.limit", "message": message}],
        )
    with transaction(factory) as session:
        # One row past the page tells whether another page exists, so the last page
        # says next_after = null instead of sending the client to an empty one.
        rows, total = job_models.list_jobs(
            session, user, states=state or (), owner=owner, after_id=after, limit=limit + 1
        )
        positions = queue_models.waiting_positions(session, [job.id for job, _ in rows[:limit]])
        items = [JobOut.of(job, name, positions.get(job.id)) for job, name in rows[:limit]]
    next_after = items[-1].id if len(rows) > limit else None
    return JobPage(items=items, total=total, next_after=next_after)


@router.get("/{job_id}", responses=_NOT_FOUND)
def get_job(job_id: JobId, user: User, factory: Factory) -> JobOut:
    with transaction(factory) as session:
        job = _owned(session, job_id, user)
        return _out(session, job, job.owner.name)


@router.post("/{job_id}/cancel", responses=_ACTION_ERRORS)
def cancel_job(job_id: JobId, user: User, factory: Factory) -> JobOut:
    """Cancel a job that has not ended (409 if it has)."""
    with transaction(factory) as session:
        job = job_models.cancel(session, _owned(session, job_id, user), user)
        return JobOut.of(job, job.owner.name)


@router.post("/{job_id}/suspend", responses=_ACTION_ERRORS)
def suspend_job(job_id: JobId, user: User, factory: Factory) -> JobOut:
    """Checkpoint a RUNNING job at its next iteration boundary and free its GPUs (409 if
    it is not running)."""
    with transaction(factory) as session:
        job = job_models.suspend(session, _owned(session, job_id, user), user)
        return JobOut.of(job, job.owner.name)


@router.post("/{job_id}/resume", responses=_ACTION_ERRORS)
def resume_job(job_id: JobId, user: User, factory: Factory) -> JobOut:
    """Queue a SUSPENDED job again; it continues from its checkpoint, on whatever GPUs
    the scheduler picks (409 if it is not suspended)."""
    with transaction(factory) as session:
        job = job_models.resume(session, _owned(session, job_id, user), user)
        return JobOut.of(job, job.owner.name)


@router.get("/{job_id}/logs", responses=_NOT_FOUND)
def job_logs(
    job_id: JobId,
    user: User,
    factory: Factory,
    after: Annotated[int, Query(ge=0, le=2**63 - 1, description="Lines after this id.")] = 0,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
) -> LogPage:
    """What the job's training processes printed, oldest first; page (or follow) with
    `after=next_after`."""
    with transaction(factory) as session:
        _owned(session, job_id, user)
        lines = job_models.logs(session, job_id, after_id=after, limit=limit)
        items = [LogLine.of(line) for line in lines]
    return LogPage(items=items, next_after=items[-1].id if items else after)


@router.get("/{job_id}/events", responses=_NOT_FOUND)
def job_events(
    job_id: JobId,
    user: User,
    factory: Factory,
    after: Annotated[int, Query(ge=0, le=2**63 - 1)] = 0,
    limit: Annotated[int, Query(ge=1, le=5000)] = 500,
) -> EventPage:
    """The job's audit log: transitions and scheduler decisions, oldest first."""
    with transaction(factory) as session:
        _owned(session, job_id, user)
        events = job_models.events(session, job_id, after_id=after, limit=limit)
        return EventPage(items=[EventOut.of(event) for event in events])


@router.get("/{job_id}/metrics", responses=_NOT_FOUND)
def job_metrics(
    job_id: JobId,
    user: User,
    factory: Factory,
    points: Annotated[int, Query(ge=1, le=5000, description="Most points returned.")] = 500,
) -> MetricSeries:
    """Per-iteration metrics, downsampled to at most `points` buckets."""
    with transaction(factory) as session:
        _owned(session, job_id, user)
        series = metric_models.series(session, job_id, points=points)
    return MetricSeries(
        job_id=job_id,
        points=[MetricPoint(iteration=p.iteration, **p.values) for p in series],
    )


@router.get("/{job_id}/allocations", responses=_NOT_FOUND)
def job_allocations(
    job_id: JobId,
    user: User,
    factory: Factory,
    limit: Annotated[int, Query(ge=1, le=5000)] = 500,
) -> AllocationPage:
    """The job's GPU leases, newest first: node, GPU, rank, SPB configuration, lease."""
    with transaction(factory) as session:
        _owned(session, job_id, user)
        rows = job_models.allocations(session, job_id, limit=limit)
        return AllocationPage(items=[AllocationOut.of(*row) for row in rows])
