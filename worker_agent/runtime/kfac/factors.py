"""Kronecker factors of Linear and Conv2d layers, captured by hooks during the pass.

For a layer with (bias-augmented) input rows a and output-gradient rows g, K-FAC
approximates the layer's curvature block by kron(G, A) with A = E[a a^T] and
G = E[g g^T] (Martens & Grosse 2015; Conv2d: Grosse & Martens 2016, rows are the
unfolded patches and spatial positions). The conventions here make a factor computed
on a local batch of n samples, averaged over equal local batches, equal the factor of
the global batch: A is the mean over rows; G is n * go^T go, because a mean-reduced
loss hands backward go = dloss_i / n.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.hooks import RemovableHandle

logger = logging.getLogger(__name__)

Supported = nn.Linear | nn.Conv2d


@dataclass
class KFACLayer:
    """One preconditioned layer: its module and where its factors go."""

    name: str
    module: Supported

    @property
    def has_bias(self) -> bool:
        return self.module.bias is not None

    @property
    def a_dim(self) -> int:
        weight = self.module.weight
        return weight[0].numel() + int(self.has_bias)

    @property
    def g_dim(self) -> int:
        return self.module.weight.shape[0]

    def gradient_matrix(self) -> torch.Tensor:
        """The weight (and bias, as the last column) gradient as an out x a_dim matrix."""
        weight = self.module.weight
        if weight.grad is None:
            raise RuntimeError(f"K-FAC layer {self.name} has no gradient after backward")
        grad = weight.grad.reshape(weight.shape[0], -1)
        bias = self.module.bias
        if bias is not None and bias.grad is not None:
            grad = torch.cat([grad, bias.grad.unsqueeze(1)], dim=1)
        return grad

    def set_gradient_matrix(self, matrix: torch.Tensor) -> None:
        weight = self.module.weight
        assert weight.grad is not None
        columns = weight[0].numel()
        weight.grad.copy_(matrix[:, :columns].reshape(weight.shape))
        bias = self.module.bias
        if bias is not None and bias.grad is not None:
            bias.grad.copy_(matrix[:, columns])


def discover_layers(model: nn.Module) -> list[KFACLayer]:
    """The layers K-FAC preconditions, in forward (registration) order.

    Only Linear and Conv2d have a Kronecker-factored curvature here; any other module
    that owns trainable parameters keeps its plain gradient, and says so once.
    """
    # MultiheadAttention hands its output projection's weights to a functional call: that
    # Linear is never called as a module, so no hook would ever see its factors.
    uncalled = {id(m.out_proj) for m in model.modules() if isinstance(m, nn.MultiheadAttention)}
    layers: list[KFACLayer] = []
    for name, module in model.named_modules():
        own = [p for p in module.parameters(recurse=False) if p.requires_grad]
        if isinstance(module, nn.Linear | nn.Conv2d):
            if id(module) in uncalled:
                logger.info(
                    "K-FAC skips %s (a Linear its MultiheadAttention does not call): "
                    "its gradient is used as is",
                    name,
                )
                continue
            if isinstance(module, nn.Conv2d) and module.groups != 1:
                logger.info("K-FAC skips %s (grouped Conv2d): its gradient is used as is", name)
                continue
            if own:
                layers.append(KFACLayer(name or type(module).__name__, module))
        elif own:
            logger.info(
                "K-FAC skips %s (%s): only Linear and Conv2d are preconditioned; "
                "its gradient is used as is",
                name,
                type(module).__name__,
            )
    return layers


def input_rows(module: Supported, inputs: torch.Tensor) -> torch.Tensor:
    """The rows a of A = E[a a^T]: one per sample (and position), bias column of ones."""
    if isinstance(module, nn.Conv2d):
        if isinstance(module.padding, str):
            raise ValueError("K-FAC needs numeric Conv2d padding, not 'same'/'valid'")
        patches = F.unfold(
            inputs,
            module.kernel_size,
            dilation=module.dilation,
            padding=module.padding,
            stride=module.stride,
        )  # (N, C*kh*kw, positions)
        rows = patches.transpose(1, 2).reshape(-1, patches.shape[1])
    else:
        rows = inputs.reshape(-1, inputs.shape[-1])
    if module.bias is not None:
        rows = torch.cat([rows, rows.new_ones(rows.shape[0], 1)], dim=1)
    return rows


def a_factor(module: Supported, inputs: torch.Tensor) -> torch.Tensor:
    rows = input_rows(module, inputs.detach())
    return rows.T @ (rows / rows.shape[0])


def g_factor(module: Supported, grad_output: torch.Tensor) -> torch.Tensor:
    batch = grad_output.shape[0]
    if isinstance(module, nn.Conv2d):
        rows = grad_output.transpose(1, -1).reshape(-1, grad_output.shape[1])
    else:
        rows = grad_output.reshape(-1, grad_output.shape[-1])
    return (rows.T @ rows) * batch


FactorSink = Callable[[KFACLayer, str, torch.Tensor], None]


class FactorHooks:
    """Forward hooks that hand each new factor to `sink(layer, "A" | "G", factor)` the
    moment it exists, so that its exchange can start while the pass goes on.

    A comes from the layer's input in the forward hook; G from a hook on the layer's
    output gradient, registered only where the output requires grad: a stage this worker
    does not backpropagate (structured partial backprop) yields no G.

    Under a backward split into dX and dW (`ooo.split`), a tensor hook on the output
    would run once in the dX chain and again in the dW pass; there the schedule hands in
    each call's output gradient once (`output_gradient`) and no tensor hook is set.
    """

    def __init__(self, layers: list[KFACLayer], sink: FactorSink) -> None:
        self.capturing = False
        # True: G comes from `output_gradient`, called by a split backward.
        self.gradients_from_schedule = False
        self._sink = sink
        self._layer_of: dict[nn.Module, KFACLayer] = {layer.module: layer for layer in layers}
        self._handles: list[RemovableHandle] = [
            layer.module.register_forward_hook(self._forward_hook(layer)) for layer in layers
        ]

    def _forward_hook(self, layer: KFACLayer) -> Callable[..., None]:
        def hook(module: nn.Module, inputs: tuple[Any, ...], output: Any) -> None:
            if not (self.capturing and module.training):
                return
            with torch.no_grad():
                self._sink(layer, "A", a_factor(layer.module, inputs[0]))
            if (
                not self.gradients_from_schedule
                and isinstance(output, torch.Tensor)
                and output.requires_grad
            ):
                output.register_hook(self._gradient_hook(layer))

        return hook

    def output_gradient(self, module: nn.Module, grads: list[torch.Tensor | None]) -> None:
        """A split backward's final gradient of one call's output (`ooo.split`): G, when
        this step captures factors and `module` is a K-FAC layer (Linear and Conv2d have
        one output)."""
        layer = self._layer_of.get(module)
        if layer is None or not (self.capturing and module.training) or grads[0] is None:
            return
        with torch.no_grad():
            self._sink(layer, "G", g_factor(layer.module, grads[0]))

    def _gradient_hook(self, layer: KFACLayer) -> Callable[[torch.Tensor], None]:
        def hook(grad_output: torch.Tensor) -> None:
            with torch.no_grad():
                self._sink(layer, "G", g_factor(layer.module, grad_output))

        return hook

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


def layer_contributors(
    layers: list[KFACLayer],
    stages: list[nn.Module],
    stage_contributors: tuple[frozenset[int], ...],
) -> dict[str, frozenset[int]]:
    """Per K-FAC layer, the workers that train its stage (`jigsaw.spb.contributors`
    gives them per stage), for `KFACPreconditioner.set_contributors`."""
    if len(stages) != len(stage_contributors):
        raise ValueError(f"{len(stages)} stages but {len(stage_contributors)} contributor sets")
    owner = {
        id(module): ranks
        for stage, ranks in zip(stages, stage_contributors, strict=True)
        for module in stage.modules()
    }
    missing = [layer.name for layer in layers if id(layer.module) not in owner]
    if missing:
        raise ValueError(f"K-FAC layers outside every stage: {missing}")
    return {layer.name: owner[id(layer.module)] for layer in layers}
