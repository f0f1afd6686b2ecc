"""The node agent's gRPC client: register with the scheduler, then hold a Connect stream.

The agent dials the scheduler (`jigsaw.v2.AgentService`). On the stream it sends a Hello
with what still runs here (each run with its attempt), heartbeats, batched iteration
reports, evaluations, log lines and job exits, and it hands the scheduler's commands to
the `Supervisor` (`wire` converts both ways); a launch whose spec names code gets it
unpacked first (`code.CodeCache`, fetched with `FetchCode`). When the scheduler is unreachable or
restarting, jobs keep running and the agent redials with randomized exponential backoff;
a refused token is fatal. Every call carries the process's instance key, drawn once at
start: while another agent process holds this node's name the scheduler answers
ALREADY_EXISTS, and the agent keeps retrying until that one is gone.
"""

from __future__ import annotations

import logging
import queue
import random
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import grpc

from jigsaw import __version__
from jigsaw.gpus import GpuSlot
from jigsaw.proto.v2 import agent_pb2, agent_pb2_grpc
from worker_agent import mps, wire
from worker_agent.code import CODE_DIR_NAME, LIMITS, CacheBounds, CodeCache, CodeError
from worker_agent.diagnosis import log_diagnosis
from worker_agent.gpus import discover, probe_cuda
from worker_agent.isolation import make_non_dumpable, token_file_warning
from worker_agent.jobs import Iterations
from worker_agent.mps import MpsDaemon
from worker_agent.outbox import Outbox
from worker_agent.settings import AgentSettings
from worker_agent.spool import SPOOL_FILE, ReportSpool
from worker_agent.supervisor import Supervisor

logger = logging.getLogger(__name__)

# From the package itself: the agent also runs from a checkout that was never pip-installed.
AGENT_VERSION = __version__
# A wrong token or a request the scheduler can never accept: redialing will not help.
_FATAL_CODES = frozenset(
    {
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.INVALID_ARGUMENT,
    }
)
_DEFAULT_HEARTBEAT_SECONDS = 5.0  # if the scheduler does not say
_REGISTER_TIMEOUT_SECONDS = 30.0
_BACKOFF_BASE_SECONDS = 0.5
# HTTP/2 pings find a dead connection that heartbeats alone (small writes into a TCP
# buffer) would not notice for many minutes. Five minutes is the most frequent ping a
# gRPC server accepts by default without answering GOAWAY "too_many_pings".
_CHANNEL_OPTIONS = [("grpc.keepalive_time_ms", 300_000), ("grpc.keepalive_timeout_ms", 20_000)]
# A job's code arrives while its launch waits: long enough for the largest archive.
_FETCH_CODE_TIMEOUT_SECONDS = 300.0
_CODE_CACHE = "code-cache"


class AgentRejected(RuntimeError):
    """The scheduler refused this agent (wrong token or invalid registration)."""


