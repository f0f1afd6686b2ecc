"""Two interleaved spirals in the plane: a data set no straight line separates."""

from __future__ import annotations

import math

import torch


def spirals(
    count: int, generator: torch.Generator, *, turns: float, noise: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """`count` points, half on each arm, and their arm (0 or 1); each arm winds `turns`
    times, and the points scatter around it with standard deviation `noise`."""
    labels = torch.arange(count) % 2
    radius = torch.rand(count, generator=generator)
    angle = radius * turns * 2 * math.pi + labels * math.pi  # the second arm: turned by pi
    points = torch.stack((radius * torch.cos(angle), radius * torch.sin(angle)), dim=1)
    points += noise * torch.randn(count, 2, generator=generator)
    return points, labels
