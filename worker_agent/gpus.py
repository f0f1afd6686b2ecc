"""The GPU slots this node offers: its CUDA devices, or virtual slots backed by CPU processes."""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Literal

from jigsaw.gpus import GpuSlot

VIRTUAL_KIND = "virtual-cpu"
# `auto` without CUDA: one slot per core (one torch thread each by default), but no more
# than this, so a large CPU-only box does not advertise dozens of very slow "GPUs".
MAX_AUTO_VIRTUAL_SLOTS = 4


@dataclass(frozen=True)
class CudaProbe:
    """What torch and NVML say about this node's CUDA, asked in a short-lived child."""

    torch_version: str | None  # None: torch cannot be imported here
    torch_error: str | None  # why not
    cuda_version: str | None  # the CUDA runtime torch was built with (None: a CPU build)
    devices: tuple[tuple[str, int], ...]  # (name, memory in bytes) of each visible device
    nccl_version: str | None  # None: torch.distributed has no NCCL here
    driver_version: str | None  # the NVIDIA driver's, from NVML or /proc; None: no driver
    driver_cuda_version: str | None  # the newest CUDA the driver supports (NVML)


def discover(gpus: Literal["auto"] | int, probe: CudaProbe | None = None) -> list[GpuSlot]:
    """`auto`: the CUDA devices, else min(cores, 4) virtual slots; N: N virtual slots.

    `auto` probes CUDA in a child unless given the `probe_cuda()` already taken."""
    if gpus == "auto":
        devices = (probe or probe_cuda()).devices
        if devices:
            return [
                GpuSlot(index, name, memory, virtual=False)
                for index, (name, memory) in enumerate(devices)
            ]
        return virtual_slots(min(os.cpu_count() or 1, MAX_AUTO_VIRTUAL_SLOTS))
    return virtual_slots(gpus)


def virtual_slots(count: int) -> list[GpuSlot]:
    """`count` CPU slots sharing the machine's memory equally."""
    memory = total_memory_bytes() // count
    return [GpuSlot(index, VIRTUAL_KIND, memory, virtual=True) for index in range(count)]


def total_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not POSIX: memory unknown
        return 0


def probe_cuda() -> CudaProbe:
    """Ask torch (and NVML) about CUDA in a short-lived child process."""
    # Asking torch for device properties initializes CUDA, which would keep a context
    # (hundreds of MB of device memory) in the long-lived agent on every GPU; a short-lived
    # child asks instead, and the agent never imports torch.
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(_probe).result()


def _probe() -> CudaProbe:
    driver, driver_cuda = _driver_versions()
    try:
        import torch
    except ImportError as exc:  # the control plane installs without torch
        return CudaProbe(None, str(exc), None, (), None, driver, driver_cuda)
    import torch.distributed as dist

    devices: tuple[tuple[str, int], ...] = ()
    if torch.cuda.is_available():
        devices = tuple(
            (properties.name, int(properties.total_memory))
            for properties in map(
                torch.cuda.get_device_properties, range(torch.cuda.device_count())
            )
        )
    nccl = None
    if devices and dist.is_available() and dist.is_nccl_available():
        version = torch.cuda.nccl.version()
        nccl = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
    return CudaProbe(
        torch.__version__, None, torch.version.cuda, devices, nccl, driver, driver_cuda
    )


_PROC_DRIVER_VERSION = "/proc/driver/nvidia/version"


def _driver_versions() -> tuple[str | None, str | None]:
    """The NVIDIA driver's version and the newest CUDA it supports: NVML (the `pynvml`
    module, which torch's utilization readings also need), else the kernel module's file."""
    try:
        import pynvml  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        pynvml = None
    if pynvml is not None:
        try:
            pynvml.nvmlInit()
            try:
                driver = pynvml.nvmlSystemGetDriverVersion()
                cuda = int(pynvml.nvmlSystemGetCudaDriverVersion_v2())
            finally:
                pynvml.nvmlShutdown()
            driver = driver.decode() if isinstance(driver, bytes) else str(driver)
            return driver, f"{cuda // 1000}.{cuda % 1000 // 10}"
        except pynvml.NVMLError:  # no driver behind it
            pass
    try:
        with open(_PROC_DRIVER_VERSION) as text:
            # "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 ..."
            for word in text.readline().split():
                if word[:1].isdigit() and "." in word:
                    return word, None
    except OSError:
        pass
    return None, None