def run_agent(settings: AgentSettings, stop: threading.Event) -> None:
    """Serve the scheduler until `stop` is set; then stop every job here and return.

    Raises AgentRejected when the scheduler refuses the agent's token or registration,
    IsolationError when training processes cannot run as configured.
    """
    # The token lives in this process: no worker of the same user may read its memory.
    make_non_dumpable()
    # `--gpus N` serves virtual slots: no child spends seconds importing torch to probe CUDA.
    probe = probe_cuda() if settings.gpus == "auto" else None
    slots = [replace(s, max_jobs=settings.max_jobs_per_gpu) for s in discover(settings.gpus, probe)]
    log_diagnosis(settings, slots, probe)
    logger.info(
        "node %s offers %d GPU slot(s): %s",
        settings.node_name,
        len(slots),
        ", ".join(f"{slot.index}={slot.kind}" for slot in slots),
    )
    daemon = MpsDaemon(settings.work_dir) if mps.wanted(settings.mps, slots) else None
    if daemon is not None and daemon.start():
        slots = mps.shared(slots)
    else:
        daemon = None
    try:
        supervisor = Supervisor(
            slots,
            settings.work_dir,
            torch_threads=settings.torch_threads,
            stop_grace_seconds=settings.stop_grace_seconds,
            warm_workers=settings.warm_workers,
            worker_user=settings.worker_user,
            worker_env=settings.worker_env,
            max_jobs_per_gpu=settings.max_jobs_per_gpu,
            mps_pipe_directory=daemon.pipe_directory if daemon is not None else None,
        )
    except BaseException:
        if daemon is not None:
            daemon.stop()
        raise
    warning = token_file_warning(settings.token_file, supervisor.worker_identity)
    if warning:
        logger.warning("%s", warning)
    # A job's first iteration goes out at once: users see it start without the batching delay.
    # Records queued when the agent is killed are sent after its restart (the spool).
    spool = ReportSpool(settings.work_dir / SPOOL_FILE)
    outbox = Outbox(first_records_at_once=True, spool=spool)
    # Drains the supervisor continuously, also while disconnected, so that the outbox's
    # bounds (not an unbounded queue) decide what an outage costs.
    pump = threading.Thread(
        target=_pump, args=(supervisor, outbox, stop), name="jigsaw-outbox", daemon=True
    )
    pump.start()
    channel = _channel(settings)
    identity = _Identity(settings.node_name, secrets.token_urlsafe(32))
    stub = agent_pb2_grpc.AgentServiceStub(channel)
    code_cache = CodeCache(
        settings.work_dir / _CODE_CACHE,
        _code_fetcher(settings, identity, stub),
        supervisor.worker_identity,
        CacheBounds(settings.code_cache_max_bytes, settings.code_cache_max_idle_seconds),
    )
    code_cache.prune()
    try:
        _serve(settings, identity, slots, supervisor, code_cache, outbox, stub, stop)
    finally:
        channel.close()
        supervisor.close()
        if daemon is not None:
            daemon.stop()  # after the workers, its clients, are gone
        stop.set()  # ends the pump also when the agent was refused
        pump.join(timeout=5)
        spool.close()
        logger.info("agent stopped")


@dataclass(frozen=True)
class _Identity:
    """Who this agent process is to the scheduler: its node and its instance key."""

    node_name: str
    instance: str  # secret: it proves a reconnect comes from this very process


def _serve(
    settings: AgentSettings,
    identity: _Identity,
    slots: list[GpuSlot],
    supervisor: Supervisor,
    code_cache: CodeCache,
    outbox: Outbox,
    stub: agent_pb2_grpc.AgentServiceStub,
    stop: threading.Event,
) -> None:
    redials = 0
    while not stop.is_set():
        started = time.monotonic()
        try:
            _session(settings, identity, slots, supervisor, code_cache, outbox, stub, stop)
            if not stop.is_set():
                logger.warning("the scheduler ended the stream; reconnecting")
        except grpc.RpcError as exc:
            if stop.is_set():
                break
            code, details = exc.code(), exc.details()
            if code in _FATAL_CODES:
                logger.error(
                    "the scheduler at %s refused this agent (%s: %s): check "
                    "JIGSAW_AGENT_TOKEN / JIGSAW_AGENT_TOKEN_FILE (a cluster token of agent "
                    "scope) and the node's settings",
                    settings.scheduler,
                    code.name,
                    details,
                )
                raise AgentRejected(f"{code.name}: {details}") from exc
            if code is grpc.StatusCode.ALREADY_EXISTS:
                logger.warning("another agent process serves this node: %s", details)
            elif code is grpc.StatusCode.UNIMPLEMENTED:
                logger.error(
                    "the scheduler at %s does not speak jigsaw.v2, the protocol of this agent "
                    "(version %s): it is older; upgrade it (%s)",
                    settings.scheduler,
                    AGENT_VERSION,
                    details,
                )
            else:
                logger.warning(
                    "scheduler at %s unreachable or the stream broke (%s: %s); jobs keep running",
                    settings.scheduler,
                    code.name,
                    details,
                )
        except (OSError, ValueError) as exc:  # e.g. the token file is being rotated
            logger.error("cannot dial the scheduler: %s", exc)
        if time.monotonic() - started > settings.reconnect_max_seconds:
            redials = 0  # the last session was healthy for a while: start over quickly
        stop.wait(_backoff(redials, settings.reconnect_max_seconds))
        redials += 1


