"""Response schemas of the HTTP API (requests use jigsaw.jobspec.JobSpec directly)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from scheduler.models.nodes import NodeChange
from scheduler.models.queues import QueueInfo
from scheduler.models.users import USER_NAME_PATTERN, TokenInfo
from scheduler.orm import Allocation, Event, Job, JobLog, ModelProfile, SchedulerRound


class ErrorDetail(BaseModel):
    loc: str = Field(description="The field: `workers`, `query.owner`, `path`, `body`...")
    message: str


class ErrorInfo(BaseModel):
    status: int
    message: str
    details: list[ErrorDetail] = Field(description="One per invalid field (422).")


class ErrorBody(BaseModel):
    """Every error the API answers (api/errors.py)."""

    error: ErrorInfo


_ERROR_MEANINGS = {
    400: "The body could not be parsed.",
    401: "No bearer token, or an invalid or revoked one.",
    403: "The token may not do this (an agent token, or a non-admin).",
    404: "No such job, profile, node or queue, or not the caller's.",
    409: "The job's state (or the queues as they are) does not allow this; nothing changed.",
    413: "The body is larger than settings.api.max_body_bytes; it was not read.",
    422: "Invalid input: `details` names each field (a NUL character, a NaN, a duplicate "
    "key, a value of the wrong type...).",
    503: "The database is unreachable or its schema is behind.",
}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for these error statuses, each with the error body."""
    return {
        status: {"model": ErrorBody, "description": _ERROR_MEANINGS[status]} for status in statuses
    }


# Any /v1 route may answer these: the guard (api/guards.py) checks every request.
V1_ERRORS = error_responses(401, 403, 413, 422)


class QueuePosition(BaseModel):
    queue: int = Field(description="1 = next among its queue's waiting jobs.")
    overall: int = Field(description="1 = next among all waiting jobs.")


class JobOut(BaseModel):
    id: int
    name: str
    owner: str
    queue: str
    priority: int
    workers: int
    state: str
    message: str
    pending_reason: str | None = Field(
        description="Why this waiting job did not start in the scheduler's last round: no "
        "capacity of the cluster can hold it, its queue is at its quota or fair share, too "
        "few GPUs are free, jobs ahead of it wait (null while it is not waiting)."
    )
    position: QueuePosition | None = Field(
        default=None,
        description="Where this waiting job stands in the order queues are served "
        "(priority, then submission); null while it is not waiting.",
    )
    estimated_start_at: datetime | None = Field(
        default=None,
        description="When this waiting job is expected to start, where the policy can tell "
        "(FIFO, every job ahead with a measured speed); null otherwise.",
    )
    attempts: int
    failures: int = Field(description="Crashes of its training processes so far.")
    iterations_done: int
    progress: float = Field(
        description="What `max_iterations` counts done: `iterations_done`, or with an "
        "adaptive batch the steps of the base batch they are worth (AdaScale's gain a step)."
    )
    metrics: dict[str, float] = Field(description="Its last evaluation, e.g. accuracy.")
    spec: dict[str, Any]
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None

    @classmethod
    def of(cls, job: Job, owner: str, position: tuple[int, int] | None = None) -> JobOut:
        return cls(
            id=job.id,
            name=job.name,
            owner=owner,
            queue=job.queue,
            priority=job.priority,
            workers=job.workers,
            state=job.state,
            message=job.message,
            pending_reason=job.pending_reason,
            position=None
            if position is None
            else QueuePosition(queue=position[0], overall=position[1]),
            estimated_start_at=job.estimated_start_at if position is not None else None,
            attempts=job.attempts,
            failures=job.failures,
            iterations_done=job.iterations_done,
            progress=job.progress,
            metrics=job.metrics or {},
            spec=job.spec,
            created_at=job.created_at,
            updated_at=job.updated_at,
            started_at=job.started_at,
            finished_at=job.finished_at,
        )


class JobPage(BaseModel):
    items: list[JobOut]
    total: int
    next_after: int | None


class EventOut(BaseModel):
    id: int
    kind: str
    from_state: str | None
    to_state: str | None
    actor: str
    message: str
    data: dict[str, Any]
    created_at: datetime

    @classmethod
    def of(cls, event: Event) -> EventOut:
        return cls(
            id=event.id,
            kind=event.kind,
            from_state=event.from_state,
            to_state=event.to_state,
            actor=event.actor,
            message=event.message,
            data=event.data,
            created_at=event.created_at,
        )


class EventPage(BaseModel):
    items: list[EventOut]


