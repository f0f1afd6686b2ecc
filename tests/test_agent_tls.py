"""The agents' endpoint over mutual TLS, with certificates made by openssl for the test."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from sqlalchemy import Engine, select

from jigsaw.proto.v2 import agent_pb2 as pb
from jigsaw.proto.v2 import agent_pb2_grpc
from scheduler.agents.dispatcher import AgentDispatcher, RendezvousPorts
from scheduler.agents.ingest import ReportWriter
from scheduler.agents.server import start_server
from scheduler.agents.service import AgentService
from scheduler.db import session_factory, transaction
from scheduler.models.users import AGENT_SCOPE, TokenVerifier, issue_token
from scheduler.orm import Node
from scheduler.settings import GrpcSettings
from tests.servers import TEST_WORKER_USER
from worker_agent.agent import run_agent
from worker_agent.settings import AgentSettings

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _certificate(directory: Path, name: str, extensions: str) -> None:
    """`name`.key and `name`.pem, signed by the test CA in `directory`."""
    key = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", *key, "-keyout", f"{name}.key", "-out", f"{name}.csr",
             "-subj", f"/CN={name}", cwd=directory)  # fmt: skip
    (directory / f"{name}.ext").write_text(extensions)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-days", "1", "-out", f"{name}.pem",
             "-extfile", f"{name}.ext", cwd=directory)  # fmt: skip


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("tls")
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "1",
             "-subj", "/CN=jigsaw-test-ca", cwd=directory)  # fmt: skip
    _certificate(directory, "scheduler", "subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    _certificate(directory, "agent", "extendedKeyUsage=clientAuth\n")
    return directory


@pytest.fixture
def tls_endpoint(engine: Engine, certificates: Path, tmp_path: Path) -> Iterator[tuple[str, str]]:
    factory = session_factory(engine)
    with transaction(factory) as session:
        token = issue_token(session, scope=AGENT_SCOPE)
    writer = ReportWriter(factory)
    writer.start()
    dispatcher = AgentDispatcher(
        factory, checkpoint_root=tmp_path, checkpoint_every=0, ports=RendezvousPorts(29500, 29999)
    )
    settings = GrpcSettings(
        host="127.0.0.1",
        port=0,
        tls_cert=certificates / "scheduler.pem",
        tls_key=certificates / "scheduler.key",
        tls_ca=certificates / "ca.pem",
    )
    server, port = start_server(
        AgentService(factory, dispatcher, writer, 0.5), TokenVerifier(factory, 0), settings
    )
    try:
        yield f"127.0.0.1:{port}", token
    finally:
        server.stop(grace=None).wait()
        writer.close()


def _register(channel: grpc.Channel, token: str) -> pb.RegisterResponse:
    stub = agent_pb2_grpc.AgentServiceStub(channel)
    request = pb.RegisterRequest(
        node_name="tls-node",
        agent_version="test",
        address="127.0.0.1",
        instance="tls-node-agent-process",
    )
    response: pb.RegisterResponse = stub.Register(
        request, metadata=[("authorization", f"Bearer {token}")], timeout=10
    )
    return response


def test_only_agents_with_a_client_certificate_get_in(
    tls_endpoint: tuple[str, str], certificates: Path
) -> None:
    address, token = tls_endpoint
    ca = (certificates / "ca.pem").read_bytes()
    with grpc.insecure_channel(address) as plaintext, pytest.raises(grpc.RpcError):
        _register(plaintext, token)
    anonymous = grpc.ssl_channel_credentials(root_certificates=ca)
    with grpc.secure_channel(address, anonymous) as channel, pytest.raises(grpc.RpcError):
        _register(channel, token)
    mutual = grpc.ssl_channel_credentials(
        root_certificates=ca,
        private_key=(certificates / "agent.key").read_bytes(),
        certificate_chain=(certificates / "agent.pem").read_bytes(),
    )
    with grpc.secure_channel(address, mutual) as channel:
        assert _register(channel, token).agent_id > 0


def test_the_agent_dials_with_the_tls_settings(
    tls_endpoint: tuple[str, str], certificates: Path, engine: Engine, tmp_path: Path
) -> None:
    address, token = tls_endpoint
    settings = AgentSettings(
        scheduler=address,
        token=token,
        node_name="tls-agent",
        gpus=1,
        work_dir=tmp_path / "agent",
        worker_user=TEST_WORKER_USER,
        tls_ca=certificates / "ca.pem",
        tls_cert=certificates / "agent.pem",
        tls_key=certificates / "agent.key",
    )
    stop = threading.Event()
    agent = threading.Thread(target=run_agent, args=(settings, stop))
    agent.start()
    factory = session_factory(engine)
    try:
        deadline = time.monotonic() + 30
        while True:
            with factory() as session:
                if session.scalar(select(Node).where(Node.name == "tls-agent")) is not None:
                    break
            assert time.monotonic() < deadline, "the agent did not register over TLS"
            time.sleep(0.1)
    finally:
        stop.set()
        agent.join(timeout=60)
    assert not agent.is_alive()