def _backoff(attempt: int, cap: float) -> float:
    """Exponential backoff with full jitter, so restarted agents do not redial in step."""
    return random.uniform(0, min(cap, _BACKOFF_BASE_SECONDS * 2**attempt))


def _session(
    settings: AgentSettings,
    identity: _Identity,
    slots: list[GpuSlot],
    supervisor: Supervisor,
    code_cache: CodeCache,
    outbox: Outbox,
    stub: agent_pb2_grpc.AgentServiceStub,
    stop: threading.Event,
) -> None:
    """Register, then serve one Connect stream until it ends."""
    metadata = (("authorization", f"Bearer {settings.bearer_token()}"),)
    registered = stub.Register(
        agent_pb2.RegisterRequest(
            node_name=identity.node_name,
            gpus=[wire.gpu(slot) for slot in slots],
            agent_version=AGENT_VERSION,
            address=settings.address,
            instance=identity.instance,
        ),
        metadata=metadata,
        timeout=_REGISTER_TIMEOUT_SECONDS,
    )
    heartbeat = registered.heartbeat_interval_seconds or _DEFAULT_HEARTBEAT_SECONDS
    logger.info(
        "registered with %s as agent %d of node %d; heartbeat every %.1f s",
        settings.scheduler,
        registered.agent_id,
        registered.node_id,
        heartbeat,
    )
    ended = threading.Event()
    call = stub.Connect(
        _requests(identity, supervisor, outbox, heartbeat, ended), metadata=metadata
    )
    canceller = threading.Thread(
        target=_cancel_on_stop, args=(call, stop, ended), name="jigsaw-cancel", daemon=True
    )
    canceller.start()
    try:
        for message in call:
            _dispatch(message, supervisor, code_cache)
    finally:
        ended.set()
        outbox.wake()  # the request generator stops taking messages for a dead stream
        canceller.join()


def _requests(
    identity: _Identity,
    supervisor: Supervisor,
    outbox: Outbox,
    heartbeat: float,
    ended: threading.Event,
) -> Iterator[agent_pb2.AgentMessage]:
    hello = agent_pb2.Hello(
        node_name=identity.node_name,
        running=wire.running_jobs(supervisor.runs()),
        exits=outbox.take_exits(),
        instance=identity.instance,
    )
    yield agent_pb2.AgentMessage(hello=hello)
    next_heartbeat = time.monotonic() + heartbeat
    while not ended.is_set():
        message = outbox.next_message(max(next_heartbeat - time.monotonic(), 0.0), ended)
        if message is not None:
            yield message
        if time.monotonic() >= next_heartbeat:
            yield agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat())
            next_heartbeat = time.monotonic() + heartbeat


def _cancel_on_stop(call: grpc.Future, stop: threading.Event, ended: threading.Event) -> None:
    while not ended.is_set():
        if stop.wait(0.2):
            call.cancel()
            return


def _dispatch(
    message: agent_pb2.SchedulerMessage, supervisor: Supervisor, code_cache: CodeCache
) -> None:
    kind = message.WhichOneof("command")
    if kind == "launch":
        _launch(message.launch, supervisor, code_cache)
    elif kind == "resume":
        _launch(message.resume, supervisor, code_cache)
    elif kind == "stop":
        supervisor.stop(message.stop.job_id, message.stop.reason)
    elif kind == "suspend":
        supervisor.suspend(message.suspend.job_id)
    elif kind == "reconfigure":
        command = message.reconfigure
        try:
            config = wire.reconfiguration(command)
        except wire.InvalidCommand as exc:
            logger.error(
                "job %d: reconfiguration ignored: %s",
                command.job_id,
                exc,
                extra={"job_id": command.job_id},
            )
            return
        supervisor.reconfigure(command.job_id, command.config_version, config)
    elif kind == "cap":
        supervisor.cap(message.cap.job_id, message.cap.memory_bytes)
    elif kind == "shrink":
        command = message.shrink.launch
        # The ranks that go on imported the job's code when they started.
        code_dir = supervisor.job_dir(command.job_id) / CODE_DIR_NAME if command.spec.code else None
        supervisor.resize_in_place(wire.job_launch(command, supervisor.node, code_dir))
    else:
        logger.warning("unknown command from the scheduler (newer protocol?): %s", kind)


