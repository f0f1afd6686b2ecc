"""Two interleaved spirals: a small classifier a user could write, trained by JigSaw.

The points are drawn from the job's seed, so every rank (and every resumed attempt)
builds the same data set without downloading anything. The network below gets over 95%
of held-out points right within a few hundred steps, in seconds on a CPU; its width and
the data's shape are the spec's `hyperparameters.trial`.

This package is installed on no agent: the job ships it (README, "Writing a trial"):

    jigsaw submit examples/spirals/spirals.yaml --code examples/spirals
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from spirals_trial.data import spirals
from worker_agent.runtime.trial import Trial, TrialContext

TRAIN_POINTS = 2048
TEST_POINTS = 512


class TwoSpirals(Trial):
    """Which spiral arm a point lies on, by a three-layer perceptron."""

    def __init__(self, context: TrialContext) -> None:
        super().__init__(context)
        own = context.hyperparameters.trial
        self.hidden = int(own.get("hidden", 64))
        shape = {"turns": float(own.get("turns", 1.25)), "noise": float(own.get("noise", 0.03))}
        generator = torch.Generator().manual_seed(context.seed)
        self.train_points, self.train_labels = spirals(TRAIN_POINTS, generator, **shape)
        self.test_points, self.test_labels = spirals(TEST_POINTS, generator, **shape)

    def build_model(self) -> nn.Module:
        # Two stages, so that structured partial backprop (spb) has something to cut.
        hidden = self.hidden
        return nn.Sequential(
            nn.Sequential(nn.Linear(2, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh()),
            nn.Linear(hidden, 2),
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
