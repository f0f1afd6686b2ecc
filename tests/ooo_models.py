"""Models the out-of-order backprop tests train: built-in networks and the known traps
of weight-gradient splitting (a tied weight, a module called twice, a weight used twice
in one call, a custom Function)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from worker_agent.runtime.workloads.nets import TransformerLM, cifar_resnet

VOCAB, SEQ = 16, 8


class ScaledMatmul(torch.autograd.Function):
    """x @ w * 2 with a hand-written backward that always computes both gradients."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        return x @ weight * 2

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, weight = ctx.saved_tensors
        flat_x, flat_grad = x.reshape(-1, x.shape[-1]), grad.reshape(-1, grad.shape[-1])
        return grad @ weight.T * 2, flat_x.T @ flat_grad * 2


class CustomLinear(nn.Module):
    def __init__(self, features: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(features, features) / features**0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ScaledMatmul.apply(x, self.weight)


class TwiceScaled(nn.Module):
    """Uses its weight twice in one call: the weight hangs off the dX chain twice."""

    def __init__(self, features: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((features,), 1.1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x * self.scale) * self.scale


class TiedLM(nn.Module):
    """Embedding and output layer share one weight; one block is applied twice."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, 12)
        self.block = nn.Linear(12, 12)
        self.custom = CustomLinear(12)
        self.twice = TwiceScaled(12)
        self.norm = nn.LayerNorm(12)
        self.out = nn.Linear(12, VOCAB, bias=False)
        self.out.weight = self.embedding.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embedding(tokens)
        x = x + torch.tanh(self.block(x))
        x = x + torch.tanh(self.block(x))
        return self.out(self.norm(self.twice(self.custom(x))))


def lm_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    inputs, targets = batch
    return F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())


def image_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    inputs, targets = batch
    return F.cross_entropy(model(inputs), targets)


def lm_batch(generator: torch.Generator, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.randint(VOCAB, (size, SEQ + 1), generator=generator)
    return tokens[:, :-1], tokens[:, 1:]


def image_batch(generator: torch.Generator, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(size, 3, 8, 8, generator=generator), torch.randint(
        4, (size,), generator=generator
    )


# name: (model factory, loss, batch factory)
CASES: dict[
    str, tuple[Callable[[], nn.Module], Callable[..., torch.Tensor], Callable[..., Any]]
] = {
    "resnet": (lambda: cifar_resnet((4, 8), 4), image_loss, image_batch),
    "transformer": (lambda: TransformerLM(VOCAB, SEQ, 16, 2, 2), lm_loss, lm_batch),
    "tied-custom": (TiedLM, lm_loss, lm_batch),
}