def _launch(
    command: agent_pb2.LaunchCommand, supervisor: Supervisor, code_cache: CodeCache
) -> None:
    """Start the launch, with the job's code unpacked first when its spec names some.

    The code is fetched on the stream's reader, before later commands (a stop of this
    very job among them) are read; a job that runs here already (a repeated command)
    keeps the code it has. Code that cannot be made ready fails the launch with why.
    """
    digest = command.spec.code
    code_dir, problem = None, None
    if digest and command.job_id not in supervisor.runs():
        try:
            code_dir = code_cache.unpacked(
                command.job_id, digest, supervisor.job_dir(command.job_id)
            )
        except CodeError as exc:
            problem = f"the job's code: {exc}"
    launch = wire.job_launch(command, supervisor.node, code_dir)
    if problem is not None:
        launch = replace(launch, configs=(), problem=problem)
    supervisor.launch(launch)


def _code_fetcher(
    settings: AgentSettings, identity: _Identity, stub: agent_pb2_grpc.AgentServiceStub
) -> Callable[[int, str], bytes]:
    """Fetches a job's code archive over the agent's own channel and token."""

    def fetch(job_id: int, digest: str) -> bytes:
        request = agent_pb2.CodeRequest(
            node_name=identity.node_name, instance=identity.instance, job_id=job_id, digest=digest
        )
        metadata = (("authorization", f"Bearer {settings.bearer_token()}"),)
        chunks, size = [], 0
        try:
            for chunk in stub.FetchCode(
                request, metadata=metadata, timeout=_FETCH_CODE_TIMEOUT_SECONDS
            ):
                size += len(chunk.data)
                if size > LIMITS.max_bytes:
                    raise CodeError(f"code {digest} is larger than {LIMITS.max_bytes} bytes")
                chunks.append(chunk.data)
        except grpc.RpcError as exc:
            raise CodeError(
                f"the scheduler did not send code {digest}: {exc.code().name}: {exc.details()}"
            ) from None
        return b"".join(chunks)

    return fetch


def _pump(supervisor: Supervisor, outbox: Outbox, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            event = supervisor.outbound.get(timeout=0.5)
        except queue.Empty:
            continue
        try:
            message = wire.outbound(event)
        except (TypeError, ValueError) as exc:
            # Trial code wrote what rank 0 reported: a forged report is its job's loss only.
            logger.warning(
                "job %d: dropped a report that is not one: %s",
                event.job_id,
                exc,
                extra={"job_id": event.job_id},
            )
            continue
        outbox.put(message, urgent=isinstance(event, Iterations) and event.urgent)


def _channel(settings: AgentSettings) -> grpc.Channel:
    # gRPC's own reconnection backoff (up to 120 s) kept the channel failing every call
    # long after a restarted scheduler was back, and the scheduler, which times agents
    # from its first round, declared the agent lost and requeued its jobs: the channel
    # redials within the agent's own cap instead.
    backoff_ms = max(1, int(settings.reconnect_max_seconds * 1000))
    options = [
        *_CHANNEL_OPTIONS,
        ("grpc.initial_reconnect_backoff_ms", min(1000, backoff_ms)),
        ("grpc.max_reconnect_backoff_ms", backoff_ms),
    ]
    if settings.tls_ca is None:
        return grpc.insecure_channel(settings.scheduler, options=options)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=settings.tls_ca.read_bytes(),
        private_key=settings.tls_key.read_bytes() if settings.tls_key else None,
        certificate_chain=settings.tls_cert.read_bytes() if settings.tls_cert else None,
    )
    return grpc.secure_channel(settings.scheduler, credentials, options=options)
