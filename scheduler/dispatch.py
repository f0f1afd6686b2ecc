"""How the scheduler loop commands workers: the `Dispatcher` interface and simulated workers.

The loop only speaks this interface: it launches, stops and suspends jobs, and each round
polls for `Report`s. `scheduler.agents.dispatcher` implements it over gRPC worker agents;
`SimulatedDispatcher` pretends, for `jigsaw up --simulate` and the loop's unit tests.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal, Protocol


@dataclass(frozen=True)
class Worker:
    """Where one rank of a job runs."""

    rank: int
    gpu_id: int
    node_id: int
    node_name: str
    gpu_index: int
    node_address: str = ""  # where peers on other nodes reach its node (rendezvous)


@dataclass(frozen=True)
class Launch:
    job_id: int
    spec: dict[str, Any]
    workers: tuple[Worker, ...]  # ordered by rank
    spb: dict[str, Any]
    start_iteration: int  # resume point (the job's last reported iteration)
    lease_iterations: int
    attempt: int  # the placement's number (`jobs.attempts`): the run's fence
    global_batch: int = 0  # an adaptive job's batch, as the policy chose it (0: the spec's)
    # Each rank's memory cap on its GPU, for a GPU it may share; None: the dispatcher
    # derives it from the job's expected peak (`scheduler.models.metrics.expected_memory`).
    memory_bytes: int | None = None


class RunOutcome(StrEnum):
    """What a report says of a job's run on the workers."""

    RUNNING = "running"  # progress only
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # a training process crashed or could not start
    SUSPENDED = "suspended"  # checkpointed and exited, as asked
    STOPPED = "stopped"  # exited as asked, without a checkpoint
    REFUSED = "refused"  # never started: no room on a GPU it would share (requeued)
    SHRUNK = "shrunk"  # shrank in place as asked: the run goes on, on `Report.ranks`


@dataclass(frozen=True)
class Report:
    """A job's progress, or the end of its processes when `outcome` is not RUNNING."""

    job_id: int
    iterations_done: int
    outcome: RunOutcome = RunOutcome.RUNNING
    message: str = ""
    metrics: dict[str, float] = field(default_factory=dict)
    # SHRUNK: the node the run is on, and its GPU indices there by rank now.
    node: str = ""
    ranks: tuple[int, ...] = ()


class Dispatcher(Protocol):
    def launch(self, launch: Launch) -> bool:
        """Start (or resume) the job's workers; True when every node took the command.

        False, or an exception, only when no node was sent anything: the loop then gives
        the launch's attempt back for the next placement.
        """
        ...

    def stop(self, job_id: int, node: str | None = None) -> None:
        """End the job's processes without a checkpoint, on every node or on `node`."""
        ...

    def suspend(self, job_id: int) -> None:
        """Checkpoint at the next iteration boundary, then end the job's processes."""
        ...

    def resize_in_place(self, launch: Launch) -> bool:
        """Resize the running job in place at its next boundary to `launch` (fewer of its
        GPUs on its one node, its rank 0's kept; all of them and more of that node's; or
        all of them at another global batch; the attempt it runs): a SHRUNK report
        follows once the ranks that leave are gone.
        False when it cannot be asked so (the caller resizes the job by a restart); an
        agent that cannot do it suspends it."""
        ...

    def reconfigure(self, job_id: int, config_version: int, spb: dict[str, Any]) -> None:
        """Apply this SPB configuration (`{}` = off) from the job's next boundary on.

        `config_version` is greater than every version this run of the job has seen.
        """
        ...

    def cap(self, job_id: int, memory_bytes: int) -> None:
        """Lower each of the job's ranks' memory cap to `memory_bytes`, counted by its
        agents at once and enforced from the job's next boundary."""
        ...

    def poll(self, now: datetime) -> list[Report]:
        """Reports received since the previous poll."""
        ...

    def active(self) -> dict[int, frozenset[str]]:
        """Jobs whose processes are (believed) alive, with the nodes they run on."""
        ...

    def connected(self) -> frozenset[str]:
        """Nodes whose `active()` entries are first-hand: their agents are connected now."""
        ...

    def unheard(self, nodes: Iterable[str]) -> frozenset[str]:
        """Of `nodes`, those whose agents have not said what they run since this
        dispatcher began (processes there that outlived a scheduler are not in `active`)."""
        ...

    def freeing(self) -> frozenset[tuple[str, int]]:
        """(node, GPU index) still held by the processes of runs told to suspend or stop
        (or strays): the database freed them, a launch there would be refused."""
        ...

    def node_lost(self, node_name: str) -> None:
        """The node's agent was declared dead: whatever ran there is gone or stray."""
        ...


