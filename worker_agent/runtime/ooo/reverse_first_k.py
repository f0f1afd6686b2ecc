"""Data parallel out-of-order backprop: the reverse first-k schedule.

The dX chain runs from the loss to the bottom. The top layers (all but the first k, in
forward order) compute their weight gradients as the chain passes them, as in standard
backprop; the first k layers compute theirs after the chain, in forward order, so that
layer 0's gradient is the first of them to exist. Each layer's gradient is all-reduced
asynchronously as soon as it is complete, and its optimizer update is applied by a
forward pre-hook right before that layer's forward in the next iteration: iteration t+1
starts as soon as layer 0's exchange is done, while the other exchanges still run.

A layer is a module that owns parameters and is called in the forward pass (its
never-called children's parameters, like MultiheadAttention's out_proj, are its own). A
parameter several layers use is updated before the first of them. Layers are learned
from the first forward pass, so every rank must call the same modules in the same
order, as data parallelism already requires. A module that reads another module's
parameter before that one runs would see it updated under its feet: autograd then
refuses the backward (an in-place modification), it is never silently wrong.

DDP cannot be used underneath: its reducer expects every gradient from one
`backward()` (split backward bypasses it, pytorch#144530), and it buckets in reverse
order. Each layer is therefore exchanged with its own `all_reduce(async_op=True)`.

Structured partial backprop composes through `set_contributors`: a layer of stage s is
averaged over the ranks that train s; the others send zeros and receive that mean.

An optimizer whose update of one layer depends on every layer's gradient cannot update
layer by layer. K-FAC is one (`optimizer: kfac`): its KL clip scales every layer's
preconditioned gradient by one factor computed from all of them, and the first layer
the next forward needs, layer 0, has its G factor produced last by backward. No layer's
K-FAC update is known before every exchange is in, so deferring updates into the next
forward could not start it earlier. With `whole_step`, `step()` runs the optimizer's
gradient-independent work (K-FAC's factor exchange and decompositions) while the layer
exchanges travel, then waits for all of them and steps the optimizer once: the same
update as standard backprop's, with nothing left pending for `flush`, a checkpoint or
an SPB depth change (which changes K-FAC's factor contributors) at the next iteration.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.optim import Optimizer

from worker_agent.runtime.ooo.split import GraphCut, OutputGradientSink, Piece


@dataclass(eq=False)
class Layer:
    """One exchange and one update: the parameters a module brings into the forward."""

    index: int  # forward order
    module: nn.Module
    params: list[nn.Parameter]
    contributors: frozenset[int] | None = None  # None: every rank
    # Per iteration: pieces whose dW is still to come, and the exchange in flight.
    waiting_for: int = 0
    exchange: dist.Work | None = None
    buffer: torch.Tensor | None = None
    applied: int = 0  # updates applied so far (instrumentation for tests and timing)


@dataclass
class _Iteration:
    launch_order: list[Layer]
    launched: int = 0


class ReverseFirstK:
    """The backward schedule of reverse first-k over the default process group."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: Optimizer,
        first_k: int | None = None,
        *,
        output_gradients: OutputGradientSink | None = None,
        whole_step: Callable[[], None] | None = None,
    ) -> None:
        """`whole_step`: None to update each layer before its next forward; else the
        optimizer's work that needs no gradient, and all layers are updated in `step()`
        by one optimizer step (see the module doc)."""
        self._model = model
        self._optimizer = optimizer
        self._first_k = first_k
        self._whole_step = whole_step
        self._rank = dist.get_rank()
        self._world_size = dist.get_world_size()
        self._cut = GraphCut(model, output_gradients)
        self._called: list[nn.Module] = []
        self._layers: list[Layer] | None = None
        self._layer_of_module: dict[nn.Module, Layer] = {}
        self._layer_of_param: dict[int, Layer] = {}
        self._stage_contributors: tuple[list[nn.Module], list[frozenset[int]]] | None = None
        self._first_k_stages: tuple[list[nn.Module], int] | None = None
        # What is trained is fixed now: SPB later freezes a rank's stages below its cut
        # by turning requires_grad off, and every rank must still exchange every layer.
        self._trained = {id(p) for p in model.parameters() if p.requires_grad}
        for module in model.modules():
            module.register_forward_pre_hook(self._before_forward)
        # Same start everywhere, as DDP's constructor does.
        with torch.no_grad():
            for tensor in [*model.parameters(), *model.buffers()]:
                dist.broadcast(tensor, 0)

    @property
    def layers(self) -> list[Layer]:
        if self._layers is None:
            raise RuntimeError("layers are known after the first backward")
        return self._layers

    @property
    def first_k(self) -> int:
        return len(self.layers) if self._first_k is None else min(self._first_k, len(self.layers))

    def first_k_of_stages(self, stages: Sequence[nn.Module], k: int) -> None:
        """From the next backward on, k is the layers of the first `k` stages
        (`choose_first_k` counts stages; layers are known from the first forward)."""
        self._first_k_stages = (list(stages), k)

    def _apply_first_k_stages(self) -> None:
        if self._first_k_stages is None:
            return
        stages, k = self._first_k_stages
        inside = {id(p) for stage in stages[:k] for p in stage.parameters()}
        self._first_k = sum(all(id(p) in inside for p in layer.params) for layer in self.layers)
        self._first_k_stages = None

    def set_contributors(
        self, stages: Sequence[nn.Module], contributors: Sequence[frozenset[int]]
    ) -> None:
        """From the next backward on, average each layer over the ranks that train its
        stage (SPB's `contributors`); the others send zeros and receive that mean."""
        self._stage_contributors = (list(stages), list(contributors))

    def _apply_contributors(self) -> None:
        if self._stage_contributors is None:
            return
        stages, contributors = self._stage_contributors
        stage_of = {id(p): s for s, stage in enumerate(stages) for p in stage.parameters()}
        for layer in self.layers:
            ranks = {contributors[stage_of[id(p)]] for p in layer.params}
            if len(ranks) != 1:
                raise ValueError(f"layer {layer.index} spans stages trained by {ranks}")
            layer.contributors = ranks.pop()
        self._stage_contributors = None

    # -------------------------------------------------------------- the loop's calls

    def zero_grad(self) -> None:
        # Gradients are cleared as each layer's update is applied; a layer's exchange
        # may still be writing its buffer when the next iteration starts.
        pass

    def backward(self, loss: torch.Tensor) -> None:
        layers = self._learn_layers()
        self._apply_contributors()
        self._apply_first_k_stages()
        k = self.first_k
        pieces = self._cut.collect(loss)
        # Every dW a layer waits for is counted before any layer may be launched.
        for layer in layers:
            layer.waiting_for = 0
        layers_of_piece = [self._layers_of(piece) for piece in pieces]
        for piece_layers in layers_of_piece:
            for layer in piece_layers:
                layer.waiting_for += 1
        state = _Iteration([*reversed(layers[k:]), *layers[:k]])

        def first_k(piece: Piece) -> bool:
            owner = self._layer_of_module.get(piece.module) if piece.module else None
            return owner is not None and owner.index < k

        def after_input(piece: Piece) -> None:
            if not first_k(piece):
                self._weight(piece, layers_of_piece[piece.index], state)

        self._cut.backward_input(pieces, after=after_input)
        for piece in pieces:
            if first_k(piece):
                self._weight(piece, layers_of_piece[piece.index], state)
        self._launch_ready(state, force=True)

    def step(self) -> None:
        if self._whole_step is None:
            return  # each layer's update is applied right before its next forward
        self._whole_step()
        layers = [layer for layer in self._layers or [] if layer.exchange is not None]
        for layer in layers:
            self._average(layer)
        self._optimizer.step()
        for layer in layers:
            self._updated(layer)

    def flush(self) -> None:
        for layer in self._layers or []:
            self._apply(layer)

    # -------------------------------------------------------------- internals

    def _layers_of(self, piece: Piece) -> list[Layer]:
        layers = {
            id(layer): layer for p in piece.params if (layer := self._layer_of_param.get(id(p)))
        }
        return list(layers.values())

    def _weight(self, piece: Piece, layers: list[Layer], state: _Iteration) -> None:
        self._cut.backward_weight(piece)
        for layer in layers:
            layer.waiting_for -= 1
        self._launch_ready(state, force=False)

    def _launch_ready(self, state: _Iteration, force: bool) -> None:
        # Every rank launches in the same order (gloo and NCCL match collectives by
        # order); a layer another piece still adds to holds back the ones after it.
        while state.launched < len(state.launch_order):
            layer = state.launch_order[state.launched]
            if layer.waiting_for > 0 and not force:
                return
            self._launch(layer)
            state.launched += 1

    def _launch(self, layer: Layer) -> None:
        if layer.buffer is not None:
            if self._whole_step is not None:
                raise RuntimeError("each backward needs its step() before the next one")
            # The last forward skipped this layer's module: its previous update is still
            # pending. Apply it, keeping the gradient just computed for this exchange.
            current = [p.grad for p in layer.params]
            self._apply(layer)
            for p, grad in zip(layer.params, current, strict=True):
                p.grad = grad
        contributing = layer.contributors is None or self._rank in layer.contributors
        grads = [
            p.grad.reshape(-1) if p.grad is not None and contributing else p.new_zeros(p.numel())
            for p in layer.params
        ]
        layer.buffer = torch.cat(grads)
        layer.exchange = dist.all_reduce(layer.buffer, async_op=True)

    def _apply(self, layer: Layer) -> None:
        if layer.buffer is None or layer.exchange is None:
            return
        self._average(layer)
        _step_only(self._optimizer, layer.params)
        self._updated(layer)

    def _average(self, layer: Layer) -> None:
        """Wait for the layer's exchange; its parameters' `.grad` is then the mean."""
        assert layer.buffer is not None and layer.exchange is not None
        layer.exchange.wait()
        count = self._world_size if layer.contributors is None else len(layer.contributors)
        mean = layer.buffer.div_(count)
        offset = 0
        for p in layer.params:
            p.grad = mean[offset : offset + p.numel()].view_as(p)
            offset += p.numel()

    def _updated(self, layer: Layer) -> None:
        for p in layer.params:
            p.grad = None
        layer.buffer, layer.exchange = None, None
        layer.applied += 1

    def _before_forward(self, module: nn.Module, args: Any) -> None:
        if self._layers is None:
            if any(True for _ in module.parameters(recurse=False)) or module is self._model:
                self._called.append(module)
            return
        layer = self._layer_of_module.get(module)
        if layer is not None:
            self._apply(layer)

    def _learn_layers(self) -> list[Layer]:
        if self._layers is not None:
            return self._layers
        first_calls = list(dict.fromkeys(self._called))  # a module called twice: its first
        called = set(first_calls)
        layers: list[Layer] = []
        seen: set[int] = set()
        for module in first_calls:
            # A parameter belongs to its owner if called, else to the nearest called
            # ancestor, and to the first layer that uses it.
            own: list[nn.Parameter] = []
            for owner in _owners_within(module, called):
                for p in owner.parameters(recurse=False):
                    if id(p) in self._trained and id(p) not in seen:
                        seen.add(id(p))
                        own.append(p)
            if own:
                layers.append(Layer(len(layers), module, own))
        self._layers = layers
        self._layer_of_module = {layer.module: layer for layer in layers}
        self._layer_of_param = {id(p): layer for layer in layers for p in layer.params}
        return layers


def _owners_within(module: nn.Module, called: set[nn.Module]) -> list[nn.Module]:
    """`module` and its descendants reached without passing another called module."""
    owners = [module]
    stack = list(module.children())
    while stack:
        child = stack.pop()
        if child in called:
            continue
        owners.append(child)
        stack.extend(child.children())
    return owners


def _step_only(optimizer: Optimizer, params: list[nn.Parameter]) -> None:
    """`optimizer.step()` for `params` alone.

    PyTorch's optimizers skip parameters without a gradient, so hiding the others'
    gradients for one call updates exactly these with the optimizer's own code and
    state (one optimizer keeps checkpoints as they are; per-layer optimizers would not).
    """
    chosen = {id(p) for p in params}
    hidden = [
        (p, p.grad)
        for group in optimizer.param_groups
        for p in group["params"]
        if id(p) not in chosen and p.grad is not None
    ]
    for p, _ in hidden:
        p.grad = None
    try:
        optimizer.step()
    finally:
        for p, grad in hidden:
            p.grad = grad
