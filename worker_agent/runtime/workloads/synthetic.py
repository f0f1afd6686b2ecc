"""Synthetic workloads: real architectures on random data, for load and throughput.

Data are a function of the seed only. Their sizes make one CPU iteration take tens of
milliseconds at the default batch size.
"""

from __future__ import annotations

import torch
from torch import nn

from worker_agent.runtime.trial import TrialContext
from worker_agent.runtime.workloads.common import LanguageModelTrial, TensorClassificationTrial
from worker_agent.runtime.workloads.nets import cifar_resnet

_IMAGES = 1024
_TEST_IMAGES = 256
_CLASSES = 10


class ResNetSynthetic(TensorClassificationTrial):
    """A CIFAR-style ResNet on random 3x32x32 images with random labels."""

    def __init__(self, context: TrialContext) -> None:
        super().__init__(context)
        generator = torch.Generator().manual_seed(context.seed)
        total = _IMAGES + _TEST_IMAGES
        images = torch.randn(total, 3, 32, 32, generator=generator)
        labels = torch.randint(_CLASSES, (total,), generator=generator)
        self.train_inputs, self.test_inputs = images[:_IMAGES], images[_IMAGES:]
        self.train_targets, self.test_targets = labels[:_IMAGES], labels[_IMAGES:]

    def build_model(self) -> nn.Module:
        return cifar_resnet((8, 16, 32), _CLASSES)


class TransformerSynthetic(LanguageModelTrial):
    """A transformer language model on uniformly random tokens."""

    vocab_size = 256
    seq_len = 32
    d_model = 64
    n_heads = 4
    n_layers = 2

    def __init__(self, context: TrialContext) -> None:
        super().__init__(context)
        generator = torch.Generator().manual_seed(context.seed)
        self.train_tokens = torch.randint(
            self.vocab_size, (1024 * self.seq_len + 1,), generator=generator
        )
        self.validation_tokens = torch.randint(
            self.vocab_size, (64 * self.seq_len + 1,), generator=generator
        )
