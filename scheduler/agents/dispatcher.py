"""`AgentDispatcher`: the scheduler loop's `Dispatcher` over connected worker agents.

Each connected agent has one `AgentSession` (its Connect stream); commands are queued on
the session's outbox and the stream's handler sends them. What runs where is learnt from
the dispatcher's own launches and from each agent's Hello on (re)connect, so a restarted
scheduler knows what survived without relaunching anything. Job exits are queued by the
stream handlers and only applied in `poll`, on the loop's thread, so the loop never sees
a job vanish from `active()` before it has seen the exit that explains it.
"""

from __future__ import annotations

import json
import logging
import queue
import random
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from scheduler.db import transaction
from scheduler.dispatch import Launch, Report, RunOutcome
from scheduler.models.agents import node_addresses
from worker_agent.proto.jigsaw.v1 import agent_pb2 as pb

logger = logging.getLogger(__name__)

_OUTCOMES = {
    pb.OUTCOME_SUCCEEDED: RunOutcome.SUCCEEDED,
    pb.OUTCOME_FAILED: RunOutcome.FAILED,
    pb.OUTCOME_SUSPENDED: RunOutcome.SUSPENDED,
    pb.OUTCOME_STOPPED: RunOutcome.STOPPED,
}


@dataclass
class AgentSession:
    """One agent's Connect stream: the commands waiting to be sent to it."""

    node_name: str
    node_id: int
    agent_id: int
    outbox: queue.Queue[pb.SchedulerMessage | None] = field(default_factory=queue.Queue)
    closed: threading.Event = field(default_factory=threading.Event)

    def send(self, message: pb.SchedulerMessage) -> None:
        self.outbox.put(message)

    def close(self) -> None:
        if not self.closed.is_set():
            self.closed.set()
            self.outbox.put(None)  # wakes the stream handler blocked on the outbox


@dataclass(frozen=True)
class RendezvousPorts:
    low: int
    high: int


