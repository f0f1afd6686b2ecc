"""The agent's end of the workers' connections (`runtime/protocol.py` is the protocol).

One `multiprocessing.connection` Listener on loopback, every connection proving the
authkey (HMAC). A worker says hello (a warm one first says idle and waits for its rank:
`pool`), then rank 0 checks for the job's decision once and is told every change from
then on, unasked; it reports iterations, evaluations and its model profile, and every
rank says how it exits (and, at an in-place shrink, asks whether it goes on and as
which rank). The channel parses these into calls on the rank's `RankEvents`
and knows nothing of jobs: `Ranks` (the supervisor) says whose a hello is.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import threading
from dataclasses import dataclass, field
from multiprocessing.connection import Client, Connection, Listener
from typing import Any, Protocol

from worker_agent.runtime.config import WorkerConfig
from worker_agent.runtime.protocol import (
    LEAVE_MESSAGE,
    Decision,
    IterationRecord,
    assign_message,
)

logger = logging.getLogger(__name__)


class RankEvents(Protocol):
    """What one rank's worker tells, and what it is told."""

    def decision(self) -> Decision:
        """The job's decision now (rank 0 only)."""
        ...

    def reported(self, records: list[IterationRecord]) -> None: ...

    def evaluated(self, iteration: int, metrics: dict[str, float]) -> None: ...

    def profiled(self, workload: str, profile: dict[str, Any]) -> None: ...

    def shrunk(self, iteration: int) -> WorkerConfig | None:
        """The rank's configuration after its job's in-place shrink at `iteration`, or
        None: it leaves."""
        ...

    def exited(self, iteration: int, error_tail: str | None) -> None:
        """The worker's last message: the boundary it ended at and, if it failed, why."""
        ...


@dataclass(eq=False)
class RankLink:
    """A rank's worker as the channel knows it."""

    events: RankEvents
    connected: threading.Event = field(default_factory=threading.Event)
    disconnected: threading.Event = field(default_factory=threading.Event)
    # Rank 0's connection once it asked for its first decision: every change follows.
    watcher: Connection | None = None
    # Orders the decisions sent on `watcher` as the job's state changed.
    send_lock: threading.Lock = field(default_factory=threading.Lock)


class Ranks(Protocol):
    def link(self, job_id: int, rank: int, pid: int) -> RankLink | None:
        """The link of the worker process `pid` running `rank` of `job_id`, or None
        when there is no such worker here."""
        ...


class IdleWorkers(Protocol):
    def idle(self, pid: int, connection: Connection) -> bool: ...

    def idle_connection_lost(self, pid: int) -> None: ...


class WorkerChannel:
    def __init__(self) -> None:
        self.authkey = secrets.token_hex(32)
        # Loopback only, and every connection must prove it knows the authkey (HMAC).
        self._listener = Listener(("127.0.0.1", 0), authkey=self.authkey.encode())
        self._closing = False
        self._acceptor: threading.Thread | None = None

    @property
    def address(self) -> str:
        host, port = self._listener.address
        return f"{host}:{port}"

    def serve(self, ranks: Ranks, idle: IdleWorkers) -> None:
        """Accept workers from now on, in a thread of its own."""
        self._acceptor = threading.Thread(
            target=self._accept, args=(ranks, idle), name="jigsaw-accept", daemon=True
        )
        self._acceptor.start()

    def tell(self, link: RankLink) -> None:
        """Send the job's decision to the rank watching it: the answer to its first
        check, then every change (the worker reads what arrived at each boundary
        without asking, so a boundary costs it no round trip)."""
        with link.send_lock:
            if link.watcher is None:
                return
            message = link.events.decision().to_message()
            # A worker that is gone needs no decision: its exit says how it ended.
            with contextlib.suppress(OSError):
                link.watcher.send(message)

    def close(self) -> None:
        """Stop listening (the workers are gone)."""
        self._closing = True
        if self._acceptor is not None:
            # Wake the accepting thread out of accept() with a connection of our own.
            Client(self._listener.address, authkey=self.authkey.encode()).close()
            self._acceptor.join(timeout=10)
        self._listener.close()

    def _accept(self, ranks: Ranks, idle: IdleWorkers) -> None:
        while True:
            try:
                connection = self._listener.accept()
            except Exception as exc:  # noqa: BLE001 - a bad client must not stop the agent
                if self._closing:
                    return
                logger.warning("refused a worker connection: %s", exc)
                continue
            if self._closing:
                connection.close()
                return
            threading.Thread(
                target=self._serve,
                args=(connection, ranks, idle),
                name="jigsaw-worker-conn",
                daemon=True,
            ).start()

    def _serve(self, connection: Connection, ranks: Ranks, idle: IdleWorkers) -> None:
        with connection:
            try:
                hello = self._hello(connection, idle)
                if hello is None:
                    return
                link = ranks.link(hello["job_id"], hello["rank"], hello["pid"])
                if link is None:
                    logger.warning("a worker that is not ours said hello: %s", hello)
                    return
                link.connected.set()
                try:
                    while True:
                        self._receive(link, connection, connection.recv())
                finally:
                    link.disconnected.set()
            except (EOFError, ConnectionResetError):
                return  # the worker closed its end or died: it has said everything
            except (OSError, KeyError, TypeError, ValueError) as exc:
                logger.warning("dropped a worker connection: %r", exc)

    def _hello(self, connection: Connection, idle: IdleWorkers) -> dict[str, Any] | None:
        """The worker's hello; a pooled worker first waits idle until it gets a rank."""
        first: dict[str, Any] = connection.recv()
        if first.get("type") != "idle":
            return first
        pid = first["pid"]
        if not idle.idle(pid, connection):
            logger.warning("a warm worker that is not ours said idle: %s", first)
            return None
        try:
            hello: dict[str, Any] = connection.recv()
        except (EOFError, ConnectionResetError, OSError):
            idle.idle_connection_lost(pid)
            return None
        return hello

    def _receive(self, link: RankLink, connection: Connection, message: dict[str, Any]) -> None:
        kind = message["type"]
        events = link.events
        if kind == "check":
            link.watcher = connection
            self.tell(link)
        elif kind == "report":
            records = [IterationRecord(**record) for record in message["records"]]
            if records:
                events.reported(records)
        elif kind == "evaluation":
            metrics = {name: float(value) for name, value in message["metrics"].items()}
            events.evaluated(int(message["iteration"]), metrics)
        elif kind == "profile":
            events.profiled(str(message["workload"]), message["profile"])
        elif kind == "shrunk":
            config = events.shrunk(int(message["iteration"]))
            connection.send(
                assign_message(config.model_dump(mode="json")) if config else LEAVE_MESSAGE
            )
        elif kind == "exit":
            events.exited(int(message["iteration"]), message.get("error_tail"))
        else:
            logger.warning("a worker sent an unknown message %r", kind)
