"""The trial API a job implements. The platform owns the training loop, not the trial.

A trial says what to train (model, data, loss, evaluation); the runtime decides when to
step, checkpoint, suspend or stop, so that it can act at any iteration boundary.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer
from torch.utils.data import Dataset

from jigsaw.jobspec import Hyperparameters


@dataclass(frozen=True)
class TrialContext:
    """What a trial may know about the run it is part of."""

    hyperparameters: Hyperparameters
    rank: int
    world_size: int
    device: torch.device
    seed: int
    # Where a trial may cache downloaded or preprocessed data; None means "don't cache".
    data_dir: Path | None = None
    # Consecutive ranks that split the model into a pipeline (1: no pipeline); the batch
    # is split over the `replicas` of such a pipeline.
    pipeline_stages: int = 1

    @property
    def replicas(self) -> int:
        """Data-parallel copies of the model (each maybe a pipeline of several ranks)."""
        return self.world_size // self.pipeline_stages

    @property
    def replica(self) -> int:
        return self.rank // self.pipeline_stages

    @property
    def per_rank_batch_size(self) -> int:
        # The job spec's batch size is global: data parallelism must not change the
        # optimisation, so each replica takes its share (all stages of a pipeline see
        # the same samples: the first its inputs, the last its targets).
        return max(1, self.hyperparameters.batch_size // self.replicas)


@dataclass(frozen=True)
class PipelineSplit:
    """A model cut for pipeline parallelism."""

    # One module per stage, input side first; they hold the model's own modules, so
    # loading a part's state updates the model.
    parts: list[nn.Module]
    # The loss of a microbatch from the last part's output and the targets.
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class Trial(ABC):
    """Base class of every workload: implement the abstract methods."""

    def __init__(self, context: TrialContext) -> None:
        self.context = context

    @abstractmethod
    def build_model(self) -> nn.Module:
        """A fresh model; the runtime moves it to the device and wraps it for data parallelism."""

    def build_optimizer(self, params: Iterable[nn.Parameter]) -> Optimizer:
        hp = self.context.hyperparameters
        if hp.optimizer == "sgd":
            return torch.optim.SGD(params, lr=hp.learning_rate, momentum=0.9)
        if hp.optimizer == "adam":
            return torch.optim.Adam(params, lr=hp.learning_rate)
        raise ValueError(
            f"optimizer {hp.optimizer!r} preconditions per layer and needs the model: the "
            "runtime builds it (worker_agent.runtime.kfac.KFACSGD), not Trial.build_optimizer"
        )

    @abstractmethod
    def train_data(self) -> Dataset[Any]:
        """A map-style data set; the runtime shards, shuffles and batches it."""

    @abstractmethod
    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        """The training loss of one per-rank batch (already on the trial's device)."""

    @abstractmethod
    def evaluate(self, model: nn.Module) -> dict[str, float]:
        """Metrics of the unwrapped model, e.g. {"accuracy": ..., "loss": ...}."""

    def stages(self, model: nn.Module) -> list[nn.Module]:
        """The model's stages from input to output, for structured partial backprop.

        The default is one stage: the whole model.
        """
        return [model]

    def pipeline(self, model: nn.Module, stages: int) -> PipelineSplit:
        """`model` (on the CPU) cut into `stages` consecutive parts, for jobs whose spec
        asks for a pipeline; the runtime moves each rank's part to its device. Batches of
        such a trial are `(inputs, targets)` pairs of tensors that split along their
        first dimension into microbatches.

        The default: not supported.
        """
        raise NotImplementedError(
            f"{type(self).__name__} does not support pipeline parallelism "
            "(it does not implement Trial.pipeline)"
        )
