"""How the scheduler loop commands workers, and the simulated workers used until agents land.

The loop only speaks this interface: it launches, stops and suspends jobs, and each round
polls for `Report`s, the same shape the gRPC worker agents will send.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol


@dataclass(frozen=True)
class Worker:
    """Where one rank of a job runs."""

    rank: int
    gpu_id: int
    node_id: int
    node_name: str
    gpu_index: int


@dataclass(frozen=True)
class Launch:
    job_id: int
    spec: dict[str, Any]
    workers: tuple[Worker, ...]  # ordered by rank
    spb: dict[str, Any]
    start_iteration: int  # resume point (the job's last reported iteration)
    lease_iterations: int


@dataclass(frozen=True)
class Report:
    """A job's progress, or its end when `finished` (success) or `failed` is set."""

    job_id: int
    iterations_done: int
    finished: bool = False
    failed: bool = False
    message: str = ""


class Dispatcher(Protocol):
    def launch(self, launch: Launch) -> bool:
        """Start the job's workers; True when the workers acknowledged the start."""
        ...

    def stop(self, job_id: int) -> None: ...

    def suspend(self, job_id: int) -> None: ...

    def poll(self, now: datetime) -> list[Report]:
        """Reports received since the previous poll."""
        ...


@dataclass(frozen=True)
class Command:
    kind: Literal["launch", "stop", "suspend"]
    job_id: int


@dataclass
class _SimulatedRun:
    target: int
    iterations: float
    since: datetime | None  # None until the first poll gives the run a clock


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
    _clock: datetime | None = field(default=None, init=False, repr=False)

    def launch(self, launch: Launch) -> bool:
        self.commands.append(Command("launch", launch.job_id))
        target = launch.spec.get("max_iterations") or self.default_iterations
        # The loop launches right after polling, so the last poll time is the start time.
        self._runs[launch.job_id] = _SimulatedRun(target, launch.start_iteration, self._clock)
        return True

    def stop(self, job_id: int) -> None:
        self.commands.append(Command("stop", job_id))
        self._runs.pop(job_id, None)

    def suspend(self, job_id: int) -> None:
        self.commands.append(Command("suspend", job_id))
        self._runs.pop(job_id, None)

    def poll(self, now: datetime) -> list[Report]:
        self._clock = now
        reports = []
        for job_id, run in list(self._runs.items()):
            if run.since is not None:
                elapsed = max((now - run.since).total_seconds(), 0.0)
                run.iterations = min(
                    run.iterations + elapsed * self.iterations_per_second, run.target
                )
            run.since = now
            finished = run.iterations >= run.target
            reports.append(Report(job_id, int(run.iterations), finished=finished))
            if finished:
                del self._runs[job_id]
        return reports

    def running(self) -> frozenset[int]:
        return frozenset(self._runs)
