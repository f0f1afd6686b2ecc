"""Backward schedules the training loop drives: one object owns gradients and updates.

The loop calls `zero_grad`, computes the loss, then `backward(loss)` and `step()`, and
`flush()` wherever parameters must be current (evaluation, checkpoint, the end). The
standard schedule is plain autograd and the optimizer; the out-of-order ones reorder
backward and may defer updates into the next forward, which is why the loop must not
touch gradients or the optimizer itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch
import torch.distributed as dist
from torch import nn
from torch.optim import Optimizer

from worker_agent.runtime.kfac import KFACSGD
from worker_agent.runtime.ooo.reverse_first_k import ReverseFirstK
from worker_agent.runtime.ooo.split import GraphCut, OutputGradientSink


class BackpropSchedule(Protocol):
    def zero_grad(self) -> None: ...

    def backward(self, loss: torch.Tensor) -> None: ...

    def step(self) -> None: ...

    def flush(self) -> None:
        """Apply every deferred update, so that the parameters are this step's."""


class StandardBackprop:
    """`loss.backward()` then `optimizer.step()` (data parallelism, if any, is DDP's)."""

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


class DeferredWeightBackprop(StandardBackprop):
    """Single device: the whole dX chain first, then the weight gradients, top first.

    On a GPU the paper overlaps the deferred dW with the dX chain on a second stream.
    PyTorch's autograd engine runs every backward kernel on the stream of its forward
    op, whatever stream is current when backward is called, so issuing the dW calls
    under another stream would not move them; this schedule therefore only reorders
    (see README, "Out-of-order backprop").
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: Optimizer,
        output_gradients: OutputGradientSink | None = None,
    ) -> None:
        super().__init__(optimizer)
        self._cut = GraphCut(model, output_gradients)

    def backward(self, loss: torch.Tensor) -> None:
        pieces = self._cut.collect(loss)
        self._cut.backward_input(pieces)
        for piece in reversed(pieces):
            self._cut.backward_weight(piece)


def out_of_order(
    model: nn.Module, optimizer: Optimizer, first_k: int | None = None
) -> DeferredWeightBackprop | ReverseFirstK:
    """`backprop: ooo`: reverse first-k over the default group, or one device's schedule.

    With K-FAC, its G factors come from the split backward, and reverse first-k updates
    every layer in one K-FAC step once all exchanges are in (`reverse_first_k`'s doc
    says why); the parameters are standard K-FAC's.
    """
    gradients: OutputGradientSink | None = None
    whole_step: Callable[[], None] | None = None
    if isinstance(optimizer, KFACSGD):
        gradients = optimizer.preconditioner.output_gradients_from_schedule()
        whole_step = optimizer.preconditioner.prepare
    if dist.is_initialized() and dist.get_world_size() > 1:
        return ReverseFirstK(
            model, optimizer, first_k, output_gradients=gradients, whole_step=whole_step
        )
    return DeferredWeightBackprop(model, optimizer, gradients)
