"""The worker <-> node-agent wire protocol, in one place. Imports no torch.

Transport: `multiprocessing.connection` (pickled dicts, HMAC-authenticated with the
agent's authkey). The agent holds the Listener; every worker process connects once and
sends messages in this order:

pooled workers only (started with `--pool`, before they know their job)
    worker -> agent  {"type": "idle", "pid": int}           once torch etc. are imported
    agent -> worker  {"type": "assign", "config": WorkerConfig as JSON-able dict}
    (the agent closing the connection instead means: not needed, exit 0)
    Then, on the same connection, exactly what a worker started with `--config` sends.

worker -> agent
    {"type": "hello", "job_id": int, "rank": int, "pid": int}               first, once
    {"type": "check", "iteration": int}                 rank 0 only, once; agent replies
    {"type": "report", "records": [IterationRecord as dict, ...]}          rank 0 only
    {"type": "evaluation", "iteration": int, "metrics": {str: float}}      rank 0 only
    {"type": "profile", "workload": str, "profile": SPBProfile as JSON}   rank 0, at most once
    {"type": "shrunk", "iteration": int}    every rank, after an in-place shrink's checkpoint
    {"type": "exit", "status": Outcome value, "iteration": int,
     "error_tail": str | None}                                         last, once
agent -> worker (rank 0 only: the reply to "check", then every change, unasked)
    {"action": "continue" | "suspend" | "stop" | "shrink", "config_version": int,
     "config": dict, "lease_until": int, "memory_bytes": int}
agent -> worker (the reply to "shrunk")
    {"type": "assign", "config": WorkerConfig as JSON-able dict}   this rank goes on so
    {"type": "leave"}                                                  this rank exits (5)

An in-place shrink: at the boundary of a "shrink" decision every rank checkpoints, leaves
the process group and says "shrunk"; a rank that is assigned a place in the smaller gang
forms its group and resumes from that checkpoint in the same process (on the same GPU,
its rank renumbered), the others exit. After "shrunk", a message without "type" is a
decision meant for the run that ended, and is ignored.

`iteration` is always a boundary: the number of iterations completed. The job's decision
holds until the agent sends another; rank 0 reads what arrived at every boundary, so a
command takes effect at the first boundary after it reaches the worker, and a boundary
costs no round trip to the agent. `lease_until` is the runtime's own (`Decision` also
tells the training loop's ranks how long they may go without agreeing); the agent sends
0. `config` changes only together with `config_version`. `memory_bytes` is each rank's
memory cap as the scheduler last lowered it (0: the launch's).

Log lines travel separately: the agent reads every worker's stdout and stderr.

Process exit codes are in `EXIT_CODES`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any


class Action(StrEnum):
    CONTINUE = "continue"
    SUSPEND = "suspend"  # checkpoint, then exit; the job resumes later, maybe elsewhere
    STOP = "stop"  # exit now without a checkpoint
    SHRINK = "shrink"  # checkpoint, then go on in a smaller gang or exit (in place)


class Outcome(StrEnum):
    SUCCEEDED = "succeeded"  # max_iterations or the target metric reached
    SUSPENDED = "suspended"
    STOPPED = "stopped"
    FAILED = "failed"
    # Never started: no room on a GPU slot. The agent's only (no worker exits so): the
    # scheduler queues the job again.
    REFUSED = "refused"
    # Checkpointed for an in-place shrink: the run goes on in a smaller gang (the
    # training loop's only: a process never exits so).
    SHRUNK = "shrunk"
    # Dropped by an in-place shrink: this rank's process exits, the job goes on.
    LEFT = "left"


# The worker process's exit code for each outcome.
EXIT_CODES: dict[Outcome, int] = {
    Outcome.SUCCEEDED: 0,
    Outcome.FAILED: 1,
    Outcome.SUSPENDED: 3,
    Outcome.STOPPED: 4,
    Outcome.LEFT: 5,
}


@dataclass(frozen=True)
class Decision:
    action: Action = Action.CONTINUE
    config_version: int = 0
    config: dict[str, Any] = field(default_factory=dict)
    lease_until: int = 0
    memory_bytes: int = 0  # each rank's lowered memory cap (0: the launch's)

    def to_message(self) -> dict[str, Any]:
        return {**asdict(self), "action": self.action.value}

    @classmethod
    def from_message(cls, message: dict[str, Any]) -> Decision:
        return cls(
            action=Action(message["action"]),
            config_version=int(message["config_version"]),
            config=dict(message["config"]),
            lease_until=int(message["lease_until"]),
            memory_bytes=int(message.get("memory_bytes", 0)),
        )


@dataclass(frozen=True)
class IterationRecord:
    """One training iteration as rank 0 saw it; fields match `iteration_metrics`."""

    iteration: int
    step_seconds: float
    compute_seconds: float
    comm_seconds: float
    samples_per_second: float
    loss: float
    utilization: float | None
    peak_memory_bytes: int
    bytes_communicated: int
    # Mean backprop depth over the workers as a fraction of the stages (1 = full);
    # None for a job that runs plain DDP.
    spb_depth: float | None = None
    # The step's global batch and learning rate, and the gradient noise at the job's base
    # batch (`jigsaw.gradnoise`) once measured (elastic and adaptive-batch jobs).
    batch_size: int = 0
    learning_rate: float = 0.0
    grad_sqr: float | None = None
    grad_var: float | None = None
    # Whether `utilization` is this process's own (NVML per process, CPU time) rather
    # than its whole device's, which says nothing of the job while others share it.
    utilization_per_process: bool = False
    # Other jobs on the rank's GPU during these iterations: the agent's to fill.
    co_runners: int = 0
    # The job's world size during the step (an elastic job's changes with each resize).
    workers: int = 0
    # Steps of the base batch done after this one (`WorkerConfig.max_iterations` counts
    # these): the iteration, unless the batch is adaptive (AdaScale's gain a step).
    progress: float | None = None

    def to_message(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ExitStatus:
    outcome: Outcome
    iteration: int
    metrics: dict[str, float] = field(default_factory=dict)
    config_version: int = 0
    error_tail: str | None = None

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.outcome]


def idle_message(pid: int) -> dict[str, Any]:
    return {"type": "idle", "pid": pid}


def assign_message(config: dict[str, Any]) -> dict[str, Any]:
    """`config` is `WorkerConfig.model_dump(mode="json")`: the wire carries no pydantic."""
    return {"type": "assign", "config": config}


def assigned_config(message: dict[str, Any]) -> dict[str, Any]:
    """The configuration of an "assign" message, or a ValueError for anything else."""
    if message.get("type") != "assign" or not isinstance(message.get("config"), dict):
        raise ValueError(f"expected an assign message, got {message!r}")
    config: dict[str, Any] = message["config"]
    return config


def shrunk_message(iteration: int) -> dict[str, Any]:
    return {"type": "shrunk", "iteration": iteration}


LEAVE_MESSAGE: dict[str, Any] = {"type": "leave"}


def parse_address(address: str) -> tuple[str, int] | str:
    """`host:port` is a TCP address; anything else is a Unix socket path."""
    host, sep, port = address.rpartition(":")
    if sep and host and port.isdigit():
        return host, int(port)
    return address
