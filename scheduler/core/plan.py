"""What a policy decides in one round; the loop applies it through the state machine."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Placement:
    """Start (or resume) a job on these GPUs; worker `rank` runs on `gpu_ids[rank]`."""

    job_id: int
    gpu_ids: tuple[int, ...]
    spb: dict[str, Any] = field(default_factory=dict)  # structured partial backprop config
    # An adaptive-batch job's global batch, within its spec's batch.min and batch.max
    # (0: the spec's).
    global_batch: int = 0


@dataclass(frozen=True)
class Reconfigure:
    """Give a running job a new SPB configuration (`{}` = off) at its next boundary."""

    job_id: int
    spb: dict[str, Any]


@dataclass(frozen=True)
class Resize:
    """Move a running elastic job to these GPUs (another count, within its spec's
    `elastic` range) at its next boundary: it checkpoints, and restarts on them from the
    checkpoint with the same global batch (`jigsaw.elastic`) or, for an adaptive batch,
    `global_batch`."""

    job_id: int
    gpu_ids: tuple[int, ...]
    global_batch: int = 0


@dataclass(frozen=True)
class Plan:
    start: tuple[Placement, ...] = ()
    suspend: tuple[int, ...] = ()  # running jobs to pause, releasing their GPUs
    stop: tuple[int, ...] = ()  # jobs the policy gives up on: they fail, releasing their GPUs
    reconfigure: tuple[Reconfigure, ...] = ()  # running jobs that keep their GPUs
    resize: tuple[Resize, ...] = ()  # running elastic jobs that move to another gang
