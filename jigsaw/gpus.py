"""A GPU slot as an agent offers it and the scheduler stores it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Sharing = Literal["time-sliced", "mps"]


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
    # packing policy may place on it. A pair where an agent does not say.
    max_jobs: int = 2

    @property
    def device(self) -> str:
        """The torch device a rank on this slot trains on."""
        return "cpu" if self.virtual else f"cuda:{self.index}"
