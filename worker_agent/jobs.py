"""What the supervisor is told to run and what it tells of its jobs, without a protocol.

`wire` turns the scheduler's commands into a `JobLaunch` and these events into the
messages the agent sends; the supervisor speaks only these types.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from jigsaw.gpus import GpuSlot
from worker_agent.runtime.config import WorkerConfig
from worker_agent.runtime.protocol import IterationRecord, Outcome


@dataclass(frozen=True)
class NodeResources:
    """What of this node a launch's worker configurations are made from."""

    slots: dict[int, GpuSlot]  # by index
    data_dir: Path  # where trials cache their data
    torch_threads: int  # CPU threads per worker


class RunHere(NamedTuple):
    """A job's run on this node, as a Hello tells it."""

    attempt: int
    ranks: dict[int, int]  # rank -> GPU index
    ports: list[int]  # the rendezvous port of each group it formed here, the current last


@dataclass(frozen=True)
class JobLaunch:
    """Start (or resume, from `start_iteration`) this node's ranks of a job's run."""

    job_id: int
    attempt: int  # the run's fence
    start_iteration: int
    config_version: int  # of the SPB configuration in the configurations
    gpus: dict[int, int] = field(default_factory=dict)  # rank -> GPU index
    configs: tuple[WorkerConfig, ...] = ()  # one per rank, in the order of `gpus`
    # The memory each rank may use on its GPU (its share of the slot); 0: the whole slot.
    memory_bytes: int = 0
    # Why this launch cannot be carried out (then there are no configurations): the
    # run fails at once with this reason.
    problem: str | None = None


@dataclass(frozen=True)
class Iterations:
    """Rank 0's iteration records."""

    job_id: int
    records: tuple[IterationRecord, ...]
    # Due at once: the run's last records before an in-place shrink, or its first after.
    urgent: bool = False


@dataclass(frozen=True)
class Evaluated:
    """An evaluation rank 0 ran at a boundary."""

    job_id: int
    iteration: int
    metrics: dict[str, float]


@dataclass(frozen=True)
class LogLine:
    """A line one of the job's processes wrote."""

    job_id: int
    rank: int
    level: str
    message: str


@dataclass(frozen=True)
class Profiled:
    """The model profile rank 0 measured (`jigsaw.spb.SPBProfile` as JSON, as the
    worker sent it: trial code may have forged it)."""

    job_id: int
    workload: str
    device_kind: str  # of the slot it was measured on
    profile: dict[str, Any]


@dataclass(frozen=True)
class JobEnded:
    """All of the job's processes on this node have ended (or never started)."""

    job_id: int
    attempt: int
    outcome: Outcome
    exit_code: int = 0
    iteration: int = 0
    error_tail: str = ""
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Shrunk:
    """The job shrank in place at `iteration`: its run here goes on as `gpus`."""

    job_id: int
    attempt: int
    iteration: int
    gpus: dict[int, int]  # rank -> GPU index, renumbered


JobEvent = Iterations | Evaluated | LogLine | Profiled | Shrunk | JobEnded
