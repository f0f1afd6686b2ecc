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

_TEST_IMAGES = 256
_CLASSES = 10


class ResNetSynthetic(TensorClassificationTrial):
    """A small CIFAR-style ResNet on random 3x32x32 images with random labels."""

    images = 1024

    def __init__(self, context: TrialContext) -> None:
        super().__init__(context)
        generator = torch.Generator().manual_seed(context.seed)
        total = self.images + _TEST_IMAGES
        images = torch.randn(total, 3, 32, 32, generator=generator)
        labels = torch.randint(_CLASSES, (total,), generator=generator)
        self.train_inputs, self.test_inputs = images[: self.images], images[self.images :]
        self.train_targets, self.test_targets = labels[: self.images], labels[self.images :]

    def build_model(self) -> nn.Module:
        return cifar_resnet((8, 16, 32), _CLASSES)


class ResNet18Synthetic(ResNetSynthetic):
    """ResNet-18 (CIFAR variant) on random 3x32x32 images: the model the H100
    measurements call ResNet-18-CIFAR, large enough to keep a big GPU busy at large
    batches (measured in bf16: 11-40% of an H100 up to batch 512, 79% at 1024)."""

    images = 4096  # room for batches of a few thousand

    def build_model(self) -> nn.Module:
        return cifar_resnet((64, 128, 256, 512), _CLASSES, blocks=2)


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