@dataclass(frozen=True)
class Command:
    kind: Literal["launch", "stop", "suspend", "reconfigure", "cap"]
    job_id: int


@dataclass
class _SimulatedRun:
    target: int
    iterations: float
    since: datetime | None  # None until the first poll gives the run a clock
    nodes: frozenset[str]


@dataclass
class SimulatedDispatcher:
    """Pretends every launched job trains at `iterations_per_second` and never crashes.

    Jobs stop at their spec's `max_iterations`; jobs with only a target metric (which a
    simulation cannot evaluate) stop after `default_iterations`.
    """

    iterations_per_second: float
    default_iterations: int = 1000
    commands: list[Command] = field(default_factory=list)
    _runs: dict[int, _SimulatedRun] = field(default_factory=dict, init=False, repr=False)
    # Exits of suspended runs, reported at the next poll as agents report theirs.
    _suspended: list[Report] = field(default_factory=list, init=False, repr=False)
    _clock: datetime | None = field(default=None, init=False, repr=False)

    def launch(self, launch: Launch) -> bool:
        self.commands.append(Command("launch", launch.job_id))
        target = launch.spec.get("max_iterations") or self.default_iterations
        # The loop launches right after polling, so the last poll time is the start time.
        self._runs[launch.job_id] = _SimulatedRun(
            target,
            launch.start_iteration,
            self._clock,
            frozenset(worker.node_name for worker in launch.workers),
        )
        return True

    def stop(self, job_id: int, node: str | None = None) -> None:
        # Simulated gangs live and die whole.
        self.commands.append(Command("stop", job_id))
        self._runs.pop(job_id, None)

    def suspend(self, job_id: int) -> None:
        self.commands.append(Command("suspend", job_id))
        run = self._runs.pop(job_id, None)
        if run is not None:
            self._suspended.append(Report(job_id, int(run.iterations), RunOutcome.SUSPENDED))

    def resize_in_place(self, launch: Launch) -> bool:
        return False  # simulated runs resize by a restart

    def reconfigure(self, job_id: int, config_version: int, spb: dict[str, Any]) -> None:
        # Simulated runs train at one speed whatever their configuration.
        self.commands.append(Command("reconfigure", job_id))

    def cap(self, job_id: int, memory_bytes: int) -> None:
        self.commands.append(Command("cap", job_id))

    def poll(self, now: datetime) -> list[Report]:
        self._clock = now
        reports, self._suspended = self._suspended, []
        for job_id, run in list(self._runs.items()):
            if run.since is not None:
                elapsed = max((now - run.since).total_seconds(), 0.0)
                run.iterations = min(
                    run.iterations + elapsed * self.iterations_per_second, run.target
                )
            run.since = now
            finished = run.iterations >= run.target
            outcome = RunOutcome.SUCCEEDED if finished else RunOutcome.RUNNING
            reports.append(Report(job_id, int(run.iterations), outcome))
            if finished:
                del self._runs[job_id]
        return reports

    def active(self) -> dict[int, frozenset[str]]:
        return {job_id: run.nodes for job_id, run in self._runs.items()}

    def connected(self) -> frozenset[str]:
        # Simulated runs live in this process: `jigsaw up` requeues them at start-up.
        return frozenset()

    def unheard(self, nodes: Iterable[str]) -> frozenset[str]:
        return frozenset()  # its runs live in this process

    def freeing(self) -> frozenset[tuple[str, int]]:
        # A simulated run ends the moment it is told to.
        return frozenset()

    def node_lost(self, node_name: str) -> None:
        # Simulated gangs live and die whole: the loop's stop has removed the run.
        pass
