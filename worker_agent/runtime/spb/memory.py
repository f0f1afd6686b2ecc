"""What a training step holds in memory: autograd's saved activations per stage, and the
device memory in use at the step's peak.

`SavedActivations` counts, with `torch.autograd.graph.saved_tensors_hooks`, the tensors
autograd keeps for backward, attributed to the stage whose module was running: the
check that the stages below a worker's cut save nothing, and the activation bytes of
the profiler. Parameters (which autograd also saves, but which exist anyway) are not
counted, and a storage saved by several operations counts once.

`forward_peak_bytes` measures, around one forward pass, how much more memory is in use
at its end (when the saved activations peak: backward frees them) than before it: the
CUDA allocator's figures on a GPU, glibc's heap statistics (`mallinfo2`) for CPU tensors.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections import defaultdict
from collections.abc import Callable
from functools import cache
from typing import Any

import torch
from torch import nn

from worker_agent.runtime.spb.stages import Stages
from worker_agent.runtime.spb.tracking import RunningStage


class SavedActivations:
    """Use as a context manager around forward passes; `bytes[stage]` after.

    Bytes saved outside every stage (e.g. a loss computed on the model's output) are
    under the key None.
    """

    def __init__(self, stages: Stages, model: nn.Module) -> None:
        self._running = RunningStage(stages)
        self._parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self._seen: set[int] = set()
        self._saving: Any = None
        self.bytes: defaultdict[int | None, int] = defaultdict(int)

    def __enter__(self) -> SavedActivations:
        self._running.__enter__()
        self._saving = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)
        self._saving.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._saving.__exit__(*exc)
        self._running.__exit__(*exc)

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        pointer = storage.data_ptr()
        if pointer not in self._parameters and pointer not in self._seen:
            self._seen.add(pointer)
            self.bytes[self._running.current] += storage.nbytes()
        return tensor


def _unpack(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


class _MallInfo2(ctypes.Structure):
    # glibc's struct mallinfo2 (glibc >= 2.33): every field a size_t.
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


@cache
def _mallinfo2() -> Callable[[], _MallInfo2] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    libc = ctypes.CDLL(name)
    function = getattr(libc, "mallinfo2", None)
    if function is None:
        return None
    function.restype = _MallInfo2
    return function


def heap_in_use_bytes() -> int | None:
    """Bytes the process's malloc heap has handed out (small blocks plus mmapped large
    ones), or None where glibc's mallinfo2 is not available."""
    mallinfo2 = _mallinfo2()
    if mallinfo2 is None:
        return None
    info = mallinfo2()
    return int(info.uordblks + info.hblkhd)


def _in_use_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        return int(torch.cuda.memory_allocated(device))
    in_use = heap_in_use_bytes()
    if in_use is None:
        raise RuntimeError("no way to measure CPU memory here: glibc's mallinfo2 is missing")
    return in_use


def forward_peak_bytes(forward: Callable[[], torch.Tensor], device: torch.device) -> int:
    """Memory in use after `forward()` (which returns the loss, its graph alive) beyond
    what was in use before it: the step's activation peak."""
    before = _in_use_bytes(device)
    loss = forward()
    after = _in_use_bytes(device)
    del loss
    return after - before
