"""What the training loop asks of a backward schedule, in one interface.

A schedule owns one worker's gradients and updates. Per iteration the loop calls
`zero_grad`, then `forward_backward` (the loss and its gradients, exchanged among the
ranks as the schedule does it), then `step`; `flush` wherever the parameters must be
this step's (a checkpoint); `before_evaluation` on every rank at an evaluation
boundary. The data-parallel schedules (`Stepping`) compute the trial's loss and hand it
to a `BackpropSchedule`, the step primitives benchmarks and tests also drive alone.
What differs between schedules, and nothing else, is behind these methods:

- the boundary agreement's carrier: a schedule whose first gradient all-reduce over the
  whole world can carry an offered agreement says so (`carries_agreement`); for the
  others `forward_backward` launches the agreement as a collective of its own, where it
  hides behind backward (`boundary`);
- the step's exposed communication (`communication`), split from its compute;
- SPB's contributors (`set_contributors`): which ranks train each stage, for whoever
  averages per layer (the schedule's exchange, K-FAC's factors);
- a start that needs the model's profile (`needs_profile`, `start`);
- what evaluation needs (`before_evaluation`).

Checkpoints need no state of their own: `flush` leaves nothing pending. The out-of-order
schedules may defer updates into the next forward, which is why the loop never touches
gradients or the optimizer itself.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import torch
from torch import nn
from torch.optim import Optimizer

from jigsaw.gradnoise import GradParams
from jigsaw.spb import SPBProfile
from worker_agent.runtime.boundary import BoundarySync
from worker_agent.runtime.config import WorkerConfig
from worker_agent.runtime.kfac import KFACSGD
from worker_agent.runtime.kfac.factors import layer_contributors
from worker_agent.runtime.spb.partial import PartialBackprop
from worker_agent.runtime.timing import DeviceClock, Mark
from worker_agent.runtime.trial import PipelineSplit, Trial


class BackpropSchedule(Protocol):
    """One step's gradient work, as benchmarks and tests drive it without the loop."""

    def zero_grad(self) -> None: ...

    def backward(self, loss: torch.Tensor) -> None: ...

    def step(self) -> None: ...

    def flush(self) -> None:
        """Apply every deferred update, so that the parameters are this step's."""


@dataclass(frozen=True)
class Parts:
    """What the loop built that a schedule trains with."""

    config: WorkerConfig
    trial: Trial
    model: nn.Module  # whole and unwrapped: what evaluation sees
    trained: nn.Module  # what this rank trains (its pipeline stage's part, else `model`)
    split: PipelineSplit | None  # the trial's pipeline cut, for a pipeline job
    optimizer: Optimizer
    kfac: KFACSGD | None  # the optimizer, when it is K-FAC
    device: torch.device
    clock: DeviceClock
    agreement: BoundarySync
    partial: PartialBackprop | None  # SPB's cut, for a job that may run SPB


class Schedule(ABC):
    """The loop's side of a backward schedule (see the module doc)."""

    # Whether the step's gradient exchange carries an offered boundary agreement.
    carries_agreement: ClassVar[bool] = False

    def __init__(self, parts: Parts) -> None:
        self._parts = parts
        self._rank0 = parts.config.rank == 0
        # What the trial's loss runs on: the model, or a wrapper that exchanges gradients.
        self.model: nn.Module = parts.model

    @property
    def needs_profile(self) -> bool:
        """Whether `start` needs rank 0's profile of the model."""
        return False

    def start(self, profile: SPBProfile | None) -> None:  # noqa: B027 - a hook, mostly unused
        """Collective, once before the first step of this process; `profile` is rank
        0's measurement (None elsewhere, or when nobody measured)."""

    @abstractmethod
    def zero_grad(self) -> None: ...

    @abstractmethod
    def forward_backward(self, batch: Any, agreeing: bool) -> torch.Tensor | None:
        """The batch's loss and gradients, with the offered boundary agreement (when
        `agreeing`) riding in the exchange or launched where it hides behind backward.
        None on a rank that does not see the loss."""

    @abstractmethod
    def step(self) -> None: ...

    @abstractmethod
    def flush(self) -> None:
        """Apply every deferred update, so that the parameters are this step's."""

    def communication(self, backward_end: Mark) -> tuple[float, int]:
        """Seconds of the last step spent communicating and not hidden behind compute
        (read after the clock synchronizes), and this rank's wire bytes. Schedules that
        do not split theirs out say 0."""
        return 0.0, 0

    def set_contributors(
        self, stages: Sequence[nn.Module], contributors: tuple[frozenset[int], ...]
    ) -> None:
        """From the next step on, the ranks that train each SPB stage (input side
        first): K-FAC's factors are averaged over them."""
        kfac = self._parts.kfac
        if kfac is not None:
            preconditioner = kfac.preconditioner
            preconditioner.set_contributors(
                layer_contributors(preconditioner.layers, list(stages), contributors)
            )

    def gradient_noise(self) -> GradParams | None:
        """The gradient noise the schedule measured (only elastic and adaptive-batch
        jobs' schedule measures it)."""
        return None

    def step_progress(self) -> float:
        """Steps of the job's base batch that the last step was worth: 1, except an
        adaptive batch's (`ElasticDataParallel`)."""
        return 1.0

    def state(self) -> dict[str, Any] | None:
        """What the schedule carries across a checkpoint besides the model and the
        optimizer (None: nothing), handed to `restore` when a run resumes from it."""
        return None

    def restore(self, state: dict[str, Any]) -> None:  # noqa: B027 (most carry nothing)
        """Take up `state` from a checkpoint (see `state`)."""

    def before_evaluation(self) -> None:
        """Every rank, at an evaluation boundary: rank 0's whole model is made current."""
        if self._rank0:
            self.flush()


class Stepping(Schedule):
    """A data-parallel schedule: the trial's loss on `model`, then a `BackpropSchedule`'s
    backward, step and flush."""

    def __init__(self, parts: Parts, steps: BackpropSchedule) -> None:
        super().__init__(parts)
        self._steps = steps

    def zero_grad(self) -> None:
        self._steps.zero_grad()

    def forward_backward(self, batch: Any, agreeing: bool) -> torch.Tensor | None:
        loss = self._parts.trial.loss(self.model, batch)
        if agreeing and not self.carries_agreement:
            self._parts.agreement.launch()
        self._steps.backward(loss)
        return loss

    def step(self) -> None:
        self._steps.step()

    def flush(self) -> None:
        self._steps.flush()
