"""`AgentService`: the gRPC endpoint worker agents dial (see agent.proto).

Every message is validated before it touches state: a malformed Register or Connect is
rejected with INVALID_ARGUMENT (or FAILED_PRECONDITION for a node that never
registered) and a clear message, and writes nothing. A node name is held by one agent
process at a time: another one's Register or Connect is refused with ALREADY_EXISTS
while the holder's session lives. What an agent says about a job (a hello's running
jobs and exits, reports, logs, evaluations, exits, profiles) is taken only for the
jobs the scheduler allocated to that agent's node in their current attempt (the
dispatcher's `refusal`); everything else is dropped, counted in
`jigsaw_reports_dropped_total{reason}` and logged as a warning.

Much of what an agent forwards was written by trial code, which is not trusted: every
message is scrubbed where it enters (`agents.scrub`: no NUL, no non-finite metric), and
an invalid iteration record or profile is dropped and counted (reason `invalid`) without
ending the stream, which carries the agent's other jobs and its heartbeats. Records an
agent replays after a restart are history of a run the scheduler may have forgotten:
they are taken for any job ever allocated to that node, and only for iterations the job
has no row for.
"""

from __future__ import annotations

import logging
import math
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
from sqlalchemy.orm import Session, sessionmaker

from jigsaw.gpus import PAIR, GpuSlot, Sharing
from jigsaw.jobspec import checked_workload
from jigsaw.proto import convert
from jigsaw.proto.v2 import agent_pb2 as pb
from jigsaw.proto.v2 import agent_pb2_grpc
from jigsaw.spb import SPBProfile
from scheduler.agents.dispatcher import AgentDispatcher, AgentSession, Dropped, NodeTaken
from scheduler.agents.ingest import ReportWriter
from scheduler.agents.scrub import scrub
from scheduler.db import transaction
from scheduler.models import code as code_models
from scheduler.models.agents import ran_on, register, registered_agent
from scheduler.models.profiles import save_profile
from scheduler.telemetry import SchedulerTelemetry

logger = logging.getLogger(__name__)

# Kubernetes node names are DNS subdomains; the same rule keeps names safe everywhere.
_NODE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$", re.IGNORECASE)
# An agent process's instance key: drawn at random by the agent, kept secret.
_INSTANCE = re.compile(r"[A-Za-z0-9_-]{16,128}")
_MAX_GPUS = 1024
_MAX_JOBS_PER_GPU = 64
# An agent older than the field says nothing: its GPUs are time sliced.
_SHARING: dict[int, Sharing] = {pb.SHARING_MPS: "mps", pb.SHARING_TIME_SLICED: "time-sliced"}
_MAX_TEXT = 64 * 1024
# One warning per node and reason in this many seconds: a flood of bad messages is
# counted in full but does not flood the log.
_DROP_WARNING_SECONDS = 10.0
# Code archives go out in chunks well below gRPC's 4 MiB message limit.
_CODE_CHUNK_BYTES = 1024 * 1024


class InvalidMessage(ValueError):
    """An agent message that breaks the protocol; its text is what the agent is told."""


def check_instance(instance: str) -> None:
    if not _INSTANCE.fullmatch(instance):
        raise InvalidMessage(
            "instance must be the agent process's random key: 16-128 letters, digits, '-', '_'"
        )


def gpu_slots(request: pb.RegisterRequest) -> list[GpuSlot]:
    if not _NODE_NAME.fullmatch(request.node_name):
        raise InvalidMessage(
            f"node_name {request.node_name!r} is not a DNS name (letters, digits, '-', '.')"
        )
    if len(request.gpus) > _MAX_GPUS:
        raise InvalidMessage(f"{len(request.gpus)} GPUs is more than {_MAX_GPUS}")
    if len(request.address) > 255 or len(request.agent_version) > 64:
        raise InvalidMessage("address or agent_version is too long")
    indexes = [gpu.index for gpu in request.gpus]
    if len(set(indexes)) != len(indexes) or any(index < 0 for index in indexes):
        raise InvalidMessage(f"GPU indexes must be unique and non-negative, got {indexes}")
    for gpu in request.gpus:
        if gpu.memory_bytes < 0 or not gpu.kind or len(gpu.kind) > 64:
            raise InvalidMessage(f"GPU {gpu.index}: kind must be 1-64 chars, memory >= 0")
        if not 0 <= gpu.max_jobs <= _MAX_JOBS_PER_GPU:
            raise InvalidMessage(f"GPU {gpu.index}: max_jobs must be 0-{_MAX_JOBS_PER_GPU}")
    check_instance(request.instance)
    return [
        GpuSlot(
            gpu.index,
            gpu.kind,
            gpu.memory_bytes,
            gpu.virtual,
            _SHARING.get(gpu.sharing, "time-sliced"),
            gpu.max_jobs or PAIR,
        )
        for gpu in request.gpus
    ]


