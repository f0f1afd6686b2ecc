"""`AgentDispatcher`: the scheduler loop's `Dispatcher` over connected worker agents.

Each connected agent has one `AgentSession` (its Connect stream); commands are queued on
the session's outbox and the stream's handler sends them. A node name is held by one
live session at a time: another agent process (another instance key) claiming it is
refused (`NodeTaken`) until that session ends or falls silent past the agent timeout.

What runs where is learnt from the dispatcher's own launches and from each agent's
Hello on (re)connect, checked against the database: a run is the job's *current* one on
a node only when the node holds the job's active allocations of that attempt and the
run was launched to the very agent process that claims it; only a current run's
messages count. A claim of an earlier run (the job moved on) is a *stray*, kept only to
be stopped or suspended; anything else is dropped and the claimant told to stop it. Job
exits are queued by the stream handlers and only applied in `poll`, on the loop's
thread, so the loop never sees a job vanish from `active()` before it has seen the exit
that explains it.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from jigsaw.jobspec import JobSpec
from jigsaw.proto import convert
from jigsaw.proto.v2 import agent_pb2 as pb
from jigsaw.spb import resolve
from scheduler.db import transaction
from scheduler.dispatch import Launch, Report, RunOutcome
from scheduler.models.agents import (
    MEMORY_HEADROOM,
    MEMORY_RECENT_ITERATIONS,
    NodeRun,
    bind_run,
    instance_digest,
    memory_cap,
    runs_on_node,
)

logger = logging.getLogger(__name__)

_OUTCOMES = {
    pb.OUTCOME_SUCCEEDED: RunOutcome.SUCCEEDED,
    pb.OUTCOME_FAILED: RunOutcome.FAILED,
    pb.OUTCOME_SUSPENDED: RunOutcome.SUSPENDED,
    pb.OUTCOME_STOPPED: RunOutcome.STOPPED,
    pb.OUTCOME_REFUSED: RunOutcome.REFUSED,
}

# Why a job-scoped message from an agent was dropped (`jigsaw_reports_dropped_total`).
NOT_ALLOCATED = "not_allocated"  # the job is not this node's, now or ever
STALE_ATTEMPT = "stale_attempt"  # of a run the job has moved on from
OTHER_AGENT = "other_agent"  # the run was launched to another agent process


@dataclass
class Run:
    """A job's processes on one node, as far as the scheduler knows."""

    attempt: int
    ranks: dict[int, int]  # rank -> GPU index
    instance: str  # the key of the agent process running them
    current: bool  # the job's current run here; False: a stray, only to be ended


@dataclass(frozen=True)
class Dropped:
    """A job-scoped message the dispatcher would not take, and why."""

    kind: str  # running, exit, shrunk, reports, log, evaluation, profile
    job_id: int
    reason: str


class NodeTaken(Exception):
    """Another live agent session holds the node name; the text says which."""


