"""The scheduler's real gRPC endpoint for agents, in the test process, on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session, sessionmaker

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
from worker_agent.proto.jigsaw.v1 import agent_pb2_grpc

CHECKPOINT_EVERY = 7


@dataclass
class Endpoint:
    factory: sessionmaker[Session]
    dispatcher: AgentDispatcher
    writer: ReportWriter
    stub: agent_pb2_grpc.AgentServiceStub
    address: str
    agent_token: str
    user_token: str

    def auth(self, token: str | None = None) -> list[tuple[str, str]]:
        return [("authorization", f"Bearer {token or self.agent_token}")]

    def count(self, model: type) -> int:
        with self.factory() as session:
            return int(session.scalar(select(func.count()).select_from(model)) or 0)


@contextmanager
def agent_endpoint(
    engine: Engine, checkpoint_root: Path, tokens: TokenVerifier | None = None
) -> Iterator[Endpoint]:
    """The endpoint, verifying tokens with `tokens` (default: no cache), as `jigsaw up`
    serves it."""
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
        ports=RendezvousPorts(29500, 29999),
    )
    service = AgentService(factory, dispatcher, writer, heartbeat_interval_seconds=0.5)
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
        )
    finally:
        channel.close()
        server.stop(grace=None).wait()
        writer.close()
