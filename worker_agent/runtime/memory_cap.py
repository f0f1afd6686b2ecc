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
        self._cap: int | None = None
        if cap_bytes is not None:
            self._apply(cap_bytes)

    def lower(self, cap_bytes: int) -> bool:
        """Lower the cap (the scheduler's, once the job has shown what it needs, so that
        others fit beside it); a cap not below the current one changes nothing. On CUDA
        the allocator's cached blocks are released, so what it holds falls to what is in
        use. Whether it changed."""
        if cap_bytes <= 0 or (self._cap is not None and cap_bytes >= self._cap):
            return False
        self._apply(cap_bytes)
        if self._device.type == "cuda":
            torch.cuda.empty_cache()
        return True

    def _apply(self, cap_bytes: int) -> None:
        self._cap = cap_bytes
        if self._device.type == "cuda":
            total = torch.cuda.get_device_properties(self._device).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, cap_bytes / total), self._device)

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
