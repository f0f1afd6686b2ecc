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

A tensor hook on a module's output does not see that output's gradient exactly once:
it runs when the dX pass starts from the output and again when a dW starts from the
output's node (resnet's convolutions count twice). Whoever needs each call's output
gradient once (K-FAC's G factors) takes it from `output_gradients`, called as soon as
the dX chain has completed it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.autograd.graph import GradientEdge, Node

# Called once per call of a parameter-owning module in a backward, with the gradients of
# that call's outputs (None where the loss does not depend on one), once they are final.
OutputGradientSink = Callable[[nn.Module, list[torch.Tensor | None]], None]


@dataclass(eq=False)
class Piece:
    """The autograd graph of one call of a parameter-owning module (or of the loss)."""

    index: int  # in forward order; the loss's piece is last
    module: nn.Module | None  # None for the loss's piece
    outputs: list[torch.Tensor]  # as autograd computed them
    # The detached leaves the rest of the forward read instead (held: `GraphCut` knows
    # them by id, which must not be reused while the piece lives).
    cut: list[torch.Tensor]
    grads: list[torch.Tensor | None] = field(default_factory=list)  # of `outputs`
    reads: list[torch.Tensor] = field(default_factory=list)  # earlier pieces' cut leaves
    params: list[nn.Parameter] = field(default_factory=list)  # weights this piece uses
    # Where dW starts without redoing the dX chain; None: from the outputs (see `_plan`).
    branches: list[_Branch] | None = None

    @property
    def has_grad(self) -> bool:
        return any(grad is not None for grad in self.grads)


@dataclass(eq=False)
class _Branch:
    """Weights hanging off one node of the dX chain (or off an output the chain never
    passes): their gradient needs only that node's incoming gradient, which the dX pass
    computes anyway and a pre-hook keeps (PyTorch's pipelining keeps it the same way)."""

    node: Node
    params: list[nn.Parameter]
    output: torch.Tensor | None = None  # set when the node is an output's own grad_fn
    grads: tuple[torch.Tensor | None, ...] = ()


class GraphCut:
    """Records the pieces of each forward pass of `model` with gradients enabled."""

    def __init__(
        self, model: nn.Module, output_gradients: OutputGradientSink | None = None
    ) -> None:
        self._output_gradients = output_gradients
        self._pieces: list[Piece] = []
        # Which piece a cut leaf belongs to and at which output position.
        self._owner: dict[int, tuple[Piece, int]] = {}
        self._params = {id(p): p for p in model.parameters() if p.requires_grad}
        model.register_forward_pre_hook(self._begin)
        for module in model.modules():
            if any(True for _ in module.parameters(recurse=False)):
                module.register_forward_hook(self._cut_output)

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
        consumers: dict[Node, int] = {}
        for piece in pieces:
            self._plan(piece)
            for branch in piece.branches or []:
                consumers[branch.node] = consumers.get(branch.node, 0) + 1
            if piece is not top:
                piece.grads = [None] * len(piece.outputs)
        for piece in pieces:
            # A node two pieces reach gets a share from each: only a dW from the
            # outputs splits it correctly.
            if any(consumers[branch.node] > 1 for branch in piece.branches or []):
                piece.branches = None
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
            # Every consumer of this piece's outputs comes later in the forward, so its
            # share has been added by now: the gradients are final.
            sink = self._output_gradients
            if sink is not None and piece.module is not None and piece.has_grad:
                sink(piece.module, list(piece.grads))
            self._propagate(piece)
            if after is not None:
                after(piece)

    def backward_weight(self, piece: Piece) -> None:
        """Accumulate `piece`'s weight gradients into the parameters' `.grad`."""
        if not piece.params or not piece.has_grad:
            return
        # Graphs are freed with the pieces at the next forward: a node may be shared by
        # two pieces' dX passes, so none may free it early.
        if piece.branches is None:
            outputs, grads = _with_grad(piece)
            torch.autograd.backward(outputs, grads, inputs=piece.params, retain_graph=True)
            return
        for branch in piece.branches:
            if branch.output is not None:
                index = next(i for i, out in enumerate(piece.outputs) if out is branch.output)
                branch.grads = (piece.grads[index],)
            edges = [
                GradientEdge(branch.node, i) for i, g in enumerate(branch.grads) if g is not None
            ]
            grads = [g for g in branch.grads if g is not None]
            if edges:
                # One call per branch: a call from two branches could reach the lower
                # one's weights through the upper one as well and count them twice.
                torch.autograd.backward(edges, grads, inputs=branch.params, retain_graph=True)
            branch.grads = ()

    def _propagate(self, piece: Piece) -> None:
        if not piece.reads or not piece.has_grad:
            return
        outputs, grads = _with_grad(piece)
        handles = [
            branch.node.register_prehook(functools.partial(_keep, branch))
            for branch in piece.branches or []
            if branch.output is None
        ]
        try:
            read_grads = torch.autograd.grad(
                outputs, piece.reads, grads, retain_graph=True, allow_unused=True
            )
        finally:
            for handle in handles:
                handle.remove()
        for leaf, grad in zip(piece.reads, read_grads, strict=True):
            if grad is None:
                continue
            owner, position = self._owner[id(leaf)]
            previous = owner.grads[position]
            owner.grads[position] = grad if previous is None else previous + grad

    def _plan(self, piece: Piece) -> None:
        """Find the cut leaves and weights `piece` reads, and where its dW can start.

        A node is on the dX chain if a cut leaf is below it. Every weight hangs off the
        chain at some node (its branch) or below an output the chain does not pass. A
        weight found under two branches (used twice within the piece) makes the piece
        fall back to a dW from its outputs, which redoes the chain but counts right.
        """
        below: dict[Node, tuple[bool, frozenset[int]]] = {}  # reaches a read; weight ids
        reads: dict[int, torch.Tensor] = {}
        roots = [out.grad_fn for out in piece.outputs if out.grad_fn is not None]
        stack: list[tuple[Node, bool]] = [(root, False) for root in roots]
        while stack:
            node, expanded = stack.pop()
            if node in below:
                continue
            variable = getattr(node, "variable", None)  # set on AccumulateGrad nodes
            if variable is not None:
                is_read = id(variable) in self._owner
                if is_read:
                    reads[id(variable)] = variable
                weight = id(variable) in self._params and not is_read
                below[node] = (is_read, frozenset([id(variable)]) if weight else frozenset())
                continue
            children = [child for child, _ in node.next_functions if child is not None]
            if not expanded:
                stack.append((node, True))
                stack.extend((child, False) for child in children if child not in below)
                continue
            below[node] = (
                any(below[child][0] for child in children),
                frozenset().union(*(below[child][1] for child in children)),
            )
        piece.reads = list(reads.values())
        piece.params = [
            self._params[i] for i in frozenset().union(*(ids for _, ids in below.values()))
        ]
        branches: list[_Branch] = []
        for out in piece.outputs:
            root = out.grad_fn
            if root is not None and not below[root][0] and below[root][1]:
                branches.append(_Branch(root, self._weights(below[root][1]), output=out))
        for node, (on_chain, _) in below.items():
            if not on_chain or getattr(node, "variable", None) is not None:
                continue
            hanging = [
                below[child][1]
                for child, _ in node.next_functions
                if child is not None and not below[child][0] and below[child][1]
            ]
            if hanging:
                branches.append(_Branch(node, self._weights(frozenset().union(*hanging))))
        counted = sum(len(branch.params) for branch in branches)
        piece.branches = branches if counted == len(piece.params) else None

    def _weights(self, ids: frozenset[int]) -> list[nn.Parameter]:
        return [self._params[i] for i in ids]


def _keep(branch: _Branch, grad_outputs: tuple[torch.Tensor | None, ...]) -> None:
    branch.grads = tuple(grad_outputs)


def _needs_grad(item: Any) -> bool:
    return isinstance(item, torch.Tensor) and item.requires_grad


def _with_grad(piece: Piece) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    pairs = [
        (out, grad)
        for out, grad in zip(piece.outputs, piece.grads, strict=True)
        if grad is not None
    ]
    return [out for out, _ in pairs], [grad for _, grad in pairs]