def metric_rows(records: Any) -> tuple[list[dict[str, Any]], int]:
    """The storable rows of these records, and how many were not (trial code can forge
    any record, so a bad one is dropped, never held against the stream)."""
    rows = []
    for record in records:
        values = (
            record.step_seconds,
            record.compute_seconds,
            record.comm_seconds,
            record.samples_per_second,
        )
        depth = record.spb_depth if record.HasField("spb_depth") else None
        noise = [
            getattr(record, name) if record.HasField(name) else None
            for name in ("grad_sqr", "grad_var")
        ]
        progress = record.progress if record.HasField("progress") else None
        if (
            record.iteration < 1
            or not all(math.isfinite(v) and v >= 0 for v in values)
            or (depth is not None and not 0 < depth <= 1)
            or any(v is not None and not (math.isfinite(v) and v >= 0) for v in noise)
            or (progress is not None and not (math.isfinite(progress) and progress >= 0))
            or record.batch_size < 0
            or record.workers < 0
        ):
            continue
        utilization = record.utilization if record.HasField("utilization") else None
        rows.append(
            {
                "iteration": record.iteration,
                "step_seconds": record.step_seconds,
                "compute_seconds": record.compute_seconds,
                "comm_seconds": record.comm_seconds,
                "samples_per_second": record.samples_per_second,
                # A diverged loss is a fact worth keeping; JSON and SQL want None for it.
                "loss": _finite_or_none(record.loss),
                "utilization": _finite_or_none(utilization),
                "peak_memory_bytes": record.peak_memory_bytes,
                "bytes_communicated": record.bytes_communicated,
                "spb_depth": depth,
                # 0: a runtime that does not say (an older agent).
                "batch_size": record.batch_size or None,
                "learning_rate": _finite_or_none(record.learning_rate or None),
                "grad_sqr": noise[0],
                "grad_var": noise[1],
                "co_runners": max(record.co_runners, 0),
                "workers": record.workers or None,  # 0: a runtime that does not say
                "progress": progress,
            }
        )
    return rows, len(records) - len(rows)


