"""The GPU slots this node offers: its CUDA devices, or virtual slots backed by CPU processes."""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Literal

from worker_agent.proto.jigsaw.v1 import agent_pb2

VIRTUAL_KIND = "virtual-cpu"
# `auto` without CUDA: one slot per core (one torch thread each by default), but no more
# than this, so a large CPU-only box does not advertise dozens of very slow "GPUs".
MAX_AUTO_VIRTUAL_SLOTS = 4


@dataclass(frozen=True)
class GpuSlot:
    index: int
    kind: str
    memory_bytes: int
    virtual: bool

    @property
    def device(self) -> str:
        """The torch device a rank on this slot trains on."""
        return "cpu" if self.virtual else f"cuda:{self.index}"

    def to_proto(self) -> agent_pb2.Gpu:
        return agent_pb2.Gpu(
            index=self.index, kind=self.kind, memory_bytes=self.memory_bytes, virtual=self.virtual
        )


def discover(gpus: Literal["auto"] | int) -> list[GpuSlot]:
    """`auto`: the CUDA devices, else min(cores, 4) virtual slots; N: N virtual slots."""
    if gpus == "auto":
        cuda = _cuda_devices_in_child()
        if cuda:
            return [
                GpuSlot(index, name, memory, virtual=False)
                for index, (name, memory) in enumerate(cuda)
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


def _cuda_devices_in_child() -> list[tuple[str, int]]:
    # Asking torch for device properties initializes CUDA, which would keep a context
    # (hundreds of MB of device memory) in the long-lived agent on every GPU; a short-lived
    # child asks instead, and the agent never imports torch.
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(_cuda_devices).result()


def _cuda_devices() -> list[tuple[str, int]]:
    import torch

    if not torch.cuda.is_available():
        return []
    return [
        (properties.name, int(properties.total_memory))
        for properties in map(torch.cuda.get_device_properties, range(torch.cuda.device_count()))
    ]
