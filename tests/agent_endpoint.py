"""The scheduler's real gRPC endpoint for agents, in the test process, on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
from prometheus_client import CollectorRegistry
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session, sessionmaker

from jigsaw.proto.v2 import agent_pb2_grpc
from scheduler.agents.dispatcher import AgentDispatcher, RendezvousPorts
from scheduler.agents.ingest import ReportWriter
from scheduler.agents.server import start_server
from scheduler.agents.service import AgentService
from scheduler.db import session_factory, transaction
from scheduler.models.users import (
    AGENT_SCOPE,
    USER_SCOPE,
    TokenVerifier,
    get_or_create_user,
    issue_token,
)
from scheduler.settings import GrpcSettings
from scheduler.telemetry import SchedulerTelemetry

CHECKPOINT_EVERY = 7
# How long a silent agent session holds its node name against another agent process.
SESSION_TIMEOUT_SECONDS = 3.0
RENDEZVOUS_PORTS = RendezvousPorts(29500, 29999)


@dataclass
class Endpoint:
    factory: sessionmaker[Session]
    dispatcher: AgentDispatcher
    writer: ReportWriter
    stub: agent_pb2_grpc.AgentServiceStub
    address: str
    agent_token: str
    user_token: str
    metrics: CollectorRegistry

    def dropped(self, reason: str) -> float:
        """What `jigsaw_reports_dropped_total{reason}` counted so far."""
        value = self.metrics.get_sample_value("jigsaw_reports_dropped_total", {"reason": reason})
        return value or 0.0

    def auth(self, token: str | None = None) -> list[tuple[str, str]]:
        return [("authorization", f"Bearer {token or self.agent_token}")]

    def count(self, model: type) -> int:
        with self.factory() as session:
            return int(session.scalar(select(func.count()).select_from(model)) or 0)


@contextmanager
def agent_endpoint(
    engine: Engine,
    checkpoint_root: Path,
    tokens: TokenVerifier | None = None,
    ports: RendezvousPorts = RENDEZVOUS_PORTS,
) -> Iterator[Endpoint]:
    """The endpoint, verifying tokens with `tokens` (default: no cache) and giving
    groups `ports`, as `jigsaw up` serves it."""
    factory = session_factory(engine)
    with transaction(factory) as session:
        agent_token = issue_token(session, scope=AGENT_SCOPE)
        user = get_or_create_user(session, "alice")
        user_token = issue_token(session, scope=USER_SCOPE, user=user)
    writer = ReportWriter(factory, max_delay_seconds=0.01)
    writer.start()
    dispatcher = AgentDispatcher(
        factory,
        checkpoint_root=checkpoint_root,
        checkpoint_every=CHECKPOINT_EVERY,
        ports=ports,
        session_timeout_seconds=SESSION_TIMEOUT_SECONDS,
    )
    metrics = CollectorRegistry()
    telemetry = SchedulerTelemetry(metrics)
    service = AgentService(
        factory, dispatcher, writer, heartbeat_interval_seconds=0.5, telemetry=telemetry
    )
    server, port = start_server(
        service, tokens or TokenVerifier(factory, 0), GrpcSettings(host="127.0.0.1", port=0)
    )
    address = f"127.0.0.1:{port}"
    channel = grpc.insecure_channel(address)
    try:
        yield Endpoint(
            factory,
            dispatcher,
            writer,
            agent_pb2_grpc.AgentServiceStub(channel),
            address,
            agent_token,
            user_token,
            metrics,
        )
    finally:
        channel.close()
        server.stop(grace=None).wait()
        writer.close()
