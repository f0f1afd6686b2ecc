"""A GPU slot as an agent offers it and the scheduler stores it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuSlot:
    index: int
    kind: str
    memory_bytes: int
    virtual: bool  # a CPU process standing in for a GPU (gloo, no CUDA)

    @property
    def device(self) -> str:
        """The torch device a rank on this slot trains on."""
        return "cpu" if self.virtual else f"cuda:{self.index}"