class LogLine(BaseModel):
    id: int
    rank: int
    level: str
    message: str
    created_at: datetime

    @classmethod
    def of(cls, line: JobLog) -> LogLine:
        return cls(
            id=line.id,
            rank=line.rank,
            level=line.level,
            message=line.message,
            created_at=line.created_at,
        )


class LogPage(BaseModel):
    items: list[LogLine]
    next_after: int = Field(description="Pass as `after` to get the lines that follow.")


class MetricPoint(BaseModel):
    iteration: int
    step_seconds: float | None
    compute_seconds: float | None
    comm_seconds: float | None
    samples_per_second: float | None
    loss: float | None
    utilization: float | None
    spb_depth: float | None = Field(
        default=None,
        description="Mean backpropagation depth over the job's workers, as a fraction of "
        "its stages (1 = full backprop); null until the runtime reports it.",
    )
    workers: float | None = Field(
        default=None,
        description="Workers the job ran on (an elastic job's change at resizes; a mean "
        "where a point's iterations straddle one).",
    )
    batch_size: float | None = Field(
        default=None,
        description="Global batch (an adaptive job's, as the scheduler chose it).",
    )
    learning_rate: float | None = Field(
        default=None,
        description="Learning rate the optimizer stepped with (an adaptive job's scaled "
        "by AdaScale's gain).",
    )
    progress: float | None = Field(
        default=None,
        description="What `max_iterations` counts done after the iteration: the iteration, "
        "or an adaptive job's steps of its base batch (AdaScale's gain a step).",
    )


class MetricSeries(BaseModel):
    job_id: int
    points: list[MetricPoint]


class HolderOut(BaseModel):
    """One worker's hold on a GPU. Who holds it is shown only to the job's owner and to
    admins; everyone else gets job_id null, job_name "" and spb {} (the GPU is busy)."""

    job_id: int | None = Field(description="Null unless the caller owns the job or is admin.")
    job_name: str = Field(description="Empty unless the caller owns the job or is admin.")
    rank: int
    spb: dict[str, Any]
    utilization: float | None


class GPUOut(BaseModel):
    id: int
    index: int
    kind: str
    memory_bytes: int
    virtual: bool
    holders: list[HolderOut]


class NodeOut(BaseModel):
    id: int
    name: str
    alive: bool
    schedulable: bool = Field(
        description="False while Kubernetes keeps new jobs off it (cordoned, tainted, not "
        "Ready); an admin's drain is `drained_at`, apart."
    )
    unschedulable_reason: str
    drained_at: datetime | None = Field(
        description="Set while an admin drains it (`jigsaw node drain`): no new jobs."
    )
    last_heartbeat_at: datetime | None
    agent_version: str
    gpus: list[GPUOut]


class ClusterTotals(BaseModel):
    gpus: int
    gpus_busy: int = Field(description="Held by a job.")
    gpus_free: int = Field(description="Not held, on an alive, schedulable, undrained node.")
    gpus_unavailable: int = Field(description="Not held, on a dead, unschedulable or drained node.")
    jobs_queued: int
    jobs_running: int
    jobs_by_state: dict[str, int]
    window_seconds: float = Field(description="The window of allocation and efficiency.")
    allocation: float | None = Field(
        description="GPU-seconds held / available over the window; null without GPUs."
    )
    efficiency: float | None = Field(
        description="GPU-seconds held x measured utilization / available over the window "
        "(scheduler/models/efficiency.py); null without GPUs."
    )


class ClusterOut(BaseModel):
    nodes: list[NodeOut]
    totals: ClusterTotals


class WhoAmI(BaseModel):
    name: str
    is_admin: bool


class AllocationOut(BaseModel):
    """One worker's lease on one GPU: where, under which SPB configuration, how long."""

    id: int
    rank: int
    gpu_id: int
    node: str
    gpu_index: int
    spb: dict[str, Any]
    lease_start_iteration: int
    lease_iterations: int
    created_at: datetime
    released_at: datetime | None

    @classmethod
    def of(cls, allocation: Allocation, node: str, gpu_index: int) -> AllocationOut:
        return cls(
            id=allocation.id,
            rank=allocation.rank,
            gpu_id=allocation.gpu_id,
            node=node,
            gpu_index=gpu_index,
            spb=allocation.spb,
            lease_start_iteration=allocation.lease_start_iteration,
            lease_iterations=allocation.lease_iterations,
            created_at=allocation.created_at,
            released_at=allocation.released_at,
        )


class AllocationPage(BaseModel):
    items: list[AllocationOut] = Field(description="Newest first.")


