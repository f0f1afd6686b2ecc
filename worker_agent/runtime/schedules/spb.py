"""Structured partial backprop's schedule: backward to this rank's cut, then each
stage's gradient averaged over its contributors only (`spb.partial`), in place of DDP's
all-reduce of everything. The exchange runs after backward; its first bucket, over the
whole world, carries the boundary agreement."""

from __future__ import annotations

import torch
from torch.optim import Optimizer

from worker_agent.runtime.schedules.base import Parts, Stepping
from worker_agent.runtime.spb.partial import PartialBackprop
from worker_agent.runtime.timing import DeviceClock, Mark


class PartialBackpropSteps:
    """Backward to the cut, the per-stage exchange, the update, rank 0's buffers
    (a `BackpropSchedule`)."""

    def __init__(self, partial: PartialBackprop, optimizer: Optimizer, clock: DeviceClock) -> None:
        self._partial = partial
        self._optimizer = optimizer
        self._clock = clock
        # Of the last step: the exchange's start and end marks (read them after the clock
        # synchronizes, as the loop does on rank 0 only) and this rank's wire bytes.
        self.exchange_marks: tuple[Mark, Mark] | None = None
        self.wire_bytes = 0

    def zero_grad(self) -> None:
        self._optimizer.zero_grad()

    def backward(self, loss: torch.Tensor) -> None:
        if loss.requires_grad:  # false only for a rank whose top stage has no parameters
            loss.backward()
        start = self._clock.mark()
        self.wire_bytes = self._partial.synchronize()
        self.exchange_marks = (start, self._clock.mark())

    def step(self) -> None:
        self._optimizer.step()
        self._partial.after_step()

    def flush(self) -> None:
        pass


class PartialBackpropExchange(Stepping):
    carries_agreement = True  # in the exchange's all-contributor bucket

    def __init__(self, parts: Parts) -> None:
        assert parts.partial is not None, "an SPB schedule needs the job's SPB cut"
        self._exchange = PartialBackpropSteps(parts.partial, parts.optimizer, parts.clock)
        super().__init__(parts, self._exchange)

    def communication(self, backward_end: Mark) -> tuple[float, int]:
        """The exchange, which runs after backward: all of it is exposed."""
        marks = self._exchange.exchange_marks
        seconds = self._parts.clock.seconds(*marks) if marks is not None else 0.0
        return seconds, self._exchange.wire_bytes
