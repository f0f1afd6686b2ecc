"""Digits: scikit-learn's bundled 8x8 handwritten digits (1,797 images, offline)."""

from __future__ import annotations

import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn

from worker_agent.runtime.trial import TrialContext
from worker_agent.runtime.workloads.common import TensorClassificationTrial

_TEST_FRACTION = 0.2
# Pixels are counts 0..16; scaling to [0, 1] lets the default learning rates work.
_PIXEL_MAX = 16.0


class _DigitsTrial(TensorClassificationTrial):
    def __init__(self, context: TrialContext) -> None:
        super().__init__(context)
        digits = load_digits()
        # The split depends on the seed only, so every rank (and every resume) agrees.
        train_x, test_x, train_y, test_y = train_test_split(
            digits.data / _PIXEL_MAX,
            digits.target,
            test_size=_TEST_FRACTION,
            random_state=context.seed,
            stratify=digits.target,
        )
        self.train_inputs = torch.tensor(train_x, dtype=torch.float32)
        self.train_targets = torch.tensor(train_y, dtype=torch.long)
        self.test_inputs = torch.tensor(test_x, dtype=torch.float32)
        self.test_targets = torch.tensor(test_y, dtype=torch.long)


class DigitsMLP(_DigitsTrial):
    """A one-hidden-layer perceptron; dropout makes the trajectory depend on RNG state."""

    def build_model(self) -> nn.Module:
        return nn.Sequential(
            nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Dropout(0.1)),
            nn.Linear(128, 10),
        )


class DigitsCNN(_DigitsTrial):
    """Two 3x3 convolutions and a linear classifier."""

    def build_model(self) -> nn.Module:
        return nn.Sequential(
            nn.Sequential(
                nn.Unflatten(1, (1, 8, 8)),
                nn.Conv2d(1, 16, 3, padding=1),
                nn.ReLU(),
                nn.Conv2d(16, 32, 3, padding=1),
                nn.ReLU(),
                nn.MaxPool2d(2),
            ),
            nn.Sequential(nn.Flatten(), nn.Linear(32 * 4 * 4, 10)),
        )
