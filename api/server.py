"""`jigsaw up`: the API, the scheduler loop and the agents' gRPC endpoint in one process.

Start-up, in order:
  1. migrate the database (safe when several processes start at once);
  2. on first start, create the `admin` user and an admin token and store them in
     `$JIGSAW_HOME/credentials.json` (0600) for the CLI; later starts reuse that token
     while it still authenticates;
  3. campaign for the scheduler leader lock in a background thread
     (`scheduler.leader.campaign`): while another replica leads this database, serve
     the API only and retry every `leader_retry_seconds`;
  4. as leader, either serve the gRPC endpoint worker agents dial (with a cluster token
     in `$JIGSAW_HOME/agent-token`, optionally starting local agents with virtual GPUs),
     or, with `--simulated-nodes`, register simulated nodes that this process
     heartbeats; optionally sync the Kubernetes node inventory; then run the round loop
     until shutdown or until the lock is lost, when all of that is torn down again;
  5. serve HTTP (API, dashboard, /metrics) with uvicorn in the foreground until
     SIGINT/SIGTERM, then unwind in reverse: stop the loop, the local agents, the gRPC
     endpoint and the report writer, hand back simulated nodes' jobs and release the
     lock.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import socket
import threading
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import filelock
import uvicorn
from sqlalchemy.orm import Session, sessionmaker

from api.credentials import (
    Credentials,
    agent_token_path,
    load_agent_token,
    load_credentials,
    local_url,
    private_home,
    save_credentials,
    write_private,
)
from api.logs import configure_logging
from jigsaw.gpus import GpuSlot
from scheduler.core.states import IllegalTransition, JobState
from scheduler.db import engine_from_settings, session_factory, transaction
from scheduler.dispatch import Dispatcher
from scheduler.migrate import upgrade
from scheduler.models import allocations
from scheduler.models.agents import register, set_alive
from scheduler.models.states import transition
from scheduler.models.users import (
    AGENT_SCOPE,
    USER_SCOPE,
    TokenVerifier,
    authenticate,
    get_or_create_user,
    issue_token,
)
from scheduler.orm import utcnow
from scheduler.settings import Settings

if TYPE_CHECKING:
    from scheduler.telemetry import SchedulerTelemetry

logger = logging.getLogger("jigsaw.server")

ADMIN_USER = "admin"
ACTOR = "jigsaw-up"
VIRTUAL_NODE_PREFIX = "virtual-"
VIRTUAL_GPU_KIND = "virtual-cpu"
VIRTUAL_GPU_MEMORY = 16 * 1024**3
VIRTUAL_AGENT_VERSION = "simulated"
DEFAULT_SIM_ITERATIONS_PER_SECOND = 50.0
_THREAD_JOIN_SECONDS = 15.0


# Where `free_port` draws from: below the kernel's ephemeral ports (32768 up on Linux)
# and torch.distributed's rendezvous ports (29500 up).
_FREE_PORTS = range(20_000, 29_000)
_random = random.SystemRandom()  # not the `random` state a program or test seeds


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing is bound to now, for a server started next (the demo's, tests').

    Not one the kernel picks (a bind to port 0): between its release and the server's
    bind the kernel may hand that port to any client connection on the host (a
    database's, an HTTP client's), and the server then cannot bind it."""
    address = host if host not in {"", "::"} else "127.0.0.1"
    for _ in range(100):
        with socket.socket() as sock:
            try:
                sock.bind((address, _random.choice(_FREE_PORTS)))
            except OSError:
                continue
            return int(sock.getsockname()[1])
    raise OSError(f"no free port on {address} in {_FREE_PORTS}")


class AddressTaken(OSError):
    """The API's address cannot be bound; nothing was written for it."""


def bind_api(host: str, port: int) -> socket.socket:
    """The API's listening socket (port 0 picks one), bound before anything that names
    its URL (credentials.json) is written, so a taken port changes nothing."""
    listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host.strip("[]"), port))
    except OSError as exc:
        listener.close()
        raise AddressTaken(f"cannot serve the API on {host}:{port}: {exc.strerror}") from exc
    return listener


# -- credentials ----------------------------------------------------------------------


