"""`jigsaw up`: the API and the scheduler loop in one process.

Start-up, in order:
  1. migrate the database (safe when several processes start at once);
  2. on first start, create the `admin` user and an admin token and store them in
     `$JIGSAW_HOME/credentials.json` (0600) for the CLI; later starts reuse that token
     while it still authenticates;
  3. take the scheduler leader lock without waiting: if another process leads this
     database, serve the API only;
  4. as leader, optionally register simulated nodes (virtual GPUs whose agents this
     process keeps heartbeating) and run the round loop in a daemon thread with the
     simulated dispatcher;
  5. serve HTTP with uvicorn in the foreground until SIGINT/SIGTERM, then stop the loop,
     hand back the simulated nodes' jobs and release the lock.
"""

from __future__ import annotations

import logging
import signal
import socket
import threading
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from types import FrameType
from typing import Any

import filelock
import uvicorn
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from api.credentials import Credentials, load_credentials, local_url, save_credentials
from scheduler.db import engine_from_settings, session_factory, transaction
from scheduler.migrate import upgrade
from scheduler.models.users import USER_SCOPE, authenticate, get_or_create_user, issue_token
from scheduler.orm import GPU, Agent, Allocation, Job, Node, utcnow
from scheduler.settings import Settings
from scheduler.states import IllegalTransition, JobState, transition

logger = logging.getLogger("jigsaw.server")

ADMIN_USER = "admin"
ACTOR = "jigsaw-up"
VIRTUAL_NODE_PREFIX = "virtual-"
VIRTUAL_GPU_KIND = "virtual-cpu"
VIRTUAL_GPU_MEMORY = 16 * 1024**3
VIRTUAL_AGENT_VERSION = "simulated"
DEFAULT_SIM_ITERATIONS_PER_SECOND = 50.0
_THREAD_JOIN_SECONDS = 15.0


def configure_logging(level: str = "info") -> None:
    """Plain timestamped lines on stderr, unless the embedding program set logging up."""
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(
            level=level.upper(),
            format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        )
    else:
        root.setLevel(level.upper())


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host if host not in {"", "::"} else "127.0.0.1", 0))
        return int(sock.getsockname()[1])


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


# -- simulated nodes ------------------------------------------------------------------


def register_virtual_nodes(
    factory: sessionmaker[Session], count: int, gpus_per_node: int
) -> list[int]:
    """Create (or refresh) nodes `virtual-0..count-1` with alive agents; their agent ids."""
    now = utcnow()
    agent_ids = []
    with transaction(factory) as session:
        for i in range(count):
            name = f"{VIRTUAL_NODE_PREFIX}{i}"
            node = session.scalar(select(Node).where(Node.name == name))
            if node is None:
                node = Node(name=name, address="simulated")
                session.add(node)
                session.flush()
            have = {gpu.index for gpu in session.scalars(select(GPU).where(GPU.node_id == node.id))}
            session.add_all(
                GPU(
                    node_id=node.id,
                    index=index,
                    kind=VIRTUAL_GPU_KIND,
                    memory_bytes=VIRTUAL_GPU_MEMORY,
                    virtual=True,
                )
                for index in range(gpus_per_node)
                if index not in have
            )
            agent = session.scalar(select(Agent).where(Agent.node_id == node.id))
            if agent is None:
                agent = Agent(node_id=node.id)
                session.add(agent)
            agent.version = VIRTUAL_AGENT_VERSION
            agent.alive = True
            agent.registered_at = now
            agent.last_heartbeat_at = now
            session.flush()
            agent_ids.append(agent.id)
    return agent_ids


def requeue_virtual_jobs(factory: sessionmaker[Session], reason: str) -> list[int]:
    """Free the virtual GPUs and send their SCHEDULED/RUNNING jobs back to the queue.

    The simulated dispatcher lives in this process's memory, so its runs end with it:
    at shutdown, and at start-up after a crash, the jobs it held are orphans.
    """
    now = utcnow()
    with transaction(factory) as session:
        job_ids = set(
            session.scalars(
                select(Allocation.job_id)
                .join(GPU, GPU.id == Allocation.gpu_id)
                .where(GPU.virtual.is_(True), Allocation.released_at.is_(None))
            )
        )
        if not job_ids:
            return []
        session.execute(
            update(Allocation)
            .where(Allocation.job_id.in_(job_ids), Allocation.released_at.is_(None))
            .values(released_at=now)
            .execution_options(synchronize_session=False)
        )
        requeued = []
        for job in session.scalars(select(Job).where(Job.id.in_(job_ids))):
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


