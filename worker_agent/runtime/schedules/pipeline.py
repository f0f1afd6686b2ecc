"""Pipeline-parallel training with `torch.distributed.pipelining`: one stage per rank.

A stage is any module a trial's `Trial.pipeline` cuts from its model (the built-in
transformers' `TransformerPart`). The schedules are PyTorch's: GPipe and 1F1B run each
microbatch's backward as one piece; the zero-bubble schedule
(`ScheduleInterleavedZeroBubble`, ZB1P of Qi et al., arXiv 2401.10241) splits it into
the input-gradient part, sent upstream at once, and the weight-gradient part, run later
to fill what would be bubbles: the paper's gradient fast-forwarding, in PyTorch's own
runtime (`stage_backward_input` / `stage_backward_weight`). The training loop (for a
job whose spec has `pipeline`, through `PipelineParallel`), `benchmarks/ooo.py` and the
tests all train through `PipelineTrainer`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, get_args

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleavedZeroBubble,
)
from torch.optim import Optimizer

from jigsaw.jobspec import PipelineSchedule
from worker_agent.runtime.schedules.base import Parts, Schedule

PIPELINE_SCHEDULES: tuple[PipelineSchedule, ...] = get_args(PipelineSchedule)


@dataclass
class BusyTime:
    """Seconds this stage spent computing (forward, input and weight backward) per step,
    from timestamps around each of the stage's compute calls."""

    seconds: float = 0.0
    intervals: list[tuple[str, float, float]] = field(default_factory=list)

    def wrap(self, kind: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                end = time.perf_counter()
                self.seconds += end - start
                self.intervals.append((kind, start, end))

        return timed

    def reset(self) -> None:
        self.seconds = 0.0
        self.intervals.clear()


class PipelineTrainer:
    """Trains this rank's stage with one schedule; every rank of `group` (the default
    group if None) runs the same steps on the same batches, one stage each in rank
    order.

    Driven like a backward schedule (`zero_grad`, then `run` instead of computing the
    loss and `backward`, `step`, `flush`); `train` is one whole step.
    """

    def __init__(
        self,
        part: nn.Module,
        schedule: PipelineSchedule,
        n_microbatches: int,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        optimizer: Optimizer,
        device: torch.device,
        group: dist.ProcessGroup | None = None,
        busy: BusyTime | None = None,
    ) -> None:
        """`busy`, if given, collects the stage's compute time (benchmarks, tests)."""
        self._ranks = dist.get_process_group_ranks(group or dist.group.WORLD)
        self._group = group
        index, self.num_stages = dist.get_rank(group), len(self._ranks)
        self.first, self.last = index == 0, index == self.num_stages - 1
        self.part = part
        self.stage = PipelineStage(part, index, self.num_stages, device, group=group)
        if busy is not None:
            # The stage's compute calls, timed on this instance only (the idle fraction
            # is what remains of the step).
            for kind, name in (
                ("F", "forward_one_chunk"),
                ("B", "backward_one_chunk"),
                ("W", "backward_weight_one_chunk"),
            ):
                setattr(self.stage, name, busy.wrap(kind, getattr(self.stage, name)))
        self.optimizer = optimizer
        if schedule == "gpipe":
            self.schedule: Any = ScheduleGPipe(self.stage, n_microbatches, loss_fn=loss_fn)
        elif schedule == "1f1b":
            self.schedule = Schedule1F1B(self.stage, n_microbatches, loss_fn=loss_fn)
        elif schedule == "zero-bubble":
            self.schedule = ScheduleInterleavedZeroBubble(
                [self.stage], n_microbatches, loss_fn=loss_fn
            )
        else:
            raise ValueError(f"unknown pipeline schedule {schedule!r}: use {PIPELINE_SCHEDULES}")

    def zero_grad(self) -> None:
        self.optimizer.zero_grad()

    def run(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor | None:
        """Forward and backward of every microbatch of the batch; on the last stage the
        batch's loss (the mean over its equal microbatches), detached.

        Every rank passes the same batch: the first stage reads the inputs, the last the
        targets.
        """
        losses: list[torch.Tensor] = []
        kwargs: dict[str, Any] = {"target": targets, "losses": losses} if self.last else {}
        if self.first:
            self.schedule.step(inputs, **kwargs)
        else:
            self.schedule.step(**kwargs)
        return torch.stack(losses).detach().mean() if losses else None

    def step(self) -> None:
        self.optimizer.step()

    def flush(self) -> None:
        """Nothing deferred: every update is applied in `step`."""

    def train(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor | None:
        """One iteration: `zero_grad`, `run`, `step`."""
        self.zero_grad()
        loss = self.run(inputs, targets)
        self.step()
        return loss

    def loss_on_first_stage(self, loss: torch.Tensor | None) -> torch.Tensor | None:
        """The last stage's `loss` of this step on the first stage (which reports it):
        one scalar sent point to point, no collective. None elsewhere."""
        if self.first and self.last:
            return loss
        # On the default group, which the loop keeps free of the schedule's messages
        # (they have a group of their own), so the scalar is never matched with one.
        if self.last:
            assert loss is not None, "the last stage computes the loss"
            # float32 whatever the loss's precision: the receiver's buffer is.
            dist.send(loss.float(), dst=self._ranks[0])
        if not self.first:
            return None
        received = torch.empty((), dtype=torch.float32, device=self.stage.device)
        dist.recv(received, src=self._ranks[-1])
        return received

    def gather_model(self, parts: list[nn.Module]) -> None:
        """Collective: the first stage's `parts` (one per stage, holding its copy of the
        whole model) are loaded with every stage's current state, so that it can
        evaluate the whole model."""
        state = {name: value.detach().cpu() for name, value in self.part.state_dict().items()}
        states: list[Any] | None = [None] * self.num_stages if self.first else None
        dist.gather_object(state, states, dst=self._ranks[0], group=self._group)
        if states is not None:
            for part, stage_state in zip(parts[1:], states[1:], strict=True):
                part.load_state_dict(stage_state)


class PipelineParallel(Schedule):
    """The loop's pipeline schedule: rank r trains stage r of the model on every batch.

    Forwards and backwards interleave inside the schedule, which has no all-reduce to
    carry the boundary agreement: it is launched before them. The stages' messages have
    a process group of their own, beside the agreement and the loss sent to rank 0 on
    the default group.
    """

    def __init__(self, parts: Parts) -> None:
        super().__init__(parts)
        pipeline, split = parts.config.pipeline, parts.split
        assert pipeline is not None and split is not None, "a pipeline job has a split"
        self._parts_of_stages = split.parts
        self._trainer = PipelineTrainer(
            parts.trained,
            pipeline.schedule,
            pipeline.microbatches,
            split.loss,
            parts.optimizer,
            parts.device,
            group=dist.new_group(),
        )

    def zero_grad(self) -> None:
        self._trainer.zero_grad()

    def forward_backward(self, batch: Any, agreeing: bool) -> torch.Tensor | None:
        """The last stage's loss, on rank 0 (the first stage); None on the others."""
        if agreeing:
            self._parts.agreement.launch()
        inputs, targets = batch
        return self._trainer.loss_on_first_stage(self._trainer.run(inputs, targets))

    def step(self) -> None:
        self._trainer.step()

    def flush(self) -> None:
        self._trainer.flush()

    def before_evaluation(self) -> None:
        """Collective: the stages gather their parts to rank 0, which evaluates."""
        self._trainer.gather_model(self._parts_of_stages)
        super().before_evaluation()
