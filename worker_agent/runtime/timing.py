"""Step timing split into compute and exposed communication, and per-step counters.

Communication is measured as DDP exposes it, not as it runs: DDP all-reduces gradient
buckets while backward still computes, so only the tail after the last bucket is
launched (all gradients computed) until backward returns (all buckets reduced) is time
the step spends on communication alone. That tail is `comm_seconds`; the rest of the
step is `compute_seconds`. Bucket launches are observed by a DDP comm hook that wraps
PyTorch's own all-reduce hook, so gradients are reduced exactly as without it; the
first bucket also carries the boundary agreement when one is offered (`boundary`).
"""

# No `from __future__ import annotations`: DDP's register_comm_hook checks the hook's
# annotations at runtime and refuses strings.
import os
import resource
import time
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from worker_agent.runtime.boundary import BoundarySync

Mark = float | torch.cuda.Event


class DeviceClock:
    """Timestamps in the device's order of execution.

    On CUDA the host only queues work, so marks are CUDA events; read them after
    `synchronize()`. On CPU they are host times.
    """

    def __init__(self, device: torch.device) -> None:
        self._cuda = device.type == "cuda"
        self._device = device

    def mark(self) -> Mark:
        if not self._cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def synchronize(self) -> None:
        if self._cuda:
            torch.cuda.synchronize(self._device)

    @staticmethod
    def seconds(start: Mark, end: Mark) -> float:
        if isinstance(start, float) and isinstance(end, float):
            return end - start
        assert isinstance(start, torch.cuda.Event) and isinstance(end, torch.cuda.Event)
        return start.elapsed_time(end) / 1000.0


def ring_allreduce_bytes(nbytes: int, ranks: int) -> int:
    """Bytes each of `ranks` sends in a ring all-reduce of `nbytes`: 2(k-1)/k of it.

    The one accounting of "bytes communicated" (DDP's buckets and SPB's exchange alike),
    so that configurations compare by what crosses the wire, not by buffer sizes.
    """
    return 2 * (ranks - 1) * nbytes // ranks


class CommMeter:
    """DDP comm hook state: the last bucket launch and the wire bytes of one backward pass
    (of the gradients: an agreement riding along is not counted)."""

    def __init__(
        self, clock: DeviceClock, world_size: int, agreement: BoundarySync | None = None
    ) -> None:
        self._clock = clock
        self._world_size = world_size
        self._agreement = agreement
        self.last_launch: Mark | None = None
        self.bytes = 0

    def reset(self) -> None:
        self.last_launch = None
        self.bytes = 0

    @staticmethod
    def hook(meter: "CommMeter", bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        """Register with `DistributedDataParallel.register_comm_hook(meter, CommMeter.hook)`."""
        buffer = bucket.buffer()
        meter.bytes += ring_allreduce_bytes(
            buffer.numel() * buffer.element_size(), meter._world_size
        )
        meter.last_launch = meter._clock.mark()
        # DDP launches bucket 0 first, on every rank, every step: the agreement's seat.
        agreement = meter._agreement
        rider = (
            agreement.board(buffer.dtype) if agreement is not None and bucket.index() == 0 else None
        )
        if rider is None:
            # None: the default process group, as DDP itself would use.
            return default_hooks.allreduce_hook(None, bucket)  # type: ignore[arg-type]
        assert agreement is not None
        # The mean as PyTorch's hook takes it: divide, then sum.
        carried = torch.cat([buffer.div_(meter._world_size), rider])
        future = dist.all_reduce(carried, async_op=True).get_future()
        return future.then(lambda reduced: agreement.alight(reduced.value()[0]))


def peak_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    # Linux reports ru_maxrss in KiB.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class CpuUtilization:
    """Process CPU time over wall time per torch thread, between successive calls.

    Above 1 when threads other than torch's (gloo's) are busy too. Always this process's
    own, also on a slot other jobs share.
    """

    per_process = True

    def __init__(self) -> None:
        self._cpu = time.process_time()
        self._wall = time.perf_counter()

    def sample(self) -> float:
        cpu, wall = time.process_time(), time.perf_counter()
        utilization = (cpu - self._cpu) / max(wall - self._wall, 1e-9) / torch.get_num_threads()
        self._cpu, self._wall = cpu, wall
        return utilization


class CudaUtilization:
    """NVML's utilization of the GPU by this process (`nvmlDeviceGetProcessUtilization`:
    SM busy percent over the samples since the previous call) where the driver gives it,
    else the device's (percent of time any kernel ran), which `per_process` then says is
    not this job's alone. None when NVML (the `pynvml` module) is not available."""

    def __init__(self, device: torch.device) -> None:
        self._device = device
        self._available = True
        self._process = _ProcessUtilization.open(device)
        self.per_process = False

    def sample(self) -> float | None:
        if self._process is not None:
            mine = self._process.sample()
            if mine is not None:
                self.per_process = True
                return mine
        self.per_process = False
        if not self._available:
            return None
        try:
            return torch.cuda.utilization(self._device) / 100.0
        except (ModuleNotFoundError, RuntimeError):
            self._available = False  # no NVML here: stop asking
            return None


class _ProcessUtilization:
    """This process's SM utilization from NVML's per-process samples."""

    def __init__(self, nvml: Any, handle: Any) -> None:
        self._nvml = nvml
        self._handle = handle
        self._since = 0  # NVML's timestamp (microseconds) of the last sample taken

    @classmethod
    def open(cls, device: torch.device) -> "_ProcessUtilization | None":
        try:
            import pynvml  # type: ignore[import-not-found, unused-ignore]

            pynvml.nvmlInit()
            # By UUID: CUDA's device order and NVML's may differ.
            uuid = f"GPU-{torch.cuda.get_device_properties(device).uuid}"
            return cls(pynvml, pynvml.nvmlDeviceGetHandleByUUID(uuid))
        except Exception:  # no NVML, no driver, an old pynvml: the device's figure then
            return None

    def sample(self) -> float | None:
        try:
            samples = self._nvml.nvmlDeviceGetProcessUtilization(self._handle, self._since)
        except Exception:  # not supported by this driver or GPU, or no sample yet
            return None
        mine = [s for s in samples if s.pid == os.getpid() and s.timeStamp > self._since]
        if not mine:
            return None
        self._since = max(s.timeStamp for s in mine)
        return sum(s.smUtil for s in mine) / len(mine) / 100.0


def utilization_meter(device: torch.device) -> CpuUtilization | CudaUtilization:
    return CpuUtilization() if device.type == "cpu" else CudaUtilization(device)
