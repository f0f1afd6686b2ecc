"""The memory cap of a rank that may share its GPU slot with other jobs.

On CUDA torch's caching allocator enforces it (`set_per_process_memory_fraction`): an
allocation past it raises OutOfMemoryError in this process only. A virtual (CPU) slot
has no allocator to ask, so the process's peak resident memory is checked after every
step. Either way the rank ends with "memory cap exceeded", and the jobs beside it on
the slot go on.
"""

from __future__ import annotations

import contextlib
import resource
from collections.abc import Iterator

import torch


class MemoryCapExceeded(RuntimeError):
    """This rank used more memory than its share of the slot."""


class MemoryCap:
    def __init__(self, device: torch.device, cap_bytes: int | None) -> None:
        """Applies the cap at once on CUDA (before anything is allocated there)."""
        self._device = device
        self._cap = cap_bytes
        if cap_bytes is not None and device.type == "cuda":
            total = torch.cuda.get_device_properties(device).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, cap_bytes / total), device)

    @contextlib.contextmanager
    def guard(self) -> Iterator[None]:
        """Around a step: CUDA's refusal to allocate past the cap, and a CPU process
        whose resident memory went past it, become MemoryCapExceeded."""
        if self._cap is None:
            yield
            return
        try:
            yield
        except torch.OutOfMemoryError as exc:
            raise MemoryCapExceeded(
                f"memory cap exceeded: this job's cap on {self._device} is "
                f"{_mib(self._cap)} ({exc})"
            ) from exc
        if self._device.type == "cpu":
            # Linux reports ru_maxrss in KiB.
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
            if peak > self._cap:
                raise MemoryCapExceeded(
                    f"memory cap exceeded: peak resident memory {_mib(peak)} is over this "
                    f"job's cap of {_mib(self._cap)} on its GPU slot"
                )


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.0f} MiB"