def bootstrap_credentials(factory: sessionmaker[Session], home: Path, url: str) -> Credentials:
    """The admin credentials the CLI uses, created on first start and reused afterwards.

    A stored token that still authenticates as a user is kept (only the URL is brought
    up to date); otherwise a new admin token is issued and the file rewritten. A file
    lock keeps two servers starting on one home from both issuing a token.
    """
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    with filelock.FileLock(str(home / ".credentials.lock")):
        stored = load_credentials(home)
        if stored is not None:
            with transaction(factory) as session:
                principal = authenticate(session, stored.token)
            if principal is not None and principal.scope == USER_SCOPE:
                if stored.url != url:
                    stored = Credentials(url=url, token=stored.token, user=stored.user)
                    save_credentials(home, stored)
                logger.info("using the stored token of user %r", stored.user)
                return stored
            logger.warning("the stored token no longer authenticates; issuing a new one")
        with transaction(factory) as session:
            admin = get_or_create_user(session, ADMIN_USER, is_admin=True)
            token = issue_token(
                session, scope=USER_SCOPE, user=admin, description="jigsaw up bootstrap"
            )
        credentials = Credentials(url=url, token=token, user=ADMIN_USER)
        path = save_credentials(home, credentials)
        logger.info("created user %r; its token is in %s", ADMIN_USER, path)
        return credentials


def bootstrap_agent_token(factory: sessionmaker[Session], home: Path) -> Path:
    """The cluster token local agents present, kept in `$JIGSAW_HOME/agent-token` (0600).

    Reused while it still authenticates as an agent; otherwise a new one is issued.
    """
    with filelock.FileLock(str(home / ".credentials.lock")):
        stored = load_agent_token(home)
        if stored is not None:
            with transaction(factory) as session:
                principal = authenticate(session, stored)
            if principal is not None and principal.scope == AGENT_SCOPE:
                return agent_token_path(home)
        with transaction(factory) as session:
            token = issue_token(session, scope=AGENT_SCOPE, description="jigsaw up local agents")
        return write_private(agent_token_path(home), token + "\n")


# -- simulated nodes ------------------------------------------------------------------


def register_virtual_nodes(
    factory: sessionmaker[Session], count: int, gpus_per_node: int
) -> list[int]:
    """Create (or refresh) nodes `virtual-0..count-1` with alive agents; their agent ids."""
    slots = [
        GpuSlot(index, VIRTUAL_GPU_KIND, VIRTUAL_GPU_MEMORY, virtual=True)
        for index in range(gpus_per_node)
    ]
    with transaction(factory) as session:
        return [
            register(
                session,
                node_name=f"{VIRTUAL_NODE_PREFIX}{i}",
                address="simulated",
                gpus=slots,
                version=VIRTUAL_AGENT_VERSION,
            ).agent_id
            for i in range(count)
        ]


def requeue_virtual_jobs(factory: sessionmaker[Session], reason: str) -> list[int]:
    """Free the virtual GPUs and send their SCHEDULED/RUNNING jobs back to the queue.

    The simulated dispatcher lives in this process's memory, so its runs end with it:
    at shutdown, and at start-up after a crash, the jobs it held are orphans.
    """
    now = utcnow()
    with transaction(factory) as session:
        jobs = allocations.virtual_holders(session)
        allocations.release(session, [job.id for job in jobs], now)
        requeued = []
        for job in jobs:
            if job.state not in (JobState.SCHEDULED, JobState.RUNNING):
                continue
            try:
                transition(session, job, JobState.QUEUED, actor=ACTOR, message=reason)
            except IllegalTransition:
                continue
            requeued.append(job.id)
    if requeued:
        logger.info("requeued jobs %s: %s", sorted(requeued), reason)
    return requeued


def heartbeat_forever(
    factory: sessionmaker[Session],
    agent_ids: Sequence[int],
    interval: float,
    stop: threading.Event,
) -> None:
    """Keep the simulated agents alive, as real agents do with their heartbeats."""
    while not stop.wait(interval):
        try:
            with transaction(factory) as session:
                set_alive(session, agent_ids, alive=True)
        except Exception:
            logger.exception("simulated heartbeat failed; retrying")


def mark_agents_dead(factory: sessionmaker[Session], agent_ids: Sequence[int]) -> None:
    with transaction(factory) as session:
        set_alive(session, agent_ids, alive=False)


# -- the process ----------------------------------------------------------------------


