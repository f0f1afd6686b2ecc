"""Checkpoints at an iteration boundary: everything needed to continue the same trajectory.

Saved: the model (unwrapped from DDP), the optimizer, the boundary, the data position,
and every rank's RNG states indexed by rank, so that whichever process becomes rank r on
resume continues rank r's random streams. Rank 0 writes atomically (temporary file,
fsync, rename); a reader sees the previous checkpoint or the new one, never a torn file.
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
) -> None:
    """Collective: every rank calls it; returns once the checkpoint is durable."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    rng_states: list[Any] | None = [None] * world_size if rank == 0 else None
    dist.gather_object(rng.capture(), rng_states, dst=0)
    if rank == 0:
        state = {
            "format": _FORMAT,
            "iteration": iteration,
            "epoch": position.epoch,
            "batch": position.batch,
            "world_size": world_size,
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "rng": rng_states,
        }
        _write_atomically(directory / CHECKPOINT_FILE, state)
        logger.info("checkpoint at iteration %d written to %s", iteration, directory)
    # Nobody exits (and lets a successor start) before the file is in place.
    dist.barrier()


def load(directory: Path, *, model: nn.Module, optimizer: Optimizer) -> Resumed | None:
    """Restore this rank from the checkpoint in `directory`, if there is one."""
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
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    rng.restore(state["rng"][dist.get_rank()])
    return Resumed(state["iteration"], DataPosition(state["epoch"], state["batch"]))


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
