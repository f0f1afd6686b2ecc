"""The gRPC server agents dial: token authentication, optional (mutual) TLS."""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent import futures
from typing import Any

import grpc

from scheduler.agents.service import AgentService
from scheduler.models.users import AGENT_SCOPE, TokenVerifier
from scheduler.settings import GrpcSettings
from worker_agent.proto.jigsaw.v1 import agent_pb2_grpc

logger = logging.getLogger(__name__)

# Threads beyond one per connected agent: Register calls and reconnects in flight.
_SPARE_THREADS = 16


class TokenInterceptor(grpc.ServerInterceptor):
    """Refuses every call without a valid cluster (agent-scope) token, before any handler
    runs, so an unauthenticated call changes nothing."""

    def __init__(self, tokens: TokenVerifier) -> None:
        self._tokens = tokens

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        problem = self._problem(dict(handler_call_details.invocation_metadata or ()))
        if problem is None:
            return handler
        return _refusal(handler, problem)

    def _problem(self, metadata: dict[str, Any]) -> str | None:
        scheme, _, token = str(metadata.get("authorization", "")).partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return "missing cluster token: send metadata 'authorization: Bearer <token>'"
        principal = self._tokens.verify(token.strip())
        if principal is None:
            return "invalid or revoked cluster token"
        if principal.scope != AGENT_SCOPE:
            return "a user token cannot act as an agent: use a cluster (agent) token"
        return None


def _refusal(handler: grpc.RpcMethodHandler, problem: str) -> grpc.RpcMethodHandler:
    def abort(_request: Any, context: grpc.ServicerContext) -> Any:
        context.abort(grpc.StatusCode.UNAUTHENTICATED, problem)

    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(abort)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(abort)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(abort)
    return grpc.unary_unary_rpc_method_handler(abort)


def start_server(
    service: AgentService, tokens: TokenVerifier, settings: GrpcSettings
) -> tuple[grpc.Server, int]:
    """Serve `service` on settings.host:port (port 0 picks one); returns the bound port."""
    server = grpc.server(
        futures.ThreadPoolExecutor(
            max_workers=settings.max_connections + _SPARE_THREADS,
            thread_name_prefix="jigsaw-grpc",
        ),
        interceptors=[TokenInterceptor(tokens)],
        maximum_concurrent_rpcs=settings.max_connections,
    )
    agent_pb2_grpc.add_AgentServiceServicer_to_server(service, server)
    address = f"{settings.host}:{settings.port}"
    if settings.tls_cert is not None and settings.tls_key is not None:
        credentials = grpc.ssl_server_credentials(
            [(settings.tls_key.read_bytes(), settings.tls_cert.read_bytes())],
            root_certificates=settings.tls_ca.read_bytes() if settings.tls_ca else None,
            require_client_auth=settings.tls_ca is not None,
        )
        port = server.add_secure_port(address, credentials)
    else:
        port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"cannot bind the agents' gRPC endpoint to {address}")
    server.start()
    logger.info(
        "agents' gRPC endpoint on %s:%d (%s)",
        settings.host,
        port,
        "TLS" if settings.tls_cert else "plaintext",
    )
    return server, port