@dataclass
class AgentSession:
    """One agent's Connect stream: the commands waiting to be sent to it."""

    node_name: str
    node_id: int
    agent_id: int
    instance: str  # the agent process's secret key (see agent.proto's RegisterRequest)
    peer: str = ""
    outbox: queue.Queue[pb.SchedulerMessage | None] = field(default_factory=queue.Queue)
    closed: threading.Event = field(default_factory=threading.Event)
    last_seen: float = field(default_factory=time.monotonic)

    def send(self, message: pb.SchedulerMessage) -> None:
        self.outbox.put(message)

    def seen(self) -> None:
        """The agent just spoke on this stream."""
        self.last_seen = time.monotonic()

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
        session_timeout_seconds: float = 30.0,
    ) -> None:
        self._factory = factory
        self._checkpoint_root = checkpoint_root
        self._checkpoint_every = checkpoint_every
        self._ports = ports
        self._session_timeout = session_timeout_seconds
        self._lock = threading.Lock()
        self._sessions: dict[str, AgentSession] = {}
        # The instance key of the agent process each node's runs belong to.
        self._instances: dict[str, str] = {}
        # job -> node -> its run there, for every job whose processes may live.
        self._jobs: dict[int, dict[str, Run]] = {}
        # The rendezvous ports each job's groups have had while its processes may live,
        # the current one last. An in-place resize re-forms the group in the same
        # processes; rank 0's process goes on serving its first group's store (torch
        # 2.13 keeps the store of the first group a DDP model used after the group is
        # destroyed), and torch's `tcp://` rendezvous reuses a store its process serves
        # on the port (`multi_tenant`): there, the new group would read the old one's
        # addresses.
        self._job_ports: dict[int, list[int]] = {}
        # (job, node) pairs already told to stop or suspend: each command goes out once.
        self._stopping: set[tuple[int, str]] = set()
        self._suspending: set[tuple[int, str]] = set()
        # Run ends and in-place shrinks, in the order agents sent them, for `poll`.
        self._exits: queue.SimpleQueue[tuple[str, pb.JobExit | pb.JobShrunk]] = queue.SimpleQueue()

    # -- sessions (called by the gRPC service) ----------------------------------------

    def holder(self, node_name: str, instance: str) -> str | None:
        """Why `instance` may not claim `node_name` now (another live session holds
        it), or None."""
        with self._lock:
            return self._holder(node_name, instance)

    def open_session(
        self,
        node_name: str,
        node_id: int,
        agent_id: int,
        hello: pb.Hello,
        peer: str = "",
    ) -> tuple[AgentSession, list[Dropped]]:
        """A (re)connected agent: what it still runs and the exits it could not send
        while disconnected, each checked against the database. Replaces an older stream
        of the same agent process; raises NodeTaken while another one holds the name.

        Returns the session and what of the hello was not taken. The agent is told to
        stop the runs it claimed that are neither current nor strays.
        """
        instance = hello.instance
        mentioned = {job.job_id for job in hello.running} | {e.job_id for e in hello.exits}
        with transaction(self._factory) as db:
            stored = runs_on_node(db, node_id, mentioned)
        session = AgentSession(node_name, node_id, agent_id, instance, peer)
        dropped: list[Dropped] = []
        with self._lock:
            problem = self._holder(node_name, instance)
            if problem is not None:
                raise NodeTaken(problem)
            previous = self._sessions.pop(node_name, None)
            self._sessions[node_name] = session
            if self._instances.get(node_name, instance) != instance:
                # Another agent process now serves the node: the old one's runs cannot be
                # reached any more (its workers die with it), so they are forgotten.
                self._forget(node_name)
            self._instances[node_name] = instance
            for job in hello.running:
                ranks = {a.rank: a.gpu_index for a in job.ranks}
                run = self._claim(node_name, instance, job.job_id, job.attempt, ranks, stored)
                if isinstance(run, str):
                    dropped.append(Dropped("running", job.job_id, run))
                    session.send(_stop(job.job_id, f"not this node's current run: {run}"))
                else:
                    self._jobs.setdefault(job.job_id, {})[node_name] = run
                    # After a scheduler restart, the only account of them.
                    if job.rendezvous_ports:
                        held = self._job_ports.setdefault(job.job_id, [])
                        held += [port for port in job.rendezvous_ports if port not in held]
            for message in hello.exits:
                reason = self._exit(node_name, instance, message, stored)
                if reason is not None:
                    dropped.append(Dropped("exit", message.job_id, reason))
            # Commands sent over the old stream may have been lost with it.
            self._stopping = {(j, n) for j, n in self._stopping if n != node_name}
            self._suspending = {(j, n) for j, n in self._suspending if n != node_name}
        if previous is not None:
            previous.close()
        return session, dropped

    def node_lost(self, node_name: str) -> None:
        """The scheduler gave up on the node's agent: forget what ran there.

        Its jobs were requeued; if the agent comes back, its Hello says what still runs
        and the loop stops those strays.
        """
        with self._lock:
            self._forget(node_name)

    def close_session(self, session: AgentSession) -> None:
        """The stream ended. Jobs keep their entries: agents outlive short outages."""
        session.close()
        with self._lock:
            if self._sessions.get(session.node_name) is session:
                del self._sessions[session.node_name]

    def refusal(self, session: AgentSession, job_id: int) -> str | None:
        """Why a message of `session` about `job_id` must be dropped, or None to take it."""
        with self._lock:
            run = self._jobs.get(job_id, {}).get(session.node_name)
            return _refusal(run, session.instance)

    def job_exited(self, session: AgentSession, message: pb.JobExit) -> str | None:
        """Queue the exit of the current run for `poll`; a stray's exit only ends the
        stray. Returns why the exit is not applied, or None."""
        with self._lock:
            return self._exit(session.node_name, session.instance, message, {})

    # -- Dispatcher -------------------------------------------------------------------

    def launch(self, launch: Launch) -> bool:
        by_node: dict[str, list[pb.RankAssignment]] = {}
        for worker in launch.workers:
            by_node.setdefault(worker.node_name, []).append(
                pb.RankAssignment(rank=worker.rank, gpu_index=worker.gpu_index)
            )
        with self._lock:
            sessions = {
                node: agent for node in by_node if (agent := self._sessions.get(node)) is not None
            }
            missing = sorted(set(by_node) - set(sessions))
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
            self._job_ports[launch.job_id] = [port]
            runs = {
                node: Run(
                    launch.attempt,
                    {a.rank: a.gpu_index for a in assignments},
                    sessions[node].instance,
                    current=True,
                )
                for node, assignments in by_node.items()
            }
            self._jobs[launch.job_id] = runs
        try:
            messages = self._launch_messages(launch, by_node, runs, port)
        except Exception:
            with self._lock:
                self._drop_job(launch.job_id)
            raise
        # Only once every command is built: a launch is sent to all its nodes or to none.
        for node, message in messages.items():
            sessions[node].send(message)
        return True

    def _launch_messages(
        self,
        launch: Launch,
        by_node: Mapping[str, list[pb.RankAssignment]],
        runs: Mapping[str, Run],
        port: int,
    ) -> dict[str, pb.SchedulerMessage]:
        """Each node's command; first the runs' agent processes are stored, so that a
        Hello claiming the run after a restart of the scheduler finds whom it was
        launched to."""
        with transaction(self._factory) as db:
            caps = {node: self._cap(db, launch, node) for node in runs}
            for node, run in runs.items():
                gpu_ids = [w.gpu_id for w in launch.workers if w.node_name == node]
                bind_run(
                    db,
                    launch.job_id,
                    launch.attempt,
                    gpu_ids,
                    instance_digest(run.instance),
                    caps[node],
                )
        spec = convert.spec_message(JobSpec.model_validate(launch.spec))
        messages = {}
        for node, assignments in by_node.items():
            command = self._launch_command(launch, spec, assignments, port, caps[node])
            messages[node] = (
                pb.SchedulerMessage(resume=command)
                if launch.start_iteration > 0
                else pb.SchedulerMessage(launch=command)
            )
        return messages

    @staticmethod
    def _cap(db: Session, launch: Launch, node: str) -> int:
        """Each rank's memory cap on the node's GPUs of the launch."""
        if launch.memory_bytes is not None:
            return launch.memory_bytes
        gpu_ids = [w.gpu_id for w in launch.workers if w.node_name == node]
        return memory_cap(
            db, launch.job_id, gpu_ids, headroom=MEMORY_HEADROOM, recent=MEMORY_RECENT_ITERATIONS
        )

    def _launch_command(
        self,
        launch: Launch,
        spec: pb.JobSpec,
        assignments: list[pb.RankAssignment],
        port: int,
        cap: int,
    ) -> pb.LaunchCommand:
        return pb.LaunchCommand(
            job_id=launch.job_id,
            spec=spec,
            ranks=assignments,
            world_size=len(launch.workers),
            master_addr=launch.workers[0].node_address,
            master_port=port,
            start_iteration=launch.start_iteration,
            lease_iterations=launch.lease_iterations,
            spb=convert.spb_message(resolve(launch.spb)),
            config_version=0,
            checkpoint_dir=str(self._checkpoint_root / f"job-{launch.job_id}"),
            checkpoint_every=self._checkpoint_every,
            attempt=launch.attempt,
            global_batch=launch.global_batch,
            memory_bytes=cap,
        )

    def resize_in_place(self, launch: Launch) -> bool:
        nodes = {worker.node_name for worker in launch.workers}
        node = next(iter(nodes))
        with self._lock:
            runs = self._jobs.get(launch.job_id, {})
            session = self._sessions.get(node)
            if (
                len(nodes) != 1
                or set(runs) != nodes
                or session is None
                or not runs[node].current
                or runs[node].attempt != launch.attempt
                or (launch.job_id, node) in self._stopping | self._suspending
            ):
                return False
            # The new gang's rendezvous, on a port new to the job (`_job_ports`).
            port = self._free_port()
            self._job_ports.setdefault(launch.job_id, []).append(port)
            held = set(runs[node].ranks.values())
            instance = runs[node].instance
        joiners = [w.gpu_id for w in launch.workers if w.gpu_index not in held]
        with transaction(self._factory) as db:
            cap = self._cap(db, launch, node)
            if joiners:  # a growth: its new ranks are launched to the same agent process
                bind_run(db, launch.job_id, launch.attempt, joiners, instance_digest(instance), cap)
        assignments = _assignments({w.rank: w.gpu_index for w in launch.workers})
        spec = convert.spec_message(JobSpec.model_validate(launch.spec))
        command = self._launch_command(launch, spec, assignments, port, cap)
        logger.info(
            "resize job %d in place on %s to GPUs %s",
            launch.job_id,
            node,
            [a.gpu_index for a in assignments],
            extra={"job_id": launch.job_id},
        )
        session.send(pb.SchedulerMessage(shrink=pb.ShrinkCommand(launch=command)))
        return True

    def job_shrunk(self, session: AgentSession, message: pb.JobShrunk) -> str | None:
        """Queue a shrink of the current run for `poll` (its ranks here from now on), or
        say why it is dropped."""
        with self._lock:
            run = self._jobs.get(message.job_id, {}).get(session.node_name)
            reason = _refusal(run, session.instance)
            if run is not None and reason is None:
                if message.attempt != run.attempt:
                    return STALE_ATTEMPT
                run.ranks = {a.rank: a.gpu_index for a in message.ranks}
                self._exits.put((session.node_name, message))
            return reason

    def stop(self, job_id: int, node: str | None = None) -> None:
        self._command(job_id, node, self._stopping, "stop")

    def suspend(self, job_id: int) -> None:
        self._command(job_id, None, self._suspending, "suspend")

    def reconfigure(self, job_id: int, config_version: int, spb: dict[str, Any]) -> None:
        """Sent to every node of the job; rank 0's agent is the one that matters (rank 0
        hands the configuration to its peers at the boundary). A node not connected now
        misses it: its agent keeps the configuration it had."""
        command = pb.ReconfigureCommand(
            job_id=job_id, config_version=config_version, spb=convert.spb_message(resolve(spb))
        )
        what = f"reconfigure (version {config_version})"
        self._to_job_nodes(job_id, pb.SchedulerMessage(reconfigure=command), what)

    def cap(self, job_id: int, memory_bytes: int) -> None:
        """Sent to every node of the job: each agent counts the cap for its own GPUs, and
        rank 0's hands it to its peers at the boundary. A node not connected now misses
        it and keeps counting the cap it had (a guest may then be refused there)."""
        command = pb.CapCommand(job_id=job_id, memory_bytes=memory_bytes)
        self._to_job_nodes(job_id, pb.SchedulerMessage(cap=command), "cap")

    def _to_job_nodes(self, job_id: int, message: pb.SchedulerMessage, what: str) -> None:
        with self._lock:
            sessions = [(name, self._sessions.get(name)) for name in self._jobs.get(job_id, {})]
        for name, session in sessions:
            if session is None:
                logger.warning("%s of job %d not sent: %s not connected", what, job_id, name)
                continue
            logger.info("%s job %d on %s", what, job_id, name)
            session.send(message)

    def poll(self, now: datetime) -> list[Report]:
        reports = []
        while True:
            try:
                node, message = self._exits.get_nowait()
            except queue.Empty:
                break
            if isinstance(message, pb.JobShrunk):
                reports.append(_shrunk_report(node, message))
                continue
            with self._lock:
                self._end_run(message.job_id, node)
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

    def unheard(self, nodes: Iterable[str]) -> frozenset[str]:
        with self._lock:
            return frozenset(node for node in nodes if node not in self._instances)

    def freeing(self) -> frozenset[tuple[str, int]]:
        with self._lock:
            return self._ending_holds()

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

    def _holder(self, node_name: str, instance: str) -> str | None:
        """As `holder` (lock held); a session silent past the timeout is closed."""
        current = self._sessions.get(node_name)
        if current is None or current.instance == instance or current.closed.is_set():
            return None
        silent = time.monotonic() - current.last_seen
        if silent > self._session_timeout:
            logger.warning(
                "node %s: its agent session has been silent for %.0f s; another agent "
                "process takes the name over",
                node_name,
                silent,
                extra={"node": node_name},
            )
            current.close()
            return None
        return (
            f"node {node_name!r} is held by another live agent process (connected from "
            f"{current.peer or 'an unknown peer'}, heard from {silent:.0f} s ago); a node "
            f"name serves one agent at a time: retry once it disconnects or has been silent "
            f"for {self._session_timeout:.0f} s"
        )

    def _claim(
        self,
        node_name: str,
        instance: str,
        job_id: int,
        attempt: int,
        ranks: dict[int, int],
        stored: Mapping[int, NodeRun],
    ) -> Run | str:
        """The run a Hello claims, or why it is not taken (lock held)."""
        known = self._jobs.get(job_id, {}).get(node_name)
        if known is not None and known.instance == instance and known.attempt == attempt:
            return known  # the same process reconnecting: what it was
        held = stored.get(job_id)
        if held is None:
            return NOT_ALLOCATED
        if held.ranks:
            # The node holds the job now: only the run launched to this process counts.
            if held.agent_instance != instance_digest(instance):
                return OTHER_AGENT
            if attempt != held.attempt:
                return STALE_ATTEMPT if attempt < held.attempt else NOT_ALLOCATED
            if ranks != held.ranks:
                if held.joining and ranks == {
                    rank: index for rank, index in held.ranks.items() if rank not in held.joining
                }:
                    # A growth in place under way: its JobShrunk adds the new ranks.
                    return Run(attempt, ranks, instance, current=True)
                if not _shrunk_from(held.ranks, ranks):
                    return NOT_ALLOCATED
                # Shrunk in place, its JobShrunk lost with a stream: the run is what runs.
                shrunk = pb.JobShrunk(job_id=job_id, attempt=attempt, ranks=_assignments(ranks))
                self._exits.put((node_name, shrunk))
            return Run(attempt, ranks, instance, current=True)
        # The job moved on from this node: its processes are ended, then forgotten.
        return Run(attempt, ranks, instance, current=False)

    def _exit(
        self, node_name: str, instance: str, message: pb.JobExit, stored: Mapping[int, NodeRun]
    ) -> str | None:
        """Queue the exit of the run it ends, or say why not (lock held).

        `stored`: the database's runs on the node, for exits sent in a Hello.
        """
        job_id = message.job_id
        run = self._jobs.get(job_id, {}).get(node_name)
        if run is None:
            held = stored.get(job_id)
            if held is None:
                return NOT_ALLOCATED
            if (
                not held.ranks
                or held.agent_instance != instance_digest(instance)
                or held.attempt != message.attempt
            ):
                return STALE_ATTEMPT
            # Known to have run here until the exit is polled, like any other exit.
            run = Run(held.attempt, dict(held.ranks), instance, current=True)
            self._jobs.setdefault(job_id, {})[node_name] = run
        reason = _refusal(run, instance)
        if reason is None and message.attempt != run.attempt:
            reason = STALE_ATTEMPT
        if reason is None:
            self._exits.put((node_name, message))
        elif run.instance == instance and run.attempt == message.attempt:
            self._end_run(job_id, node_name)  # a stray's end: nothing to apply
        return reason

    def _end_run(self, job_id: int, node_name: str) -> None:
        """The job's processes on the node are gone (lock held)."""
        nodes = self._jobs.get(job_id, {})
        nodes.pop(node_name, None)
        if not nodes:
            self._drop_job(job_id)
        self._stopping.discard((job_id, node_name))
        self._suspending.discard((job_id, node_name))

    def _drop_job(self, job_id: int) -> None:
        self._jobs.pop(job_id, None)
        self._job_ports.pop(job_id, None)

    def _forget(self, node_name: str) -> None:
        """Nothing is believed to run on the node any more (lock held)."""
        for job_id in list(self._jobs):
            self._jobs[job_id].pop(node_name, None)
            if not self._jobs[job_id]:
                self._drop_job(job_id)

    def _ending_holds(self) -> frozenset[tuple[str, int]]:
        """(node, GPU index) that processes of an ending run still hold: a stray, or one
        told to stop or suspend (lock held). A current run that goes on holds its GPU in
        the database too, so a placement beside it is the policy's choice to share the
        GPU, which the agent accepts or refuses by its room."""
        return frozenset(
            (node, gpu)
            for job_id, nodes in self._jobs.items()
            for node, run in nodes.items()
            if not run.current
            or (job_id, node) in self._stopping
            or (job_id, node) in self._suspending
            for gpu in run.ranks.values()
        )

    def _busy_gpus(self, wanted: Mapping[str, Sequence[pb.RankAssignment]]) -> list[str]:
        """`node:index` of the wanted GPUs that an ending run still holds (lock held)."""
        held = self._ending_holds()
        return sorted(
            f"{node}:{a.gpu_index}"
            for node, assignments in wanted.items()
            for a in assignments
            if (node, a.gpu_index) in held
        )

    def _free_port(self) -> int:
        """A rendezvous port no live job launched by this dispatcher holds, nor, while
        there are others, has held (lock held)."""
        ports = range(self._ports.low, self._ports.high + 1)
        held = set().union(*self._job_ports.values())
        current = {job_ports[-1] for job_ports in self._job_ports.values()}
        candidates = [port for port in ports if port not in held] or [
            port for port in ports if port not in current
        ]
        if not candidates:
            raise RuntimeError(f"all rendezvous ports {self._ports} are taken")
        # Random, not lowest: a port a crashed job left in TIME_WAIT is unlikely to recur.
        return random.choice(candidates)


