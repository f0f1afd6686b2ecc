"""`AgentService`: the gRPC endpoint worker agents dial (see agent.proto).

Every message is validated before it touches state: a malformed Register or Connect is
rejected with INVALID_ARGUMENT (or FAILED_PRECONDITION for a node that never
registered) and a clear message, and writes nothing. Reports about jobs the agent was
not given are dropped and counted, never written.

Much of what an agent forwards was written by trial code, which is not trusted: every
message is scrubbed where it enters (`agents.scrub`: no NUL, no non-finite metric), and
an invalid iteration record or profile is dropped and counted without ending the stream,
which carries the agent's other jobs and its heartbeats.
"""

from __future__ import annotations

import json
import logging
import math
import re
import threading
from collections.abc import Iterator
from typing import Any

import grpc
from prometheus_client import Counter
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from scheduler.agents.dispatcher import AgentDispatcher, AgentSession
from scheduler.agents.ingest import ReportWriter
from scheduler.agents.scrub import scrub
from scheduler.db import transaction
from scheduler.jobspec import checked_workload
from scheduler.models.agents import GpuSlot, ran_on, register
from scheduler.models.profiles import save_profile
from scheduler.orm import Agent, Node
from scheduler.spb import SPBProfile
from worker_agent.proto.jigsaw.v1 import agent_pb2 as pb
from worker_agent.proto.jigsaw.v1 import agent_pb2_grpc

logger = logging.getLogger(__name__)

# Kubernetes node names are DNS subdomains; the same rule keeps names safe everywhere.
_NODE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$", re.IGNORECASE)
_MAX_GPUS = 1024
_MAX_TEXT = 64 * 1024

DROPPED = Counter(
    "jigsaw_agent_messages_dropped_total",
    "Agent messages dropped: about jobs the agent was not given, or malformed.",
    ["kind"],
)
SCRUBBED = Counter(
    "jigsaw_agent_messages_scrubbed_total",
    "Agent messages that carried NUL in text or non-finite metrics (see agents.scrub).",
)


class InvalidMessage(ValueError):
    """An agent message that breaks the protocol; its text is what the agent is told."""


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
    return [GpuSlot(gpu.index, gpu.kind, gpu.memory_bytes, gpu.virtual) for gpu in request.gpus]


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
        if (
            record.iteration < 1
            or not all(math.isfinite(v) and v >= 0 for v in values)
            or (depth is not None and not 0 < depth <= 1)
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
            }
        )
    return rows, len(records) - len(rows)


def _finite_or_none(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def model_profile(report: pb.ModelProfileReport) -> tuple[SPBProfile, str]:
    """The profile a report carries, and the device kind it was measured on."""
    try:
        checked_workload(report.workload)
        profile = SPBProfile.from_json(json.loads(report.profile_json))
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
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InvalidMessage(f"profile of job {report.job_id}: {exc}") from None
    if not valid:
        raise InvalidMessage(f"profile of job {report.job_id} has invalid values")
    return profile, report.device_kind


class AgentService(agent_pb2_grpc.AgentServiceServicer):
    def __init__(
        self,
        factory: sessionmaker[Session],
        dispatcher: AgentDispatcher,
        writer: ReportWriter,
        heartbeat_interval_seconds: float,
    ) -> None:
        self._factory = factory
        self._dispatcher = dispatcher
        self._writer = writer
        self._heartbeat_interval = heartbeat_interval_seconds

    def Register(  # noqa: N802 (the generated servicer's name)
        self, request: pb.RegisterRequest, context: grpc.ServicerContext
    ) -> pb.RegisterResponse:
        try:
            slots = gpu_slots(request)
        except InvalidMessage as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        with transaction(self._factory) as session:
            registration = register(
                session,
                node_name=request.node_name,
                address=request.address or context.peer(),
                gpus=slots,
                version=request.agent_version,
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
        if scrub(first):
            SCRUBBED.inc()
        hello = first.hello
        with transaction(self._factory) as session:
            row = session.execute(
                select(Node.id, Agent.id)
                .join(Agent, Agent.node_id == Node.id)
                .where(Node.name == hello.node_name)
            ).first()
        if row is None:
            context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"node {hello.node_name!r} is not registered: call Register first",
            )
            return
        node_id, agent_id = row
        running = {job.job_id: {a.rank: a.gpu_index for a in job.ranks} for job in hello.running}
        session_ = self._dispatcher.open_session(
            hello.node_name, node_id, agent_id, running, hello.exits
        )
        self._writer.heartbeat(agent_id)
        logger.info(
            "agent %s connected, running jobs %s",
            hello.node_name,
            sorted(running),
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
        self._writer.heartbeat(session.agent_id)
        if kind == "heartbeat":
            return
        if scrub(message):
            SCRUBBED.inc()
        if kind == "reports":
            for job in message.reports.jobs:
                if self._dispatcher.runs_on(session.node_name, job.job_id) or (
                    job.replayed and self._ran_on(session, job.job_id)
                ):
                    rows, invalid = metric_rows(job.records)
                    self._writer.metrics(job.job_id, rows, replayed=job.replayed)
                    if invalid:
                        DROPPED.labels("invalid_record").inc(invalid)
                else:
                    DROPPED.labels("reports").inc()
        elif kind == "exit":
            if self._dispatcher.runs_on(session.node_name, message.exit.job_id):
                self._dispatcher.job_exited(session.node_name, message.exit)
            else:
                DROPPED.labels("exit").inc()
        elif kind == "log":
            log = message.log
            if self._dispatcher.runs_on(session.node_name, log.job_id):
                self._writer.log(log.job_id, log.rank, log.level[:16], log.message[:_MAX_TEXT])
            else:
                DROPPED.labels("log").inc()
        elif kind == "evaluation":
            evaluation = message.evaluation
            if self._dispatcher.runs_on(session.node_name, evaluation.job_id):
                self._writer.evaluation(evaluation.job_id, dict(evaluation.metrics))
            else:
                DROPPED.labels("evaluation").inc()
        elif kind == "profile":
            if self._dispatcher.runs_on(session.node_name, message.profile.job_id):
                self._save_profile(session, message.profile)
            else:
                DROPPED.labels("profile").inc()
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
            profile, device_kind = model_profile(report)
            with transaction(self._factory) as db:
                save_profile(db, profile, device_kind)
        except Exception as exc:
            DROPPED.labels("invalid_profile").inc()
            logger.warning(
                "agent %s: %s; dropped",
                session.node_name,
                exc,
                extra={"node": session.node_name, "job_id": report.job_id},
            )