class AgentDispatcher:
    def __init__(
        self,
        factory: sessionmaker[Session],
        *,
        checkpoint_root: Path,
        checkpoint_every: int,
        ports: RendezvousPorts,
    ) -> None:
        self._factory = factory
        self._checkpoint_root = checkpoint_root
        self._checkpoint_every = checkpoint_every
        self._ports = ports
        self._lock = threading.Lock()
        self._sessions: dict[str, AgentSession] = {}
        # job -> node -> {rank: GPU index} there, for every job whose processes may live.
        self._jobs: dict[int, dict[str, dict[int, int]]] = {}
        self._job_ports: dict[int, int] = {}
        # (job, node) pairs already told to stop or suspend: each command goes out once.
        self._stopping: set[tuple[int, str]] = set()
        self._suspending: set[tuple[int, str]] = set()
        self._exits: queue.SimpleQueue[tuple[str, pb.JobExit]] = queue.SimpleQueue()

    # -- sessions (called by the gRPC service) ----------------------------------------

    def open_session(
        self,
        node_name: str,
        node_id: int,
        agent_id: int,
        running: Mapping[int, Mapping[int, int]],
        exits: Sequence[pb.JobExit] = (),
    ) -> AgentSession:
        """A (re)connected agent, the jobs it still runs (job -> rank -> GPU index) and
        the exits it could not send while disconnected; replaces an older stream."""
        session = AgentSession(node_name, node_id, agent_id)
        with self._lock:
            previous = self._sessions.pop(node_name, None)
            self._sessions[node_name] = session
            for job_id, ranks in running.items():
                self._jobs.setdefault(job_id, {})[node_name] = dict(ranks)
            for message in exits:
                # Known to have run here until the exit is polled, like any other exit.
                self._jobs.setdefault(message.job_id, {}).setdefault(node_name, {})
                self._exits.put((node_name, message))
            # Commands sent over the old stream may have been lost with it.
            self._stopping = {(j, n) for j, n in self._stopping if n != node_name}
            self._suspending = {(j, n) for j, n in self._suspending if n != node_name}
        if previous is not None:
            previous.close()
        return session

    def node_lost(self, node_name: str) -> None:
        """The scheduler gave up on the node's agent: forget what ran there.

        Its jobs were requeued; if the agent comes back, its Hello says what still runs
        and the loop stops those strays.
        """
        with self._lock:
            for job_id in list(self._jobs):
                self._jobs[job_id].pop(node_name, None)
                if not self._jobs[job_id]:
                    del self._jobs[job_id]
                    self._job_ports.pop(job_id, None)

    def close_session(self, session: AgentSession) -> None:
        """The stream ended. Jobs keep their entries: agents outlive short outages."""
        session.close()
        with self._lock:
            if self._sessions.get(session.node_name) is session:
                del self._sessions[session.node_name]

    def runs_on(self, node_name: str, job_id: int) -> bool:
        with self._lock:
            return node_name in self._jobs.get(job_id, {})

    def job_exited(self, node_name: str, message: pb.JobExit) -> None:
        self._exits.put((node_name, message))

    # -- Dispatcher -------------------------------------------------------------------

    def launch(self, launch: Launch) -> bool:
        by_node: dict[str, list[pb.RankAssignment]] = {}
        for worker in launch.workers:
            by_node.setdefault(worker.node_name, []).append(
                pb.RankAssignment(rank=worker.rank, gpu_index=worker.gpu_index)
            )
        master_node = launch.workers[0].node_name
        with transaction(self._factory) as session:
            master_addr = node_addresses(session, [master_node]).get(master_node, "")
        with self._lock:
            sessions = {node: self._sessions.get(node) for node in by_node}
            missing = sorted(node for node, s in sessions.items() if s is None)
            if missing:
                logger.warning(
                    "job %d not launched: %s not connected",
                    launch.job_id,
                    missing,
                    extra={"job_id": launch.job_id},
                )
                return False
            exiting = sorted(self._jobs.get(launch.job_id, {}))
            if exiting:
                # The previous run's processes have not exited yet (a resume right after
                # a suspend): starting now would race their checkpoint.
                logger.info(
                    "job %d not launched: still exiting on %s",
                    launch.job_id,
                    exiting,
                    extra={"job_id": launch.job_id},
                )
                return False
            busy = self._busy_gpus(by_node)
            if busy:
                # The database freed these GPUs, but the processes of a job that was
                # suspended or stopped still hold them for a moment.
                logger.info(
                    "job %d not launched: GPUs %s still busy",
                    launch.job_id,
                    busy,
                    extra={"job_id": launch.job_id},
                )
                return False
            port = self._free_port()
            self._job_ports[launch.job_id] = port
            self._jobs[launch.job_id] = {
                node: {a.rank: a.gpu_index for a in assignments}
                for node, assignments in by_node.items()
            }
        for node, assignments in by_node.items():
            command = pb.LaunchCommand(
                job_id=launch.job_id,
                spec_json=json.dumps(launch.spec),
                ranks=assignments,
                world_size=len(launch.workers),
                master_addr=master_addr,
                master_port=port,
                start_iteration=launch.start_iteration,
                lease_iterations=launch.lease_iterations,
                spb_json=json.dumps(launch.spb),
                config_version=0,
                checkpoint_dir=str(self._checkpoint_root / f"job-{launch.job_id}"),
                checkpoint_every=self._checkpoint_every,
            )
            message = (
                pb.SchedulerMessage(resume=command)
                if launch.start_iteration > 0
                else pb.SchedulerMessage(launch=command)
            )
            sessions[node].send(message)  # type: ignore[union-attr]
        return True

    def stop(self, job_id: int, node: str | None = None) -> None:
        self._command(job_id, node, self._stopping, "stop")

    def suspend(self, job_id: int) -> None:
        self._command(job_id, None, self._suspending, "suspend")

    def reconfigure(self, job_id: int, config_version: int, spb: dict[str, Any]) -> None:
        """Sent to every node of the job; rank 0's agent is the one that matters (rank 0
        hands the configuration to its peers at the boundary). A node not connected now
        misses it: its agent keeps the configuration it had."""
        command = pb.ReconfigureCommand(
            job_id=job_id, config_version=config_version, config_json=json.dumps(spb)
        )
        with self._lock:
            sessions = [(name, self._sessions.get(name)) for name in self._jobs.get(job_id, {})]
        for name, session in sessions:
            if session is None:
                logger.warning("reconfigure of job %d not sent: %s not connected", job_id, name)
                continue
            logger.info("reconfigure job %d on %s: version %d", job_id, name, config_version)
            session.send(pb.SchedulerMessage(reconfigure=command))

    def poll(self, now: datetime) -> list[Report]:
        reports = []
        while True:
            try:
                node, message = self._exits.get_nowait()
            except queue.Empty:
                break
            with self._lock:
                nodes = self._jobs.get(message.job_id, {})
                nodes.pop(node, None)
                if not nodes:
                    self._jobs.pop(message.job_id, None)
                    self._job_ports.pop(message.job_id, None)
                self._stopping.discard((message.job_id, node))
                self._suspending.discard((message.job_id, node))
            outcome = _OUTCOMES.get(message.outcome, RunOutcome.FAILED)
            reports.append(
                Report(
                    job_id=message.job_id,
                    iterations_done=message.iteration,
                    outcome=outcome,
                    message=_exit_message(node, message, outcome),
                    metrics=dict(message.metrics),
                )
            )
        return reports

    def active(self) -> dict[int, frozenset[str]]:
        with self._lock:
            return {job_id: frozenset(nodes) for job_id, nodes in self._jobs.items()}

    def connected(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._sessions)

    # -- helpers ----------------------------------------------------------------------

    def _command(
        self, job_id: int, node: str | None, sent: set[tuple[int, str]], kind: str
    ) -> None:
        with self._lock:
            targets = [
                (name, self._sessions.get(name))
                for name in self._jobs.get(job_id, {})
                if (node is None or name == node) and (job_id, name) not in sent
            ]
            # Nodes not connected now hear of it when they reconnect: their Hello puts the
            # job back in `active()` and the loop's reconciliation commands it again.
            sent.update((job_id, name) for name, session in targets if session is not None)
        for name, session in targets:
            if session is None:
                continue
            logger.info("%s job %d on %s", kind, job_id, name, extra={"job_id": job_id})
            if kind == "stop":
                session.send(pb.SchedulerMessage(stop=pb.StopCommand(job_id=job_id)))
            else:
                session.send(pb.SchedulerMessage(suspend=pb.SuspendCommand(job_id=job_id)))

    def _busy_gpus(self, wanted: Mapping[str, Sequence[pb.RankAssignment]]) -> list[str]:
        """`node:index` of the wanted GPUs that processes of any job still hold (lock held)."""
        held = {
            (node, gpu)
            for nodes in self._jobs.values()
            for node, ranks in nodes.items()
            for gpu in ranks.values()
        }
        return sorted(
            f"{node}:{a.gpu_index}"
            for node, assignments in wanted.items()
            for a in assignments
            if (node, a.gpu_index) in held
        )

    def _free_port(self) -> int:
        """A rendezvous port no job launched by this dispatcher holds (lock held)."""
        taken = set(self._job_ports.values())
        candidates = [
            port for port in range(self._ports.low, self._ports.high + 1) if port not in taken
        ]
        if not candidates:
            raise RuntimeError(f"all rendezvous ports {self._ports} are taken")
        # Random, not lowest: a port a crashed job left in TIME_WAIT is unlikely to recur.
        return random.choice(candidates)


def _exit_message(node: str, message: pb.JobExit, outcome: RunOutcome) -> str:
    if outcome is not RunOutcome.FAILED:
        return f"{outcome.value} on {node} at iteration {message.iteration}"
    tail = message.error_tail.strip()
    return f"failed on {node} (exit code {message.exit_code}): {tail}"