def _shrunk_from(held: Mapping[int, int], ranks: Mapping[int, int]) -> bool:
    """Whether `ranks` (rank -> GPU index) is what an in-place shrink leaves of `held`
    (all of it: a rebatch)."""
    return (
        bool(ranks)
        and sorted(ranks) == list(range(len(ranks)))
        and ranks.get(0) == held.get(0)
        and set(ranks.values()) <= set(held.values())
    )


def _assignments(ranks: Mapping[int, int]) -> list[pb.RankAssignment]:
    return [pb.RankAssignment(rank=rank, gpu_index=index) for rank, index in ranks.items()]


def _shrunk_report(node: str, message: pb.JobShrunk) -> Report:
    ranks = sorted((a.rank, a.gpu_index) for a in message.ranks)
    return Report(
        job_id=message.job_id,
        iterations_done=message.iteration,
        outcome=RunOutcome.SHRUNK,
        message=f"shrank in place on {node} to {len(ranks)} GPU(s) at {message.iteration}",
        node=node,
        ranks=tuple(index for _, index in ranks),
    )


def _exit_message(node: str, message: pb.JobExit, outcome: RunOutcome) -> str:
    if outcome is RunOutcome.REFUSED:
        return f"launch refused by {node}: {message.error_tail.strip()}"
    if outcome is not RunOutcome.FAILED:
        return f"{outcome.value} on {node} at iteration {message.iteration}"
    tail = message.error_tail.strip()
    return f"failed on {node} (exit code {message.exit_code}): {tail}"


def _refusal(run: Run | None, instance: str) -> str | None:
    """Why a message about a job from `instance` must be dropped, given its run on the
    sender's node; None when the run is current and the sender's."""
    if run is None:
        return NOT_ALLOCATED
    if run.instance != instance:
        return OTHER_AGENT
    if not run.current:
        return STALE_ATTEMPT
    return None


def _stop(job_id: int, reason: str) -> pb.SchedulerMessage:
    return pb.SchedulerMessage(stop=pb.StopCommand(job_id=job_id, reason=reason))
