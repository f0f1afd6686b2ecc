"""Two interleaved spirals: a small classifier a user could write, trained by JigSaw.

The points are drawn from the job's seed, so every rank (and every resumed attempt)
builds the same data set without downloading anything. No straight line separates the
two classes; the small network below gets over 95% of held-out points right within a few
hundred steps, in seconds on a CPU.

Run it (the agents must be able to import `my_trial`, so its parent is on PYTHONPATH):

    PYTHONPATH=$PWD/examples jigsaw up --local-agents 2
    jigsaw submit examples/my_trial/spirals.yaml
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from worker_agent.runtime.trial import Trial, TrialContext

TRAIN_POINTS = 2048
TEST_POINTS = 512
TURNS = 1.25  # of each arm
NOISE = 0.03  # standard deviation of the points around their arm


def spirals(count: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """`count` points in the plane, half on each arm, and their arm (0 or 1)."""
    labels = torch.arange(count) % 2
    radius = torch.rand(count, generator=generator)
    angle = radius * TURNS * 2 * math.pi + labels * math.pi  # the second arm: turned by pi
    points = torch.stack((radius * torch.cos(angle), radius * torch.sin(angle)), dim=1)
    points += NOISE * torch.randn(count, 2, generator=generator)
    return points, labels


class TwoSpirals(Trial):
    """Which spiral arm a point lies on, by a three-layer perceptron."""

    def __init__(self, context: TrialContext) -> None:
        super().__init__(context)
        generator = torch.Generator().manual_seed(context.seed)
        self.train_points, self.train_labels = spirals(TRAIN_POINTS, generator)
        self.test_points, self.test_labels = spirals(TEST_POINTS, generator)

    def build_model(self) -> nn.Module:
        # Two stages, so that structured partial backprop (spb) has something to cut.
        return nn.Sequential(
            nn.Sequential(nn.Linear(2, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh()),
            nn.Linear(64, 2),
        )

    def train_data(self) -> Dataset[Any]:
        return TensorDataset(self.train_points, self.train_labels)

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        points, labels = batch
        return F.cross_entropy(model(points), labels)

    @torch.no_grad()
    def evaluate(self, model: nn.Module) -> dict[str, float]:
        points = self.test_points.to(self.context.device)
        labels = self.test_labels.to(self.context.device)
        logits = model(points)
        return {
            "accuracy": (logits.argmax(dim=1) == labels).float().mean().item(),
            "loss": F.cross_entropy(logits, labels).item(),
        }

    def stages(self, model: nn.Module) -> list[nn.Module]:
        return list(model.children())
