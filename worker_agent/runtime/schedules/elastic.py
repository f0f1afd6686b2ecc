"""Data parallelism for elastic and adaptive-batch jobs: the global batch split over
workers and accumulated micro-batches, the gradient noise measured between them.

Each rank's batch arrives whole and runs as `accumulation` micro-batches, every one but
the last under DDP's `no_sync`, each loss divided by their count, so the exchange after
the last one averages the global batch's gradient as one large step would (up to
floating-point order). The noise (`jigsaw.gradnoise.NoiseEstimator`) needs every
micro-batch's own gradient: those that accumulate locally are read as the change in
the accumulated gradient, and the last one inside the comm hook, before its bucket is
averaged (an adaptive batch on one worker always runs two or more: `jigsaw.elastic`).
With adaptive batches the learning rate follows AdaScale's rule and each step counts as
its gain in steps of the base batch (AdaScale's scale-invariant iterations: what the
job's `max_iterations` counts); the noise so far is checkpointed, so a run resumed at
another batch (a resize, a rebatch) goes on from it.
"""

# No `from __future__ import annotations`: DDP's register_comm_hook checks the hook's
# `bucket` annotation at runtime (as in timing.py).
from contextlib import nullcontext
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from jigsaw import elastic
from jigsaw.gradnoise import GradParams, NoiseEstimator, adascale
from worker_agent.runtime.config import WorkerConfig
from worker_agent.runtime.schedules.base import Parts
from worker_agent.runtime.schedules.standard import DataParallel
from worker_agent.runtime.timing import CommMeter

_NO_NOISE = GradParams(0.0, 0.0)  # AdaScale's gain is 1 until the noise is measured


def batch_split(config: WorkerConfig) -> elastic.BatchSplit:
    """How this run trains its global batch (the config's `max_micro_batch` is set)."""
    assert config.max_micro_batch is not None
    batch = config.hyperparameters.batch_size
    if config.base_batch is not None:
        return elastic.nearest_split(batch, config.world_size, config.max_micro_batch)
    return elastic.split(batch, config.world_size, config.max_micro_batch)


