"""Backward split into the output-gradient chain (dX) and weight gradients (dW).

During a forward pass `GraphCut` cuts the autograd graph at the output of every call of
a module that owns parameters: the rest of the forward sees a detached leaf instead of
the output. The graph thus falls into pieces, one per such call (plus the loss's own
piece), and backward becomes something a schedule can order piece by piece:

- `backward_input` runs the dX chain from the loss down, one `torch.autograd.grad` per
  piece towards the leaves it reads; weight gradients are never requested, so autograd's
  output masks skip their kernels.
- `backward_weight(piece)` accumulates that piece's weight gradients into `.grad`
  (`torch.autograd.backward(..., inputs=params)`), whenever the schedule wants.

Why cuts instead of one graph with `GradientEdge`s: a weight used in two places (a tied
embedding) is reached from each piece only through that piece's own use, so each piece
adds exactly its share and nothing is counted twice (the upstream W-split trap), and a
custom `autograd.Function` stays correct without knowing about the split: it may compute
its dW in the dX pass too (its `needs_input_grad` is fixed at forward), which is wasted
work, never a wrong gradient. The price is one autograd call per piece, and that an
in-place operation on a cut output is refused by autograd (the built-in workloads have
none).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn


@dataclass(eq=False)
class Piece:
    """The autograd graph of one call of a parameter-owning module (or of the loss)."""

    index: int  # in forward order; the loss's piece is last
    module: nn.Module | None  # None for the loss's piece
    outputs: list[torch.Tensor]  # as autograd computed them
    cut: list[torch.Tensor]  # the detached leaves the rest of the forward read instead
    grads: list[torch.Tensor | None] = field(default_factory=list)  # of `outputs`
    reads: list[torch.Tensor] = field(default_factory=list)  # earlier pieces' cut leaves
    params: list[nn.Parameter] = field(default_factory=list)  # weights this piece uses

    @property
    def has_grad(self) -> bool:
        return any(grad is not None for grad in self.grads)


class GraphCut:
    """Records the pieces of each forward pass of `model` with gradients enabled."""

    def __init__(self, model: nn.Module) -> None:
        self._pieces: list[Piece] = []
        # Which piece a cut leaf belongs to and at which output position.
        self._owner: dict[int, tuple[Piece, int]] = {}
        self._params = {id(p): p for p in model.parameters() if p.requires_grad}
        self._handles = [model.register_forward_pre_hook(self._begin)]
        self._handles += [
            module.register_forward_hook(self._cut_output)
            for module in model.modules()
            if any(True for _ in module.parameters(recurse=False))
        ]

    @property
    def pieces(self) -> list[Piece]:
        return self._pieces

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()

    def _begin(self, module: nn.Module, args: Any) -> None:
        if torch.is_grad_enabled():
            self._pieces, self._owner = [], {}

    def _cut_output(self, module: nn.Module, args: Any, output: Any) -> Any:
        if not torch.is_grad_enabled():
            return None
        single = isinstance(output, torch.Tensor)
        items = [output] if single else list(output) if isinstance(output, tuple) else None
        if items is None or not any(_needs_grad(item) for item in items):
            return None  # not a tensor or tuple of them: the consumer's piece keeps it
        piece = Piece(len(self._pieces), module, [], [])
        replaced = []
        for item in items:
            if _needs_grad(item):
                leaf = item.detach().requires_grad_()
                self._owner[id(leaf)] = (piece, len(piece.outputs))
                piece.outputs.append(item)
                piece.cut.append(leaf)
                replaced.append(leaf)
            else:
                replaced.append(item)
        self._pieces.append(piece)
        return replaced[0] if single else tuple(replaced)

    def collect(self, loss: torch.Tensor) -> list[Piece]:
        """The pieces of the last forward pass and the loss's own, in forward order.

        Each knows the cut leaves it reads and the weights it uses; gradients come with
        `backward_input`.
        """
        top = Piece(len(self._pieces), None, [loss], [], grads=[torch.ones_like(loss)])
        pieces = [*self._pieces, top]
        for piece in pieces:
            piece.reads, piece.params = self._reached(piece.outputs)
            if piece is not top:
                piece.grads = [None] * len(piece.outputs)
        return pieces

    def backward_input(
        self, pieces: list[Piece], after: Callable[[Piece], None] | None = None
    ) -> None:
        """Run the dX chain over `collect`'s pieces, from the loss to the bottom.

        Afterwards every piece holds the gradient of its outputs (`grads`), which is all
        its `backward_weight` needs. `after(piece)` runs as soon as a piece's own dX is
        done, top piece first: where a schedule interleaves a piece's dW.
        """
        for piece in reversed(pieces):
            self._propagate(piece)
            if after is not None:
                after(piece)

    def backward_weight(self, piece: Piece) -> None:
        """Accumulate `piece`'s weight gradients into the parameters' `.grad`."""
        if not piece.params or not piece.has_grad:
            return
        outputs, grads = _with_grad(piece)
        # Graphs are freed with the pieces at the next forward: a node may be shared by
        # two pieces' dX passes, so none may free it early.
        torch.autograd.backward(outputs, grads, inputs=piece.params, retain_graph=True)

    def _propagate(self, piece: Piece) -> None:
        if not piece.reads or not piece.has_grad:
            return
        outputs, grads = _with_grad(piece)
        read_grads = torch.autograd.grad(
            outputs, piece.reads, grads, retain_graph=True, allow_unused=True
        )
        for leaf, grad in zip(piece.reads, read_grads, strict=True):
            if grad is None:
                continue
            owner, position = self._owner[id(leaf)]
            previous = owner.grads[position]
            owner.grads[position] = grad if previous is None else previous + grad

    def _reached(self, roots: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[nn.Parameter]]:
        """The cut leaves and the parameters `roots` depend on, within their piece."""
        reads: list[torch.Tensor] = []
        params: list[nn.Parameter] = []
        seen: set[Any] = set()
        stack = [root.grad_fn for root in roots if root.grad_fn is not None]
        while stack:
            node = stack.pop()
            if node in seen:
                continue
            seen.add(node)
            variable = getattr(node, "variable", None)  # set on AccumulateGrad nodes
            if variable is not None:
                if id(variable) in self._owner:
                    reads.append(variable)
                elif id(variable) in self._params:
                    params.append(self._params[id(variable)])
                continue
            stack.extend(next_node for next_node, _ in node.next_functions if next_node)
        return reads, params


def _needs_grad(item: Any) -> bool:
    return isinstance(item, torch.Tensor) and item.requires_grad


def _with_grad(piece: Piece) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    pairs = [
        (out, grad)
        for out, grad in zip(piece.outputs, piece.grads, strict=True)
        if grad is not None
    ]
    return [out for out, _ in pairs], [grad for _, grad in pairs]
