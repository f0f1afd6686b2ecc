"""Per-stage costs of a workload, measured: the `jigsaw.spb.SPBProfile` policies price
SPB configurations with.

On one worker's batch (the global batch over the job's workers), for each stage:
- forward seconds: the time its modules run (`tracking.RunningStage`);
- saved activation bytes: what autograd keeps for backward (`memory.SavedActivations`);
- parameter bytes;
- backward seconds, split into the input-gradient (dX) and weight-gradient (dW) parts.

Backward is measured by what SPB itself does, cutting at every depth. B(d), a backward
pass that trains the top d stages, computes dW of those d stages and dX of all but the
lowest of them (nothing below needs its input's gradient). X(d), a backward pass with
every parameter frozen and the input of stage S-d made a leaf that requires grad,
computes dX of the top d stages only. So dX(S-d) = X(d) - X(d-1) and
dW(S-d) = B(d) - B(d-1) - dX(S-d+1). Where a stage's input cannot require grad (token
indices, or a stage whose modules the model never calls as a whole) its dX is not
separable and counts as dW. Every time is the fastest of some repeats (on a shared
machine other work only ever adds time); differences below zero are clamped to zero.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from jigsaw.jobspec import Hyperparameters
from jigsaw.spb import SPBProfile, StageProfile
from worker_agent.runtime.sampling import to_device
from worker_agent.runtime.spb import stages as stage_cuts
from worker_agent.runtime.spb.memory import SavedActivations
from worker_agent.runtime.spb.tracking import RunningStage
from worker_agent.runtime.trial import Trial, TrialContext
from worker_agent.runtime.workloads import load_trial


def profile_workload(
    workload: str,
    *,
    workers: int,
    hyperparameters: Hyperparameters,
    stages: int | None = None,
    repeats: int = 7,
    seed: int = 0,
    device: torch.device | None = None,
) -> SPBProfile:
    """Measure `workload` as one of `workers` data-parallel workers would run it."""
    device = device or torch.device("cpu")
    context = TrialContext(
        hyperparameters=hyperparameters, rank=0, world_size=workers, device=device, seed=seed
    )
    torch.manual_seed(seed)
    trial = load_trial(workload)(context)
    model = trial.build_model().to(device)
    return profile_model(workload, trial, model, stages=stages, repeats=repeats)


def profile_model(
    workload: str, trial: Trial, model: nn.Module, *, stages: int | None, repeats: int
) -> SPBProfile:
    """Measure `model` (which the measurement trains: pass a copy of one that matters)
    on one of the trial's per-worker batches."""
    device = trial.context.device
    cut = stage_cuts.build(model, trial.stages(model), stages)
    batch_size = trial.context.per_rank_batch_size
    loader = DataLoader(trial.train_data(), batch_size=batch_size, shuffle=True)
    batch = to_device(next(iter(loader)), device)
    measure = _Measure(trial, model, cut, batch, device, repeats)
    return SPBProfile(
        workload=workload, per_worker_batch=batch_size, stages=measure.stages(), steps_ratio={}
    )


class _Measure:
    def __init__(
        self,
        trial: Trial,
        model: nn.Module,
        cut: stage_cuts.Stages,
        batch: Any,
        device: torch.device,
        repeats: int,
    ) -> None:
        self._trial = trial
        self._model = model
        self._cut = cut
        self._batch = batch
        self._device = device
        self._repeats = repeats

    def stages(self) -> tuple[StageProfile, ...]:
        count = len(self._cut)
        self._cut.train_top(count)
        self._backward_seconds()  # warm-up: first passes allocate and pick kernels
        forward, activations = self._forward()
        trained = [0.0] + [self._backward_seconds(depth) for depth in range(1, count + 1)]
        chain = [0.0]
        for depth in range(1, count):
            # None: this stage's input could not be made a leaf; its dX stays in its dW.
            seconds = self._input_chain_seconds(depth)
            chain.append(chain[-1] if seconds is None else max(seconds, chain[-1]))
        chain.append(chain[-1])  # stage 0's input is data: no gradient is ever computed
        backward_input = [0.0] * count
        backward_weight = [0.0] * count
        for depth in range(1, count + 1):
            stage = count - depth
            backward_input[stage] = max(0.0, chain[depth] - chain[depth - 1])
            above = backward_input[stage + 1] if stage + 1 < count else 0.0
            backward_weight[stage] = max(0.0, trained[depth] - trained[depth - 1] - above)
        self._cut.train_top(count)
        return tuple(
            StageProfile(
                forward_seconds=forward[stage],
                backward_input_seconds=backward_input[stage],
                backward_weight_seconds=backward_weight[stage],
                activation_bytes=activations[stage],
                parameter_bytes=self._cut.parameter_bytes()[stage],
            )
            for stage in range(count)
        )

    def _loss(self) -> torch.Tensor:
        return self._trial.loss(self._model, self._batch)

    def _forward(self) -> tuple[list[float], list[int]]:
        with SavedActivations(self._cut, self._model) as saved:
            self._loss()
        runs: list[list[float]] = []
        for _ in range(self._repeats):
            with RunningStage(self._cut) as running:
                self._loss()
            runs.append([running.forward_seconds[stage] for stage in range(len(self._cut))])
        fastest = [min(run[stage] for run in runs) for stage in range(len(self._cut))]
        return fastest, [saved.bytes[stage] for stage in range(len(self._cut))]

    def _backward_seconds(self, depth: int | None = None) -> float:
        """Fastest backward pass training the top `depth` stages (all: None)."""
        self._cut.train_top(depth or len(self._cut))
        return self._fastest(lambda: self._loss())

    def _input_chain_seconds(self, depth: int) -> float | None:
        """Fastest backward pass that computes only the input gradients of the
        top `depth` stages; None when the lowest one's input cannot require grad."""
        for params in self._cut.parameters:
            for param in params:
                param.requires_grad_(False)
        with _leaf_input(self._cut.modules[len(self._cut) - depth]) as made_leaf:
            seconds = self._fastest(lambda: self._loss())
        return seconds if made_leaf() else None

    def _fastest(self, forward: Callable[[], torch.Tensor]) -> float:
        times = []
        for _ in range(self._repeats):
            self._model.zero_grad(set_to_none=True)
            loss = forward()
            if not loss.requires_grad:
                return 0.0
            self._synchronize()
            start = time.perf_counter()
            loss.backward()
            self._synchronize()
            times.append(time.perf_counter() - start)
        self._model.zero_grad(set_to_none=True)
        return min(times)

    def _synchronize(self) -> None:
        if self._device.type == "cuda":
            torch.cuda.synchronize(self._device)


@contextmanager
def _leaf_input(module: nn.Module) -> Iterator[Callable[[], bool]]:
    """While active, `module`'s first input is detached into a leaf requiring grad (when
    it is a floating-point tensor); yields whether that happened."""
    done = [False]

    def hook(_: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        if args and isinstance(args[0], torch.Tensor) and args[0].is_floating_point():
            done[0] = True
            return (args[0].detach().requires_grad_(), *args[1:])
        return None

    handle = module.register_forward_pre_hook(hook)
    try:
        yield lambda: done[0]
    finally:
        handle.remove()
