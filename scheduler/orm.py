"""SQLAlchemy 2 typed ORM: every table JigSaw keeps. The database is the source of truth.

Schema changes go through an Alembic migration in `migrations/versions/`; a test checks
that autogenerate finds no difference between these classes and the migrated schema.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    TypeDecorator,
    UniqueConstraint,
    true,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from jigsaw.gpus import PAIR

# Deterministic constraint names, so migrations can drop them by name on both backends.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# SQLite only auto-increments INTEGER PRIMARY KEY; PostgreSQL gets a real BIGINT.
BigId = BigInteger().with_variant(Integer(), "sqlite")


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on both backends (SQLite drops the offset on read)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value


def table_of(model: type[Base]) -> Table:
    """The Core table of a mapped class, for executemany statements that bypass the ORM
    (`__table__` is only a FromClause to type checkers)."""
    table = model.__table__
    assert isinstance(table, Table)
    return table


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {datetime: UTCDateTime(), dict[str, Any]: JSON}


class User(Base):
    __tablename__ = "users"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    is_admin: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ApiToken(Base):
    """A bearer token, stored only as its SHA-256 hash.

    `scope` is `user` (acts as `user_id`) or `agent` (the cluster token worker agents
    present; it belongs to no user and cannot call the user API).
    """

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(primary_key=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    scope: Mapped[str] = mapped_column(String(16), default="user")
    user_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    description: Mapped[str] = mapped_column(String(200), default="")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(default=None)
    expires_at: Mapped[datetime | None] = mapped_column(default=None)  # None: never
    # Written when a request authenticates with it, at most once per LAST_USED_RESOLUTION
    # (scheduler/models/users.py), so authentication does not write on every request.
    last_used_at: Mapped[datetime | None] = mapped_column(default=None)

    user: Mapped[User | None] = relationship()


class Node(Base):
    __tablename__ = "nodes"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(253), unique=True)
    address: Mapped[str] = mapped_column(String(255), default="")
    # False while an operator keeps new work off the node (a cordoned or tainted
    # Kubernetes node, see scheduler/kube.py); jobs already there keep running.
    schedulable: Mapped[bool] = mapped_column(Boolean, default=True, server_default=true())
    unschedulable_reason: Mapped[str] = mapped_column(String(255), default="", server_default="")
    # Set while an admin drains the node (`jigsaw node drain`): no new placements. Apart
    # from `schedulable`, which the Kubernetes inventory owns, so neither undoes the other.
    drained_at: Mapped[datetime | None] = mapped_column(default=None)
    # Set by `jigsaw node remove`: the node leaves every view but its GPUs' allocation
    # history stays; an agent registering under the name again brings it back.
    removed_at: Mapped[datetime | None] = mapped_column(default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    gpus: Mapped[list[GPU]] = relationship(back_populates="node", order_by="GPU.index")


class GPU(Base):
    __tablename__ = "gpus"
    __table_args__ = (UniqueConstraint("node_id", "index"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"))
    index: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(64))
    memory_bytes: Mapped[int] = mapped_column(BigInteger)
    virtual: Mapped[bool] = mapped_column(Boolean, default=False)
    # How co-located jobs share it, as its agent reported: `time-sliced` or `mps`.
    sharing: Mapped[str] = mapped_column(
        String(16), default="time-sliced", server_default="time-sliced"
    )
    # Jobs it runs at once, as its agent reported: the most packing places on it.
    max_jobs: Mapped[int] = mapped_column(Integer, default=PAIR, server_default=str(PAIR))

    node: Mapped[Node] = relationship(back_populates="gpus")


class Agent(Base):
    """The worker agent serving a node; `alive` flips off after a heartbeat timeout."""

    __tablename__ = "agents"

    id: Mapped[int] = mapped_column(primary_key=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"), unique=True)
    version: Mapped[str] = mapped_column(String(64), default="")
    alive: Mapped[bool] = mapped_column(Boolean, default=True)
    registered_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_heartbeat_at: Mapped[datetime] = mapped_column(default=utcnow)


class Queue(Base):
    """A queue jobs are submitted to: GPUs guaranteed, borrowing, fair-share weight, an
    optional parent (one level) and who may submit (`users`: names; empty: everyone).
    The quota layer (`scheduler/core/quota.py`) holds every policy to them."""

    __tablename__ = "queues"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    # NULL: whatever the other queues' quotas leave of the cluster (the default queue's).
    quota: Mapped[int | None] = mapped_column(Integer, default=None)
    borrowing_limit: Mapped[int | None] = mapped_column(Integer, default=None)  # NULL: none
    weight: Mapped[float] = mapped_column(Float, default=1.0, server_default="1")
    parent_id: Mapped[int | None] = mapped_column(
        ForeignKey("queues.id", ondelete="RESTRICT"), default=None
    )
    users: Mapped[list[str]] = mapped_column(JSON, default=list, server_default="[]")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        Index("ix_jobs_state_priority_id", "state", "priority", "id"),
        Index("ix_jobs_owner_id_id", "owner_id", "id"),
        Index("ix_jobs_code_digest", "code_digest"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(128))
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="RESTRICT"))
    queue: Mapped[str] = mapped_column(String(64), default="default")
    priority: Mapped[int] = mapped_column(Integer, default=0)
    workers: Mapped[int] = mapped_column(Integer)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    state: Mapped[str] = mapped_column(String(16))
    message: Mapped[str] = mapped_column(Text, default="")
    # Why a waiting job cannot be placed (no capacity of the cluster can hold it), set by
    # the scheduler loop each round; NULL otherwise. Every transition clears it.
    pending_reason: Mapped[str | None] = mapped_column(String(255), default=None)
    # Who suspended a SUSPENDED job (scheduler.core.states.SuspendedBy); NULL otherwise.
    suspended_by: Mapped[str | None] = mapped_column(String(16), default=None)
    # When the scheduler expects this waiting job to start (`scheduler.core.waits`),
    # where its policy can tell; read only while the job waits.
    estimated_start_at: Mapped[datetime | None] = mapped_column(default=None)
    # Placements so far, each the fence (`attempt`) of the run it starts.
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    # Crashes of its training processes so far; retried while below spec.max_retries.
    failures: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # The last evaluation rank 0 reported, e.g. {"accuracy": 0.97, "loss": 0.1}.
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict, server_default="{}")
    iterations_done: Mapped[int] = mapped_column(BigInteger, default=0)
    # Steps of its base batch that its iterations are worth, as its newest record said:
    # what `max_iterations` counts (an adaptive batch's step counts AdaScale's gain; for
    # any other job it is `iterations_done`).
    progress: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(default=None)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)
    # spec.code: the code archive the job runs, which is kept while the job needs it.
    code_digest: Mapped[str | None] = mapped_column(String(71), default=None)

    owner: Mapped[User] = relationship()


class Allocation(Base):
    """A job's hold on one GPU for a lease; `released_at` is set when the hold ends."""

    __tablename__ = "allocations"
    __table_args__ = (
        Index("ix_allocations_job_id_released_at", "job_id", "released_at"),
        Index("ix_allocations_gpu_id_released_at", "gpu_id", "released_at"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    gpu_id: Mapped[int] = mapped_column(ForeignKey("gpus.id", ondelete="CASCADE"))
    rank: Mapped[int] = mapped_column(Integer)
    spb: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    # Bumped by every reconfiguration of the run (its launch is version 0).
    config_version: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # The job's placement this hold belongs to (`jobs.attempts` when it was made): the
    # fence its LaunchCommand carries, so an older run can never pass for this one.
    attempt: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # SHA-256 of the instance key of the agent process the run was launched to: only
    # that process may later claim the run (a Hello after a reconnect or a restart of
    # the scheduler). NULL until launched.
    agent_instance: Mapped[str | None] = mapped_column(String(64), default=None)
    # The memory the rank may use on this GPU (its LaunchCommand's cap), set at launch;
    # NULL until launched.
    memory_bytes: Mapped[int | None] = mapped_column(BigInteger, default=None)
    lease_start_iteration: Mapped[int] = mapped_column(BigInteger, default=0)
    lease_iterations: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    released_at: Mapped[datetime | None] = mapped_column(default=None)


class IterationMetric(Base):
    """One reported iteration of a job (rank 0's aggregate over its workers)."""

    __tablename__ = "iteration_metrics"
    __table_args__ = (Index("ix_iteration_metrics_job_id_iteration", "job_id", "iteration"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    iteration: Mapped[int] = mapped_column(BigInteger)
    reported_at: Mapped[datetime] = mapped_column(default=utcnow)
    step_seconds: Mapped[float] = mapped_column(Float)
    compute_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    comm_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    samples_per_second: Mapped[float] = mapped_column(Float, default=0.0)
    loss: Mapped[float | None] = mapped_column(Float, default=None)
    utilization: Mapped[float | None] = mapped_column(Float, default=None)
    peak_memory_bytes: Mapped[int | None] = mapped_column(BigInteger, default=None)
    bytes_communicated: Mapped[int | None] = mapped_column(BigInteger, default=None)
    spb_depth: Mapped[float | None] = mapped_column(Float, default=None)
    # The step's global batch and learning rate, and the gradient noise at the job's base
    # batch (jigsaw.gradnoise) where the runtime measured it.
    batch_size: Mapped[int | None] = mapped_column(Integer, default=None)
    learning_rate: Mapped[float | None] = mapped_column(Float, default=None)
    grad_sqr: Mapped[float | None] = mapped_column(Float, default=None)
    grad_var: Mapped[float | None] = mapped_column(Float, default=None)
    # Other jobs that shared rank 0's GPU during the iteration (0: alone; NULL: not
    # reported), so solo and co-located step times can be told apart.
    co_runners: Mapped[int | None] = mapped_column(Integer, default=None)
    # The job's worker count during the iteration (NULL: not reported): an elastic job's
    # step time by size, which its throughput model is fitted to.
    workers: Mapped[int | None] = mapped_column(Integer, default=None)
    # Steps of the base batch done after the iteration (`Job.progress`); NULL: not
    # reported (an older runtime), the iteration itself.
    progress: Mapped[float | None] = mapped_column(Float, default=None)


class JobLog(Base):
    """A line a job's training process wrote (stdout/stderr), as its agent forwarded it."""

    __tablename__ = "job_logs"
    __table_args__ = (Index("ix_job_logs_job_id_id", "job_id", "id"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    rank: Mapped[int] = mapped_column(Integer)
    level: Mapped[str] = mapped_column(String(16), default="INFO")
    message: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class CodeArchive(Base):
    """A job's code as uploaded (a gzipped tar, `jigsaw.codearchive`), by its digest.

    Content-addressed: the same code uploaded twice is one row. Deleted once no job that
    names it is running or ended within the code retention (scheduler.models.code)."""

    __tablename__ = "code_archives"

    digest: Mapped[str] = mapped_column(String(71), primary_key=True)
    size: Mapped[int] = mapped_column(BigInteger)
    data: Mapped[bytes] = mapped_column(LargeBinary)
    # Its last upload: uploading the same code again restarts its retention.
    uploaded_at: Mapped[datetime] = mapped_column(default=utcnow)


class CodeOwner(Base):
    """Who uploaded an archive: only they may name it in a job's spec. Knowing a digest
    (which a spec, a log or the code itself may give away) is not enough to run it."""

    __tablename__ = "code_owners"

    digest: Mapped[str] = mapped_column(
        ForeignKey("code_archives.digest", ondelete="CASCADE"), primary_key=True
    )
    user_id: Mapped[int] = mapped_column(
        ForeignKey("users.id", ondelete="CASCADE"), primary_key=True
    )


class ModelProfile(Base):
    """Measured per-stage costs of a workload (filled by the SPB profiler)."""

    __tablename__ = "model_profiles"
    __table_args__ = (UniqueConstraint("workload", "key"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    workload: Mapped[str] = mapped_column(String(200))
    key: Mapped[str] = mapped_column(String(200), default="")
    data: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class SchedulerRound(Base):
    """One round the scheduler leader ran: when, how long, who ran it, what it decided.

    `counts` holds the round's tallies (scheduler.loop.RoundResult); `decisions` is a
    list of `{"kind": ..., "job_id": ..., <details>}` objects, one per decision, in the
    order the loop made them (scheduler.core.rounds.Decision). Only recent rounds are kept
    (JIGSAW_SCHEDULER_ROUNDS_KEPT); the audit trail of each job stays in `events`.
    """

    __tablename__ = "scheduler_rounds"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    seconds: Mapped[float] = mapped_column(Float)
    leader: Mapped[str] = mapped_column(String(255), default="")
    decision_count: Mapped[int] = mapped_column(Integer, default=0)
    counts: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    decisions: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    error: Mapped[str | None] = mapped_column(Text, default=None)


class Event(Base):
    """Audit log: every job state transition and scheduler decision."""

    __tablename__ = "events"
    __table_args__ = (Index("ix_events_job_id_id", "job_id", "id"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(32))
    from_state: Mapped[str | None] = mapped_column(String(16), default=None)
    to_state: Mapped[str | None] = mapped_column(String(16), default=None)
    actor: Mapped[str] = mapped_column(String(64), default="")
    message: Mapped[str] = mapped_column(Text, default="")
    data: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
