"""Checkpoints at an iteration boundary: everything needed to continue the same trajectory.

Saved: the model (unwrapped from DDP), the optimizer, the boundary, the data position,
and every rank's RNG states indexed by rank, so that whichever process becomes rank r on
resume continues rank r's random streams. A pipeline's ranks each hold another part of
the model: its checkpoint has every rank's model and optimizer state under `stages`,
indexed by rank, instead of rank 0's under `model` and `optimizer`. Rank 0 writes
atomically (temporary file, fsync, rename); a reader sees the previous checkpoint or the
new one, never a torn file (one file, so a pipeline's stages are never from two
checkpoints).

Fencing: a job has one live run, but a run the scheduler gave up on (its node lost
contact, its agent was duplicated) may still be training somewhere. Each run carries
its attempt, which grows with every placement; `fence` in the directory holds the
newest attempt that has started there. Every rank claims the directory for its attempt
before reading the checkpoint, and rank 0 writes only while no newer attempt has
claimed it, the check and the rename under one file lock: a run that lost the
directory raises `Fenced` on every rank instead of writing, and ends.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import filelock
import torch
import torch.distributed as dist
from torch import nn
from torch.optim import Optimizer

from worker_agent.runtime import rng
from worker_agent.runtime.sampling import DataPosition

logger = logging.getLogger(__name__)

CHECKPOINT_FILE = "checkpoint.pt"
FENCE_FILE = "fence"
_FENCE_LOCK = ".fence.lock"
_FORMAT = 1


class Fenced(RuntimeError):
    """A newer attempt of the job owns the checkpoint directory: this run must end."""

    def __init__(self, directory: Path, attempt: int, owner: int) -> None:
        super().__init__(
            f"attempt {owner} of this job owns {directory}; this run (attempt {attempt}) "
            "is stale and ends without writing"
        )


@dataclass(frozen=True)
class Resumed:
    iteration: int
    position: DataPosition
    schedule: dict[str, Any] | None = None  # the backward schedule's own state
    progress: float | None = None  # base-batch steps done (None: an older checkpoint)


def save(
    directory: Path,
    *,
    model: nn.Module,
    optimizer: Optimizer,
    iteration: int,
    position: DataPosition,
    stages: bool = False,
    attempt: int = 0,
    global_batch: int | None = None,
    schedule: dict[str, Any] | None = None,
    progress: float | None = None,
) -> None:
    """Collective: every rank calls it; returns once the checkpoint is durable.

    `stages`: every rank's `model` and `optimizer` are its own (a pipeline stage's).
    `schedule`: rank 0's backward schedule's own state (the same on every rank).
    `progress`: the base-batch steps the run's steps so far are worth (the loop's).
    Raises Fenced on every rank, having written nothing, when a newer attempt than
    `attempt` has claimed the directory.
    """
    rank, world_size = dist.get_rank(), dist.get_world_size()
    # On the CPU: rank 0 must be able to hold (and unpickle) every rank's tensors.
    own = _on_cpu(_trained_state(model, optimizer)) if stages else None
    gathered: list[Any] | None = [None] * world_size if rank == 0 else None
    dist.gather_object((rng.capture(), own), gathered, dst=0)
    owner = [0]
    if gathered is not None:
        state = {
            "format": _FORMAT,
            "iteration": iteration,
            "epoch": position.epoch,
            "batch": position.batch,
            "world_size": world_size,
            "rng": [rng_state for rng_state, _ in gathered],
        }
        if global_batch is not None:
            state["global_batch"] = global_batch
        if schedule is not None:
            state["schedule"] = schedule
        if progress is not None:
            state["progress"] = progress
        if stages:
            state["stages"] = [stage for _, stage in gathered]
        else:
            state.update(_trained_state(model, optimizer))
        with _fence_lock(directory):
            owner[0] = _owner(directory)
            if owner[0] <= attempt:
                _write_atomically(directory / CHECKPOINT_FILE, state)
                logger.info("checkpoint at iteration %d written to %s", iteration, directory)
    # Nobody exits (and lets a successor start) before the file is in place, and no rank
    # of a fenced run goes on.
    dist.broadcast_object_list(owner, src=0)
    if owner[0] > attempt:
        raise Fenced(directory, attempt, owner[0])


def load(
    directory: Path,
    *,
    model: nn.Module,
    optimizer: Optimizer,
    stages: bool = False,
    attempt: int = 0,
    global_batch: int | None = None,
    resizable: bool = False,
) -> Resumed | None:
    """Claim `directory` for `attempt`, then restore this rank from its checkpoint, if
    there is one.

    `stages`: as `save`'s (this rank's model and optimizer are its own stage's). Raises
    Fenced when a newer attempt has claimed the directory. `resizable`: the run splits
    its global batch itself (an elastic job), so a checkpoint of another world size
    resumes: ranks the checkpoint had keep their random streams, new ranks keep their
    fresh seeds, and the data position, counted in global batches, is converted when
    `global_batch` differs from the checkpoint's (an adaptive batch: to the next whole
    batch, so no sample of the epoch is seen twice).
    """
    claim(directory, attempt)
    path = directory / CHECKPOINT_FILE
    if not path.exists():
        return None
    # On the CPU: RNG states must be CPU tensors; load_state_dict moves the rest.
    state = torch.load(path, map_location="cpu", weights_only=True)
    if state["format"] != _FORMAT:
        raise ValueError(f"{path}: checkpoint format {state['format']}, expected {_FORMAT}")
    world_size = dist.get_world_size()
    if state["world_size"] != world_size and not resizable:
        # Data shards and RNG streams are per rank; another world size is another run.
        raise ValueError(
            f"{path} was written by {state['world_size']} workers, this run has {world_size}"
        )
    if stages != ("stages" in state):
        kinds = {True: "a pipeline", False: "a data-parallel"}
        raise ValueError(
            f"{path} was written by {kinds[not stages]} run, this is {kinds[stages]} one"
        )
    trained = state["stages"][dist.get_rank()] if stages else state
    model.load_state_dict(trained["model"])
    optimizer.load_state_dict(trained["optimizer"])
    if dist.get_rank() < len(state["rng"]):
        rng.restore(state["rng"][dist.get_rank()])
    position = DataPosition(state["epoch"], state["batch"])
    written_batch = state.get("global_batch", global_batch)
    if global_batch is not None and written_batch != global_batch:
        position = DataPosition(position.epoch, -(-position.batch * written_batch // global_batch))
    return Resumed(state["iteration"], position, state.get("schedule"), state.get("progress"))


def claim(directory: Path, attempt: int) -> None:
    """Make `attempt` the directory's owner unless a newer one is (then raise Fenced).

    From the first claim of a run on, no older run writes here, so every rank of the
    run reads the same checkpoint, whichever claims first.
    """
    with _fence_lock(directory):
        owner = _owner(directory)
        if owner > attempt:
            raise Fenced(directory, attempt, owner)
        if owner < attempt:
            temporary = directory / f".{FENCE_FILE}.{os.getpid()}.tmp"
            temporary.write_text(f"{attempt}\n")
            os.replace(temporary, directory / FENCE_FILE)


def fenced(directory: Path, attempt: int) -> bool:
    """Whether a newer attempt than `attempt` has claimed the directory (no lock: the
    fence only grows, and writes check it again under the lock)."""
    return _owner(directory) > attempt


@contextmanager
def _fence_lock(directory: Path) -> Iterator[None]:
    directory.mkdir(parents=True, exist_ok=True)
    with filelock.FileLock(str(directory / _FENCE_LOCK)):
        yield


def _owner(directory: Path) -> int:
    """The newest attempt that claimed the directory; 0 when none did."""
    try:
        return int((directory / FENCE_FILE).read_text().strip() or 0)
    except FileNotFoundError:
        return 0


def _trained_state(model: nn.Module, optimizer: Optimizer) -> dict[str, Any]:
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict()}


def _on_cpu(value: Any) -> Any:
    """`value` (nested dicts, lists, tuples of tensors and plain values) on the CPU."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {key: _on_cpu(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_on_cpu(item) for item in value)
    return value


def _write_atomically(path: Path, state: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with temporary.open("wb") as file:
        torch.save(state, file)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)
    # The rename itself is durable only once the directory entry is.
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
