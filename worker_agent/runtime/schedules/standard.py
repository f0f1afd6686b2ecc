"""Standard backprop: `loss.backward()`, then the optimizer; across ranks, PyTorch's DDP.

DDP all-reduces gradient buckets while backward still computes; its first bucket
carries the boundary agreement, and a comm hook (`timing.CommMeter`) times the tail of
the exchange that backward could not hide.
"""

from __future__ import annotations

import torch
from torch.nn.parallel import DistributedDataParallel
from torch.optim import Optimizer

from worker_agent.runtime.schedules.base import Parts, Stepping
from worker_agent.runtime.timing import CommMeter, Mark


class StandardBackprop:
    """`loss.backward()` then `optimizer.step()` (data parallelism, if any, is DDP's):
    a `BackpropSchedule` for benchmarks and tests, and the steps of `DataParallel`."""

    def __init__(self, optimizer: Optimizer) -> None:
        self._optimizer = optimizer

    def zero_grad(self) -> None:
        self._optimizer.zero_grad()

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self) -> None:
        self._optimizer.step()

    def flush(self) -> None:
        pass


class DataParallel(Stepping):
    """The loop's standard schedule: the model wrapped in DDP, its buckets metered."""

    carries_agreement = True  # in DDP's first bucket

    def __init__(self, parts: Parts) -> None:
        super().__init__(parts, StandardBackprop(parts.optimizer))
        device = parts.device
        self._comm = CommMeter(parts.clock, parts.config.world_size, parts.agreement)
        ddp = DistributedDataParallel(
            parts.model, device_ids=[device.index] if device.type == "cuda" else None
        )
        self._register_hook(ddp)
        self.model = ddp

    def _register_hook(self, ddp: DistributedDataParallel) -> None:
        ddp.register_comm_hook(self._comm, CommMeter.hook)

    def zero_grad(self) -> None:
        self._comm.reset()
        super().zero_grad()

    def communication(self, backward_end: Mark) -> tuple[float, int]:
        """DDP's tail: from its last bucket launch to the end of backward."""
        launch = self._comm.last_launch
        seconds = self._parts.clock.seconds(launch, backward_end) if launch is not None else 0.0
        return seconds, self._comm.bytes