def _heartbeat(agent_ids: Sequence[int], alive: bool, now: datetime | None = None) -> Any:
    return (
        update(Agent)
        .where(Agent.id.in_(list(agent_ids)))
        .values(alive=alive, last_heartbeat_at=now or utcnow())
        .execution_options(synchronize_session=False)
    )


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
                session.execute(_heartbeat(agent_ids, alive=True))
        except Exception:
            logger.exception("simulated heartbeat failed; retrying")


def mark_agents_dead(factory: sessionmaker[Session], agent_ids: Sequence[int]) -> None:
    with transaction(factory) as session:
        session.execute(
            update(Agent)
            .where(Agent.id.in_(list(agent_ids)))
            .values(alive=False)
            .execution_options(synchronize_session=False)
        )


# -- the process ----------------------------------------------------------------------


def serve(
    settings: Settings,
    *,
    host: str,
    port: int,
    scheduler: bool = True,
    virtual_nodes: int = 0,
    gpus_per_node: int = 4,
    sim_iterations_per_second: float = DEFAULT_SIM_ITERATIONS_PER_SECOND,
    log_level: str = "info",
    access_log: bool = False,
) -> None:
    """Run `jigsaw up` in the foreground until SIGINT/SIGTERM (see the module docstring)."""
    # Imported here so the CLI's other commands do not pay for FastAPI and the loop.
    from api.app import create_app
    from scheduler.dispatch import SimulatedDispatcher
    from scheduler.leader import LeaderLock
    from scheduler.loop import SchedulerService

    configure_logging(log_level)
    if port == 0:
        port = free_port(host)
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
    threads: list[threading.Thread] = []
    agent_ids: list[int] = []
    try:
        logger.info("database %s", engine.url.render_as_string(hide_password=True))
        upgrade(engine)
        url = local_url(host, port)
        bootstrap_credentials(factory, settings.home, url)

        leading = lock is not None and lock.acquire(blocking=False)
        if lock is not None and not leading:
            logger.warning(
                "another scheduler already leads this database (%s); serving the API only",
                lock.describe(),
            )
        if virtual_nodes and not leading:
            logger.warning("simulated nodes need this process to run the scheduler; skipped")
        if leading:
            assert lock is not None
            logger.info(
                "scheduler leader (%s), policy %s", lock.describe(), settings.scheduler.policy
            )
            if virtual_nodes:
                requeue_virtual_jobs(factory, "simulated nodes restarted")
                agent_ids = register_virtual_nodes(factory, virtual_nodes, gpus_per_node)
                logger.info(
                    "%d simulated node(s) with %d virtual GPU(s) each, %.0f iterations/s",
                    virtual_nodes,
                    gpus_per_node,
                    sim_iterations_per_second,
                )
                interval = max(0.2, min(settings.scheduler.agent_timeout_seconds / 3, 5.0))
                threads.append(
                    threading.Thread(
                        target=heartbeat_forever,
                        args=(factory, agent_ids, interval, stop),
                        name="jigsaw-sim-heartbeat",
                        daemon=True,
                    )
                )
            service = SchedulerService(
                factory,
                SimulatedDispatcher(iterations_per_second=sim_iterations_per_second),
                settings.scheduler,
                settings.scheduler.policy,
            )
            threads.append(
                threading.Thread(
                    target=service.run_forever,
                    args=(stop,),
                    name="jigsaw-scheduler",
                    daemon=True,
                )
            )
        for thread in threads:
            thread.start()

        config = uvicorn.Config(
            create_app(settings),
            host=host,
            port=port,
            log_config=None,
            log_level=log_level,
            access_log=access_log,
            lifespan="on",
        )
        server = uvicorn.Server(config)
        if not stop.is_set():
            logger.info("API on %s (docs at %s/docs)", url, url)
            server.run()
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=_THREAD_JOIN_SECONDS)
            if thread.is_alive():
                logger.warning("thread %s did not stop in time", thread.name)
        if agent_ids:
            try:
                requeue_virtual_jobs(factory, "simulated nodes shut down")
                mark_agents_dead(factory, agent_ids)
            except Exception:
                logger.exception("could not hand back the simulated nodes' jobs")
        if lock is not None:
            lock.release()
        engine.dispose()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        logger.info("stopped")