def _finite_or_none(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def model_profile(report: pb.ModelProfileReport) -> tuple[SPBProfile, str, float | None]:
    """The profile a report carries, the device kind it was measured on and the
    device's utilization meanwhile (None: not measured)."""
    try:
        checked_workload(report.workload)
        profile = convert.model_profile(report.profile)
        figures = [value for stage in profile.stages for value in vars(stage).values()]
        valid = (
            profile.workload == report.workload
            and profile.stages
            and profile.per_worker_batch >= 1
            and all(math.isfinite(v) and v >= 0 for v in figures)
            and all(math.isfinite(r) and r > 0 for r in profile.steps_ratio.values())
            and all("\0" not in name for name in profile.steps_ratio)
            and 0 < len(report.device_kind) <= 64
        )
        utilization = report.utilization if report.HasField("utilization") else None
        valid = valid and (utilization is None or (math.isfinite(utilization) and utilization >= 0))
    except ValueError as exc:
        raise InvalidMessage(f"profile of job {report.job_id}: {exc}") from None
    if not valid:
        raise InvalidMessage(f"profile of job {report.job_id} has invalid values")
    return profile, report.device_kind, utilization


class AgentService(agent_pb2_grpc.AgentServiceServicer):
    def __init__(
        self,
        factory: sessionmaker[Session],
        dispatcher: AgentDispatcher,
        writer: ReportWriter,
        heartbeat_interval_seconds: float,
        telemetry: SchedulerTelemetry | None = None,
    ) -> None:
        self._factory = factory
        self._dispatcher = dispatcher
        self._writer = writer
        self._heartbeat_interval = heartbeat_interval_seconds
        self._telemetry = telemetry
        self._warned: dict[tuple[str, str], float] = {}
        self._warned_lock = threading.Lock()

    def Register(  # noqa: N802 (the generated servicer's name)
        self, request: pb.RegisterRequest, context: grpc.ServicerContext
    ) -> pb.RegisterResponse:
        try:
            slots = gpu_slots(request)
        except InvalidMessage as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        problem = self._dispatcher.holder(request.node_name, request.instance)
        if problem is not None:
            context.abort(grpc.StatusCode.ALREADY_EXISTS, problem)
        with transaction(self._factory) as session:
            registration = register(
                session,
                node_name=request.node_name,
                address=request.address or context.peer(),
                gpus=slots,
                version=request.agent_version,
                # Alive once its stream is, not because it registered (a process that
                # never connects could): its heartbeats say so.
                heartbeat=False,
            )
        logger.info(
            "agent %s registered %d GPU(s), version %s",
            request.node_name,
            len(slots),
            request.agent_version,
            extra={"node": request.node_name, "agent_id": registration.agent_id},
        )
        return pb.RegisterResponse(
            agent_id=registration.agent_id,
            node_id=registration.node_id,
            heartbeat_interval_seconds=self._heartbeat_interval,
        )

    def Connect(  # noqa: N802
        self, request_iterator: Iterator[pb.AgentMessage], context: grpc.ServicerContext
    ) -> Iterator[pb.SchedulerMessage]:
        first = next(request_iterator, None)
        if first is None or first.WhichOneof("body") != "hello":
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "the first message of Connect must be a hello"
            )
            return
        if scrub(first) and self._telemetry is not None:
            self._telemetry.reports_scrubbed.inc()
        hello = first.hello
        try:
            check_instance(hello.instance)
        except InvalidMessage as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            return
        with transaction(self._factory) as session:
            row = registered_agent(session, hello.node_name)
        if row is None:
            context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"node {hello.node_name!r} is not registered: call Register first",
            )
            return
        node_id, agent_id = row
        try:
            session_, dropped = self._dispatcher.open_session(
                hello.node_name, node_id, agent_id, hello, context.peer()
            )
        except NodeTaken as exc:
            context.abort(grpc.StatusCode.ALREADY_EXISTS, str(exc))
            return
        for drop in dropped:
            self._drop(session_, drop)
        self._writer.heartbeat(agent_id)
        logger.info(
            "agent %s connected, running jobs %s",
            hello.node_name,
            sorted(job.job_id for job in hello.running),
            extra={"node": hello.node_name, "agent_id": agent_id},
        )
        failure: list[InvalidMessage] = []
        reader = threading.Thread(
            target=self._read,
            args=(request_iterator, session_, failure),
            name=f"jigsaw-agent-{hello.node_name}",
            daemon=True,
        )
        reader.start()
        try:
            while True:
                message = session_.outbox.get()
                if message is None:
                    break
                yield message
        finally:
            self._dispatcher.close_session(session_)
            logger.info("agent %s disconnected", hello.node_name, extra={"node": hello.node_name})
        if failure:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(failure[0]))

    def FetchCode(  # noqa: N802
        self, request: pb.CodeRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.CodeChunk]:
        """A job's code for the live agent of a node the job was allocated to; anyone
        else (another instance, a job never placed there, a digest the job does not
        name) gets NOT_FOUND and learns nothing of what exists."""
        try:
            check_instance(request.instance)
        except InvalidMessage as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        refused = (
            f"job {request.job_id} on node {request.node_name!r} has no code {request.digest!r}"
        )
        if self._dispatcher.holder(request.node_name, request.instance) is not None:
            context.abort(grpc.StatusCode.NOT_FOUND, refused)
        with transaction(self._factory) as session:
            data = code_models.archive_for_node(
                session, request.job_id, request.node_name, request.digest
            )
        if data is None:
            context.abort(grpc.StatusCode.NOT_FOUND, refused)
            return
        for start in range(0, len(data), _CODE_CHUNK_BYTES):
            yield pb.CodeChunk(data=data[start : start + _CODE_CHUNK_BYTES])

    def _read(
        self,
        messages: Iterator[pb.AgentMessage],
        session: AgentSession,
        failure: list[InvalidMessage],
    ) -> None:
        try:
            for message in messages:
                if session.closed.is_set():
                    return
                self._handle(session, message)
        except InvalidMessage as exc:
            logger.warning(
                "agent %s broke the protocol: %s",
                session.node_name,
                exc,
                extra={"node": session.node_name, "agent_id": session.agent_id},
            )
            failure.append(exc)
        except grpc.RpcError:
            pass  # the agent went away; the stream's end says so
        except Exception:
            logger.exception(
                "agent %s: handling a message failed",
                session.node_name,
                extra={"node": session.node_name, "agent_id": session.agent_id},
            )
        finally:
            session.close()

    def _handle(self, session: AgentSession, message: pb.AgentMessage) -> None:
        kind = message.WhichOneof("body")
        session.seen()
        self._writer.heartbeat(session.agent_id)
        if kind == "heartbeat":
            return
        if scrub(message) and self._telemetry is not None:
            self._telemetry.reports_scrubbed.inc()
        if kind == "reports":
            for job in message.reports.jobs:
                if (job.replayed and self._ran_on(session, job.job_id)) or self._taken(
                    session, "reports", job.job_id, len(job.records)
                ):
                    rows, invalid = metric_rows(job.records)
                    self._writer.metrics(job.job_id, rows, replayed=job.replayed)
                    if invalid:
                        self._count_invalid(invalid)
        elif kind == "exit":
            reason = self._dispatcher.job_exited(session, message.exit)
            if reason is not None:
                self._drop(session, Dropped("exit", message.exit.job_id, reason))
        elif kind == "shrunk":
            reason = self._dispatcher.job_shrunk(session, message.shrunk)
            if reason is not None:
                self._drop(session, Dropped("shrunk", message.shrunk.job_id, reason))
        elif kind == "log":
            log = message.log
            if self._taken(session, "log", log.job_id):
                self._writer.log(log.job_id, log.rank, log.level[:16], log.message[:_MAX_TEXT])
        elif kind == "evaluation":
            evaluation = message.evaluation
            if self._taken(session, "evaluation", evaluation.job_id):
                self._writer.evaluation(evaluation.job_id, dict(evaluation.metrics))
        elif kind == "profile":
            if self._taken(session, "profile", message.profile.job_id):
                self._save_profile(session, message.profile)
        elif kind == "hello":
            raise InvalidMessage("hello is only the first message of a stream")
        else:
            raise InvalidMessage("empty agent message")

    def _ran_on(self, session: AgentSession, job_id: int) -> bool:
        """Records an agent replays after a restart may be of a run the scheduler has
        forgotten since (it requeued the job, or restarted): they are history, taken
        from the nodes the job was ever allocated to."""
        with transaction(self._factory) as db:
            return ran_on(db, job_id, session.node_id)

    def _save_profile(self, session: AgentSession, report: pb.ModelProfileReport) -> None:
        """Trial code can forge a profile: a bad one is dropped and logged, and the
        stream (every other job of the agent) goes on."""
        try:
            profile, device_kind, utilization = model_profile(report)
            with transaction(self._factory) as db:
                save_profile(db, profile, device_kind, utilization, keep_price=True)
        except Exception as exc:
            self._count_invalid(1)
            logger.warning(
                "agent %s: %s; dropped",
                session.node_name,
                exc,
                extra={"node": session.node_name, "job_id": report.job_id},
            )

    def _taken(self, session: AgentSession, kind: str, job_id: int, count: int = 1) -> bool:
        """Whether a message about `job_id` may be stored; if not, it is counted."""
        reason = self._dispatcher.refusal(session, job_id)
        if reason is None:
            return True
        self._drop(session, Dropped(kind, job_id, reason), count)
        return False

    def _drop(self, session: AgentSession, drop: Dropped, count: int = 1) -> None:
        if self._telemetry is not None:
            self._telemetry.reports_dropped.labels(drop.reason).inc(count)
        key = (session.node_name, drop.reason)
        now = time.monotonic()
        with self._warned_lock:
            if now - self._warned.get(key, -math.inf) < _DROP_WARNING_SECONDS:
                return
            self._warned[key] = now
        logger.warning(
            "agent %s: dropped its %s about job %d (%s); such drops are logged once per "
            "node and reason every few seconds, and all counted in "
            "jigsaw_reports_dropped_total",
            session.node_name,
            drop.kind,
            drop.job_id,
            drop.reason,
            extra={"node": session.node_name, "agent_id": session.agent_id, "job_id": drop.job_id},
        )

    def _count_invalid(self, count: int) -> None:
        if self._telemetry is not None:
            self._telemetry.reports_dropped.labels("invalid").inc(count)