class ElasticDataParallel(DataParallel):
    def __init__(self, parts: Parts) -> None:
        self.split = batch_split(parts.config)
        super().__init__(parts)
        config = parts.config
        self._base_lr = config.hyperparameters.learning_rate
        self._base_batch = config.base_batch  # set for an adaptive batch only
        self._gain = 1.0  # AdaScale's, at the rate the optimizer now has
        self.noise = NoiseEstimator(config.base_batch or config.hyperparameters.batch_size)
        # Per step: the sum of this rank's micro-batch gradients' squared norms, and the
        # accumulated gradient before the last micro-batch (None: nothing accumulated).
        self._local_sqr = self._zero()
        self._before_last: dict[torch.Tensor, torch.Tensor] | None = None

    def _register_hook(self, ddp: DistributedDataParallel) -> None:
        ddp.register_comm_hook(self, ElasticDataParallel._hook)

    @staticmethod
    def _hook(
        state: "ElasticDataParallel", bucket: dist.GradBucket
    ) -> torch.futures.Future[torch.Tensor]:
        """The last micro-batch's local gradient, before the exchange averages it."""
        before = state._before_last
        for gradient, parameter in zip(bucket.gradients(), bucket.parameters(), strict=True):
            earlier = before.get(parameter) if before is not None else None
            own = gradient if earlier is None else gradient - earlier
            state._local_sqr += own.detach().double().pow(2).sum()
        return CommMeter.hook(state._comm, bucket)

    def forward_backward(self, batch: Any, agreeing: bool) -> torch.Tensor | None:
        count = self.split.accumulation
        micro_batches = _chunks(batch, count)
        model = self.model
        assert isinstance(model, DistributedDataParallel)
        self._local_sqr = self._zero()
        self._before_last = None
        total = torch.zeros((), device=self._parts.device)
        accumulated: dict[torch.Tensor, torch.Tensor] = {}
        for index, micro_batch in enumerate(micro_batches):
            last = index == count - 1
            with nullcontext() if last else model.no_sync():
                loss = self._parts.trial.loss(model, micro_batch) / count
                loss.backward()
            total = total + loss.detach()
            if not last:
                accumulated = self._measure_accumulated(accumulated)
        self._measure_noise(count)
        return total

    def _measure_accumulated(
        self, before: dict[torch.Tensor, torch.Tensor]
    ) -> dict[torch.Tensor, torch.Tensor]:
        """Adds the micro-batch just accumulated to the squared norms; the gradient now."""
        now: dict[torch.Tensor, torch.Tensor] = {
            p: p.grad.detach().clone() for p in self._params() if p.grad is not None
        }
        for parameter, gradient in now.items():
            own = gradient - before[parameter] if parameter in before else gradient
            self._local_sqr += own.double().pow(2).sum()
        self._before_last = now
        return now

    def gradient_noise(self) -> GradParams | None:
        return self.noise.params

    def state(self) -> dict[str, Any] | None:
        return {"noise": self.noise.state()}

    def restore(self, state: dict[str, Any]) -> None:
        """The noise measured before the checkpoint, and an adaptive batch's learning
        rate from it at once (the optimizer's restored rate is the old batch's)."""
        if "noise" in state:
            self.noise.restore(state["noise"])
            self._adapt_learning_rate()

    def _measure_noise(self, count: int) -> None:
        """One step's noise from every rank's micro-batches (`count` each), then the
        learning rate an adaptive batch takes from it."""
        gradients = count * self._parts.config.world_size
        if gradients < 2:
            return
        local = self._local_sqr
        dist.all_reduce(local)
        # Losses were divided by `count`: each micro-batch's gradient read is 1/count of
        # its own, and their sum, then average over ranks, is the step's mean gradient.
        scale = float(count) ** 2
        grads = [
            p.grad.detach().double().pow(2).sum() for p in self._params() if p.grad is not None
        ]
        total_sqr = float(torch.stack(grads).sum()) if grads else 0.0
        self.noise.update(
            local_sqr=float(local) * scale / gradients,
            total_sqr=total_sqr,
            count=gradients,
            micro_batch=self.split.micro_batch,
        )
        self._adapt_learning_rate()

    def _adapt_learning_rate(self) -> None:
        """An adaptive batch's learning rate by AdaScale's rule, from the noise so far,
        and the gain its next step counts as."""
        if self._base_batch is not None:
            noise = self.noise.params or _NO_NOISE
            step = adascale(self._base_lr, self._base_batch, self.split.global_batch, noise)
            self._gain = step.gain
            for group in self._parts.optimizer.param_groups:
                group["lr"] = step.lr

    def step_progress(self) -> float:
        return self._gain

    @property
    def learning_rate(self) -> float:
        return float(self._parts.optimizer.param_groups[0]["lr"])

    def _zero(self) -> torch.Tensor:
        # On the device: squared norms add up there, read once per step.
        return torch.zeros((), dtype=torch.float64, device=self._parts.device)

    def _params(self) -> list[nn.Parameter]:
        return [p for p in self._parts.trained.parameters() if p.requires_grad]


def _chunks(batch: Any, count: int) -> list[Any]:
    """`batch` (tensors, or tuples, lists and dicts of them) as `count` equal parts."""
    if count == 1:
        return [batch]
    if isinstance(batch, torch.Tensor):
        size = batch.shape[0]
        if size % count:
            raise ValueError(f"a batch of {size} does not split into {count} micro-batches")
        return list(batch.split(size // count))
    if isinstance(batch, list | tuple):
        parts = [_chunks(item, count) for item in batch]
        return [type(batch)(part[index] for part in parts) for index in range(count)]
    if isinstance(batch, dict):
        split = {key: _chunks(value, count) for key, value in batch.items()}
        return [{key: value[index] for key, value in split.items()} for index in range(count)]
    raise TypeError(f"cannot split a batch of {type(batch).__name__} into micro-batches")