class RoundOut(BaseModel):
    id: int
    started_at: datetime
    seconds: float
    leader: str = Field(description="host:pid of the scheduler replica that ran it.")
    counts: dict[str, int]
    decisions: list[dict[str, Any]] = Field(
        description='`{"kind", "job_id", ...details}` each, in the order made. Kinds: '
        "lease, launch_refused, suspend, stop, requeue, release, agent_lost, unplaceable, "
        "reconfigure, and whatever a policy adds (pack, ...). Decisions on other users' "
        "jobs show only their kind."
    )
    error: str | None

    @classmethod
    def of(cls, row: SchedulerRound, decisions: list[dict[str, Any]]) -> RoundOut:
        return cls(
            id=row.id,
            started_at=row.started_at,
            seconds=row.seconds,
            leader=row.leader,
            counts=row.counts,
            decisions=decisions,
            error=row.error,
        )


class RoundPage(BaseModel):
    items: list[RoundOut] = Field(description="Newest first.")
    next_before: int | None = Field(description="Pass as `before` for older rounds.")


class StageProfileIn(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    forward_seconds: float = Field(ge=0, description="Forward time of the stage.")
    backward_input_seconds: float = Field(ge=0, description="Input-gradient (dX) time.")
    backward_weight_seconds: float = Field(ge=0, description="Weight-gradient (dW) time.")
    activation_bytes: int = Field(ge=0, description="Bytes autograd saves for its backward.")
    parameter_bytes: int = Field(ge=0, description="Bytes of its parameters.")


class ProfileIn(BaseModel):
    """A workload's per-stage costs (`jigsaw profile --save` sends one)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    per_worker_batch: int = Field(ge=1, description="Batch size of one worker.")
    stages: list[StageProfileIn] = Field(min_length=1, max_length=1024)
    steps_ratio: dict[str, float] = Field(
        default_factory=dict,
        description="Steps to the target under each SPB configuration (`0.5/0.25`) over "
        "the steps at full backprop.",
    )
    device_kind: str = Field(
        default="cpu", min_length=1, max_length=100, description="What it was measured on."
    )
    utilization: float | None = Field(
        default=None,
        ge=0,
        description="The device's utilization while the stages were timed (CPU: the "
        "process's CPU time per thread); unset: not measured.",
    )
    peak_memory_bytes: int | None = Field(
        default=None,
        ge=0,
        le=2**50,
        description="The device memory the timed passes took at most (CUDA: the "
        "allocator's peak; CPU: the process's resident set, as jobs report it); unset: "
        "not measured. With the utilization, JigSaw may pack a job that has not run yet.",
    )

    @field_validator("steps_ratio")
    @classmethod
    def _positive(cls, value: dict[str, float]) -> dict[str, float]:
        bad = {key: ratio for key, ratio in value.items() if not ratio > 0}
        if bad:
            raise ValueError(f"steps ratios must be positive, got {bad}")
        return value


class ProfileOut(BaseModel):
    workload: str
    key: str
    created_at: datetime
    profile: dict[str, Any] = Field(description="jigsaw.spb.SPBProfile as JSON.")

    @classmethod
    def of(cls, row: ModelProfile) -> ProfileOut:
        return cls(workload=row.workload, key=row.key, created_at=row.created_at, profile=row.data)


class ProfilePage(BaseModel):
    items: list[ProfileOut]


# -- tokens ---------------------------------------------------------------------------

# Ten years: long enough for any real use, small enough for every datetime library.
MAX_EXPIRY_SECONDS = 10 * 365 * 86400


class TokenOut(BaseModel):
    """A token as listings show it; the token itself is never stored, only its hash."""

    id: int
    prefix: str = Field(description="Its first characters: what `DELETE /v1/tokens/{key}` takes.")
    kind: Literal["user", "agent"] = Field(description="`agent`: the cluster token agents use.")
    user: str | None = Field(description="Whom a user token acts as; null for agent tokens.")
    description: str
    created_at: datetime
    last_used_at: datetime | None = Field(description="Accurate to a minute; null: never used.")
    expires_at: datetime | None = Field(description="Null: never expires.")
    revoked_at: datetime | None

    @classmethod
    def of(cls, info: TokenInfo) -> TokenOut:
        return cls(
            id=info.id,
            prefix=info.prefix,
            kind="agent" if info.scope == "agent" else "user",
            user=info.user_name,
            description=info.description,
            created_at=info.created_at,
            last_used_at=info.last_used_at,
            expires_at=info.expires_at,
            revoked_at=info.revoked_at,
        )


class TokenPage(BaseModel):
    items: list[TokenOut] = Field(description="Oldest first.")


class TokenIn(BaseModel):
    """A token to issue (admins only)."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["user", "agent"] = "user"
    user: str | None = Field(
        default=None,
        pattern=USER_NAME_PATTERN,
        description="Whom a user token acts as (created if new); not for agent tokens.",
    )
    admin: bool = Field(default=False, description="Make the user an admin.")
    description: str = Field(default="", max_length=200)
    expires_in_seconds: int | None = Field(
        default=None, ge=1, le=MAX_EXPIRY_SECONDS, description="Null: never expires."
    )

    @model_validator(mode="after")
    def _owner(self) -> TokenIn:
        if (self.kind == "user") != (self.user is not None):
            raise ValueError("a user token needs `user`; an agent token must not have one")
        if self.kind == "agent" and self.admin:
            raise ValueError("`admin` applies to user tokens only")
        return self


class TokenCreated(TokenOut):
    token: str = Field(description="The token itself: shown this once, stored only hashed.")


# -- nodes ----------------------------------------------------------------------------


class NodeChangeOut(BaseModel):
    name: str
    drained_at: datetime | None
    removed_at: datetime | None
    jobs_suspended: list[int] = Field(
        description="RUNNING jobs `now` suspended: they checkpoint at their next iteration "
        "boundary and wait to be placed on other nodes."
    )
    jobs_requeued: list[int] = Field(description="Jobs being launched there, queued again.")

    @classmethod
    def of(cls, change: NodeChange) -> NodeChangeOut:
        return cls(
            name=change.name,
            drained_at=change.drained_at,
            removed_at=change.removed_at,
            jobs_suspended=change.suspended,
            jobs_requeued=change.requeued,
        )


# Queue names are what job specs name (jigsaw.jobspec: 1-64 characters).
QUEUE_NAME_PATTERN = r"^[A-Za-z0-9][-_.A-Za-z0-9]{0,63}$"


class QueueFields(BaseModel):
    """What an admin sets on a queue; every field may be changed later."""

    model_config = ConfigDict(extra="forbid", strict=True)

    quota: int | None = Field(
        default=None,
        ge=0,
        le=1_000_000,
        description="GPUs guaranteed while its jobs want them (null: what the other "
        "queues' quotas leave of the cluster or of its parent).",
    )
    borrowing_limit: int | None = Field(
        default=None,
        ge=0,
        le=1_000_000,
        description="How many idle GPUs of other queues it may use beyond its quota "
        "(null: no limit; 0: never borrows).",
    )
    weight: float = Field(
        default=1.0,
        gt=0,
        le=1000,
        allow_inf_nan=False,
        description="Its share of what is left after guarantees, against the other borrowers'.",
    )
    parent: str | None = Field(
        default=None,
        pattern=QUEUE_NAME_PATTERN,
        description="A top-level queue whose allowance it shares with its siblings (one "
        "level: an organisation and its teams).",
    )
    users: list[Annotated[str, Field(pattern=USER_NAME_PATTERN)]] = Field(
        default_factory=list,
        max_length=1000,
        description="User names that may submit to it (empty: everyone).",
    )


class QueueIn(QueueFields):
    name: str = Field(pattern=QUEUE_NAME_PATTERN, description="Its unique name.")


class QueuePatch(QueueFields):
    """Only the fields sent change (send null to clear quota, borrowing limit, parent)."""


class QueueOut(BaseModel):
    name: str
    quota: int | None
    borrowing_limit: int | None
    weight: float
    parent: str | None
    users: list[str]
    pending_jobs: int = Field(description="Jobs waiting for GPUs.")
    admitted_jobs: int = Field(description="Jobs holding GPUs.")
    gpus_in_use: int
    borrowed_gpus: int = Field(description="GPUs held beyond its quota.")
    created_at: datetime

    @classmethod
    def of(cls, info: QueueInfo) -> QueueOut:
        row = info.row
        return cls(
            name=row.name,
            quota=row.quota,
            borrowing_limit=row.borrowing_limit,
            weight=row.weight,
            parent=info.parent,
            users=list(row.users),
            pending_jobs=info.pending_jobs,
            admitted_jobs=info.admitted_jobs,
            gpus_in_use=info.gpus_in_use,
            borrowed_gpus=info.borrowed_gpus,
            created_at=row.created_at,
        )


class QueueList(BaseModel):
    items: list[QueueOut]