def serve(
    settings: Settings,
    *,
    host: str,
    port: int,
    scheduler: bool = True,
    simulated_nodes: int = 0,
    gpus_per_node: int = 4,
    sim_iterations_per_second: float = DEFAULT_SIM_ITERATIONS_PER_SECOND,
    local_agents: int = 0,
    gpus_per_agent: int = 2,
    log_level: str = "info",
    access_log: bool = False,
) -> None:
    """Run `jigsaw up` in the foreground until SIGINT/SIGTERM (see the module docstring)."""
    # Imported here so the CLI's other commands do not pay for FastAPI and the loop.
    from api.app import create_app
    from scheduler.leader import LeaderLock, campaign
    from scheduler.loop import SchedulerService

    configure_logging(log_level, settings.log.format)
    private_home(settings.home)
    if local_agents and scheduler and not simulated_nodes:
        _let_local_workers_in(settings)
    listener = bind_api(host, port)
    port = int(listener.getsockname()[1])
    stop = threading.Event()
    server: uvicorn.Server | None = None

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        # uvicorn installs its own handlers while serving and calls this one again once
        # it has shut down; before that, a signal during start-up lands here.
        logger.info("received %s; shutting down", signal.Signals(signum).name)
        stop.set()
        if server is not None:
            server.should_exit = True

    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    engine = engine_from_settings(settings)
    factory = session_factory(engine)
    lock = LeaderLock(engine, settings.home) if scheduler else None
    try:
        with ExitStack() as stack:
            stack.callback(listener.close)
            # Runs last: the loop and every helper thread see `stop` before anything
            # they use is torn down.
            stack.callback(stop.set)
            logger.info("database %s", engine.url.render_as_string(hide_password=True))
            upgrade(engine)
            url = local_url(host, port)
            bootstrap_credentials(factory, settings.home, url)
            app = create_app(settings)
            telemetry: SchedulerTelemetry = app.state.telemetry

            if lock is not None:
                leader_name = f"{socket.gethostname()}:{os.getpid()}"

                def lead(stopping: threading.Event, leading: Callable[[], bool]) -> None:
                    """Run the scheduler while this process holds the leader lock."""
                    logger.info("scheduler leader %s, policy %s", leader_name,
                                settings.scheduler.policy)  # fmt: skip
                    role_stop = threading.Event()
                    with ExitStack() as role:
                        telemetry.leader.set(1)
                        role.callback(telemetry.leader.set, 0)
                        role.callback(role_stop.set)
                        dispatcher: Dispatcher
                        if simulated_nodes:
                            dispatcher = _simulated_nodes(
                                role, factory, settings, role_stop, simulated_nodes,
                                gpus_per_node, sim_iterations_per_second,
                            )  # fmt: skip
                        else:
                            from scheduler.agents.server import EndpointUnavailable

                            try:
                                dispatcher = _agents_endpoint(
                                    role, factory, settings, role_stop, local_agents,
                                    gpus_per_agent, telemetry, app.state.tokens,
                                )  # fmt: skip
                            except EndpointUnavailable as exc:
                                # Another replica may lead where the port is free.
                                logger.error("%s; not leading", exc)
                                return
                        if settings.kubernetes.enabled:
                            _node_inventory(role, factory, settings, role_stop)
                        service = SchedulerService(
                            factory,
                            dispatcher,
                            settings.scheduler,
                            settings.scheduler.policy,
                            telemetry=telemetry,
                            leader_name=leader_name,
                        )
                        service.run_forever(stopping, leading)

                _background(stack, stop, "jigsaw-leader", campaign, lock, lead, stop,
                            settings.scheduler.leader_retry_seconds)  # fmt: skip
            config = uvicorn.Config(
                app,
                host=host,
                port=port,
                log_config=None,
                log_level=log_level,
                access_log=access_log,
                lifespan="on",
            )
            server = uvicorn.Server(config)
            if not stop.is_set():
                logger.info("API on %s (dashboard at %s/ui/, docs at %s/docs)", url, url, url)
                server.run(sockets=[listener])
    finally:
        engine.dispose()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        logger.info("stopped")


def _background(
    stack: ExitStack, stop: threading.Event, name: str, target: Any, *args: Any
) -> None:
    """A daemon thread that `stack` joins (after `stop` is set) when it unwinds."""
    thread = threading.Thread(target=target, args=args, name=name, daemon=True)
    thread.start()

    def join() -> None:
        stop.set()
        thread.join(timeout=_THREAD_JOIN_SECONDS)
        if thread.is_alive():
            logger.warning("thread %s did not stop in time", name)

    stack.callback(join)


def _node_inventory(
    stack: ExitStack, factory: sessionmaker[Session], settings: Settings, stop: threading.Event
) -> None:
    """Keep nodes' schedulability in line with the Kubernetes API (JIGSAW_KUBERNETES_*)."""
    from scheduler.kube import NodeInventory, core_api

    inventory = NodeInventory(factory, settings.kubernetes, core_api(settings.kubernetes))
    _background(stack, stop, "jigsaw-node-inventory", inventory.run_forever, stop)


