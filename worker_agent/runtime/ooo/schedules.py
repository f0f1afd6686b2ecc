"""Out-of-order backward schedules: the weight-gradient work reordered after the dX
chain. `schedules.ooo` drives them in the training loop; benchmarks and tests drive
them directly, like any `BackpropSchedule` (they defer updates into the next forward,
which is why nothing else may touch gradients or the optimizer).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.optim import Optimizer

from worker_agent.runtime.kfac import KFACSGD
from worker_agent.runtime.ooo.reverse_first_k import ReverseFirstK
from worker_agent.runtime.ooo.split import GraphCut, OutputGradientSink
from worker_agent.runtime.schedules.standard import StandardBackprop


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


def kfac_hooks(
    optimizer: Optimizer,
) -> tuple[OutputGradientSink | None, Callable[[], None] | None]:
    """With K-FAC, its G factors come from the split backward, and reverse first-k
    updates every layer in one K-FAC step once all exchanges are in (`reverse_first_k`'s
    doc says why): the output-gradient sink and the whole step's gradient-free part.
    None for another optimizer."""
    if isinstance(optimizer, KFACSGD):
        return (
            optimizer.preconditioner.output_gradients_from_schedule(),
            optimizer.preconditioner.prepare,
        )
    return None, None


def out_of_order(
    model: nn.Module, optimizer: Optimizer, first_k: int | None = None
) -> DeferredWeightBackprop | ReverseFirstK:
    """`backprop: ooo`: reverse first-k over the default group, or one device's schedule.

    With K-FAC the parameters are standard K-FAC's (`kfac_hooks`).
    """
    gradients, whole_step = kfac_hooks(optimizer)
    if dist.is_initialized() and dist.get_world_size() > 1:
        return ReverseFirstK(
            model, optimizer, first_k, output_gradients=gradients, whole_step=whole_step
        )
    return DeferredWeightBackprop(model, optimizer, gradients)
