"""The gRPC server agents dial: token authentication, optional (mutual) TLS.

It serves the protocol's version 2 (`jigsaw.v2.AgentService`); the calls of version 1
are answered FAILED_PRECONDITION with the agent version to upgrade to, so that an old
agent's log says why it cannot join instead of "method not found".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc

from jigsaw import __version__
from jigsaw.proto.v2 import agent_pb2_grpc
from scheduler.agents.service import AgentService
from scheduler.models.users import AGENT_SCOPE, TokenVerifier
from scheduler.settings import GrpcSettings

logger = logging.getLogger(__name__)

# Threads beyond one per connected agent: Register calls and reconnects in flight.
_SPARE_THREADS = 16
# Streams re-check their token no more often than this, even with no auth cache.
_MIN_RECHECK_SECONDS = 1.0


class TokenInterceptor(grpc.ServerInterceptor):
    """Refuses every call without a valid cluster (agent-scope) token, before any handler
    runs, so an unauthenticated call changes nothing.

    A stream outlives its first check: its token is checked again as messages arrive, at
    most once per `tokens.seconds` (at least a second apart), and at once after a
    revocation in this process; a stream whose token was revoked or expired is ended with
    UNAUTHENTICATED, which the agent takes as a refusal.
    """

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
        metadata = dict(handler_call_details.invocation_metadata or ())
        scheme, _, token = str(metadata.get("authorization", "")).partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return _refusal(
                handler, "missing cluster token: send metadata 'authorization: Bearer <token>'"
            )
        problem = self._problem(token)
        if problem is not None:
            return _refusal(handler, problem)
        if handler.request_streaming:
            return self._rechecked(handler, token)
        return handler

    def _problem(self, token: str) -> str | None:
        principal = self._tokens.verify(token)
        if principal is None:
            return "invalid or revoked cluster token (or it has expired)"
        if principal.scope != AGENT_SCOPE:
            return "a user token cannot act as an agent: use a cluster (agent) token"
        return None

    def _rechecked(self, handler: grpc.RpcMethodHandler, token: str) -> grpc.RpcMethodHandler:
        """The handler, its request stream ending (UNAUTHENTICATED) once the token fails."""
        interval = max(self._tokens.seconds, _MIN_RECHECK_SECONDS)

        def requests(messages: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
            checked_at, revision = time.monotonic(), self._tokens.revision
            for message in messages:
                if time.monotonic() - checked_at >= interval or self._tokens.revision != revision:
                    checked_at, revision = time.monotonic(), self._tokens.revision
                    problem = self._problem(token)
                    if problem is not None:
                        logger.warning("ending an agent stream: %s", problem)
                        context.set_code(grpc.StatusCode.UNAUTHENTICATED)
                        context.set_details(problem)
                        return
                yield message

        if handler.response_streaming:
            stream_stream = handler.stream_stream
            return grpc.stream_stream_rpc_method_handler(
                lambda messages, context: stream_stream(requests(messages, context), context),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        stream_unary = handler.stream_unary
        return grpc.stream_unary_rpc_method_handler(
            lambda messages, context: stream_unary(requests(messages, context), context),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


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


def _refuse_v1() -> grpc.GenericRpcHandler:
    """`jigsaw.v1.AgentService`, by method name alone (no code of version 1 is kept)."""
    problem = f"this scheduler speaks jigsaw.v2; upgrade the agent to {__version__}"

    def refuse(_request: Any, context: grpc.ServicerContext) -> Any:
        logger.warning("refused an agent of protocol jigsaw.v1 at %s", context.peer())
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, problem)

    return grpc.method_handlers_generic_handler(
        "jigsaw.v1.AgentService",
        {
            "Register": grpc.unary_unary_rpc_method_handler(refuse),
            "Connect": grpc.stream_stream_rpc_method_handler(refuse),
        },
    )


class EndpointUnavailable(OSError):
    """The agents' gRPC endpoint cannot bind its address."""


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
        # gRPC binds with SO_REUSEPORT by default: a second scheduler on a taken port
        # would start without error and the kernel would hand it half of the agents'
        # connections, which its database does not know.
        options=[("grpc.so_reuseport", 0)],
    )
    agent_pb2_grpc.add_AgentServiceServicer_to_server(service, server)
    server.add_generic_rpc_handlers((_refuse_v1(),))
    address = f"{settings.host}:{settings.port}"
    try:
        if settings.tls_cert is not None and settings.tls_key is not None:
            credentials = grpc.ssl_server_credentials(
                [(settings.tls_key.read_bytes(), settings.tls_cert.read_bytes())],
                root_certificates=settings.tls_ca.read_bytes() if settings.tls_ca else None,
                require_client_auth=settings.tls_ca is not None,
            )
            port = server.add_secure_port(address, credentials)
        else:
            port = server.add_insecure_port(address)
    except RuntimeError:  # grpcio's "Failed to bind" (older releases return 0)
        port = 0
    if port == 0:
        raise EndpointUnavailable(
            f"cannot bind the agents' gRPC endpoint to {address}: the address is taken "
            "or not this host's (JIGSAW_GRPC_HOST, JIGSAW_GRPC_PORT)"
        )
    server.start()
    logger.info(
        "agents' gRPC endpoint on %s:%d (%s)",
        settings.host,
        port,
        "TLS" if settings.tls_cert else "plaintext",
    )
    return server, port