def _simulated_nodes(
    stack: ExitStack,
    factory: sessionmaker[Session],
    settings: Settings,
    stop: threading.Event,
    count: int,
    gpus_per_node: int,
    iterations_per_second: float,
) -> Dispatcher:
    from scheduler.dispatch import SimulatedDispatcher

    requeue_virtual_jobs(factory, "simulated nodes restarted")
    agent_ids = register_virtual_nodes(factory, count, gpus_per_node)

    def hand_back() -> None:
        try:
            requeue_virtual_jobs(factory, "simulated nodes shut down")
            mark_agents_dead(factory, agent_ids)
        except Exception:
            logger.exception("could not hand back the simulated nodes' jobs")

    stack.callback(hand_back)
    logger.info(
        "%d simulated node(s) with %d virtual GPU(s) each, %.0f iterations/s",
        count,
        gpus_per_node,
        iterations_per_second,
    )
    interval = max(0.2, min(settings.scheduler.agent_timeout_seconds / 3, 5.0))
    _background(
        stack, stop, "jigsaw-sim-heartbeat", heartbeat_forever, factory, agent_ids, interval, stop
    )
    return SimulatedDispatcher(iterations_per_second=iterations_per_second)


def _agents_endpoint(
    stack: ExitStack,
    factory: sessionmaker[Session],
    settings: Settings,
    stop: threading.Event,
    local_agents: int,
    gpus_per_agent: int,
    telemetry: SchedulerTelemetry,
    tokens: TokenVerifier,
) -> Dispatcher:
    """The gRPC endpoint real agents dial, its dispatcher, and optionally local agents.

    `tokens` is the API's verifier: a cluster token revoked through this process's API
    is refused by its gRPC endpoint at once, not only after the cache period.
    """
    from api.local_agents import LocalAgents
    from scheduler.agents.dispatcher import AgentDispatcher, RendezvousPorts
    from scheduler.agents.ingest import ReportWriter
    from scheduler.agents.server import start_server
    from scheduler.agents.service import AgentService

    writer = ReportWriter(factory, telemetry=telemetry)
    writer.start()
    stack.callback(writer.close)
    dispatcher = AgentDispatcher(
        factory,
        checkpoint_root=settings.checkpoint_dir,
        checkpoint_every=settings.scheduler.checkpoint_every,
        ports=RendezvousPorts(settings.grpc.rendezvous_port_min, settings.grpc.rendezvous_port_max),
        session_timeout_seconds=settings.scheduler.agent_timeout_seconds,
    )
    interval = max(0.2, min(settings.scheduler.agent_timeout_seconds / 3, 5.0))
    service = AgentService(factory, dispatcher, writer, interval, telemetry)
    tokens = TokenVerifier(factory, settings.api.auth_cache_seconds)
    grpc_server, grpc_port = start_server(service, tokens, settings.grpc)
    # Streams end first (grace), so agents see a clean close and redial later.
    stack.callback(lambda: grpc_server.stop(grace=2).wait())
    token_file = bootstrap_agent_token(factory, settings.home)
    logger.info("cluster token for agents in %s", token_file)
    if local_agents:
        agents = LocalAgents(
            settings.home,
            scheduler=f"{_dial_host(settings.grpc.host)}:{grpc_port}",
            token_file=token_file,
            count=local_agents,
            gpus_per_agent=gpus_per_agent,
        )
        agents.start()
        stack.callback(agents.stop)
    return dispatcher


def _let_local_workers_in(settings: Settings) -> None:
    """Local agents run as this process's user; as root, their training processes run as
    the worker user, who must reach the agents' work directories and the checkpoints
    (and nothing else) in the private home. Raises IsolationError when it cannot."""
    from pydantic import ValidationError

    from api.local_agents import WORK_ROOT
    from worker_agent.isolation import (
        IsolationError,
        check_runtime_runs,
        open_to_workers,
        resolve_worker_identity,
        worker_environment,
    )
    from worker_agent.settings import WorkerSettings

    try:
        worker = WorkerSettings()
        identity = resolve_worker_identity(worker.worker_user)
    except (ValueError, ValidationError) as exc:
        raise IsolationError(f"invalid worker setting: {exc}") from exc
    if identity is not None:
        open_to_workers(
            settings.home, [settings.home / WORK_ROOT, settings.checkpoint_dir], identity
        )
        check_runtime_runs(identity, worker_environment(os.environ, worker.worker_env))


def _dial_host(bind_host: str) -> str:
    return "127.0.0.1" if bind_host in {"", "0.0.0.0", "::", "[::]"} else bind_host
