"""Checkpoints at an iteration boundary: everything needed to continue the same trajectory.

Saved: the model (unwrapped from DDP), the optimizer, the boundary, the data position,
and every rank's RNG states indexed by rank, so that whichever process becomes rank r on
resume continues rank r's random streams. A pipeline's ranks each hold another part of
the model: its checkpoint has every rank's model and optimizer state under `stages`,
indexed by rank, instead of rank 0's under `model` and `optimizer`. Rank 0 writes
atomically (temporary file, fsync, rename); a reader sees the previous checkpoint or the
new one, never a torn file (one file, so a pipeline's stages are never from two
checkpoints).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.optim import Optimizer

from worker_agent.runtime import rng
from worker_agent.runtime.sampling import DataPosition

logger = logging.getLogger(__name__)

CHECKPOINT_FILE = "checkpoint.pt"
_FORMAT = 1


@dataclass(frozen=True)
class Resumed:
    iteration: int
    position: DataPosition


def save(
    directory: Path,
    *,
    model: nn.Module,
    optimizer: Optimizer,
    iteration: int,
    position: DataPosition,
    stages: bool = False,
) -> None:
    """Collective: every rank calls it; returns once the checkpoint is durable.

    `stages`: every rank's `model` and `optimizer` are its own (a pipeline stage's).
    """
    rank, world_size = dist.get_rank(), dist.get_world_size()
    # On the CPU: rank 0 must be able to hold (and unpickle) every rank's tensors.
    own = _on_cpu(_trained_state(model, optimizer)) if stages else None
    gathered: list[Any] | None = [None] * world_size if rank == 0 else None
    dist.gather_object((rng.capture(), own), gathered, dst=0)
    if gathered is not None:
        state = {
            "format": _FORMAT,
            "iteration": iteration,
            "epoch": position.epoch,
            "batch": position.batch,
            "world_size": world_size,
            "rng": [rng_state for rng_state, _ in gathered],
        }
        if stages:
            state["stages"] = [stage for _, stage in gathered]
        else:
            state.update(_trained_state(model, optimizer))
        _write_atomically(directory / CHECKPOINT_FILE, state)
        logger.info("checkpoint at iteration %d written to %s", iteration, directory)
    # Nobody exits (and lets a successor start) before the file is in place.
    dist.barrier()


def load(
    directory: Path, *, model: nn.Module, optimizer: Optimizer, stages: bool = False
) -> Resumed | None:
    """Restore this rank from the checkpoint in `directory`, if there is one.

    `stages`: as `save`'s (this rank's model and optimizer are its own stage's).
    """
    path = directory / CHECKPOINT_FILE
    if not path.exists():
        return None
    # On the CPU: RNG states must be CPU tensors; load_state_dict moves the rest.
    state = torch.load(path, map_location="cpu", weights_only=True)
    if state["format"] != _FORMAT:
        raise ValueError(f"{path}: checkpoint format {state['format']}, expected {_FORMAT}")
    world_size = dist.get_world_size()
    if state["world_size"] != world_size:
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
    rng.restore(state["rng"][dist.get_rank()])
    return Resumed(state["iteration"], DataPosition(state["epoch"], state["batch"]))


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
