"""A GPU slot as an agent offers it and the scheduler stores it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Sharing = Literal["time-sliced", "mps"]

# Jobs a GPU runs at once where nobody says otherwise: a pair, the case the interference
# fits were measured on (an agent older than its `max_jobs`, the simulator's default).
PAIR = 2


@dataclass(frozen=True)
class GpuSlot:
    index: int
    kind: str
    memory_bytes: int
    virtual: bool  # a CPU process standing in for a GPU (gloo, no CUDA)
    # How co-located jobs' processes share it: driver time slicing, or the CUDA MPS
    # daemon the agent supervises (kernels side by side; another interference fit).
    sharing: Sharing = "time-sliced"
    # Jobs it runs at once (the agent's JIGSAW_AGENT_MAX_JOBS_PER_GPU): the most a
    # packing policy may place on it.
    max_jobs: int = PAIR

    @property
    def device(self) -> str:
        """The torch device a rank on this slot trains on."""
        return "cpu" if self.virtual else f"cuda:{self.index}"
