"""Pipeline-parallel training of the transformer workload with `torch.distributed.pipelining`.

One pipeline stage per rank of the default process group. The schedules are PyTorch's:
GPipe and 1F1B run each microbatch's backward as one piece; the zero-bubble schedule
(`ScheduleInterleavedZeroBubble`, ZB1P of Qi et al., arXiv 2401.10241) splits it into
the input-gradient part, sent upstream at once, and the weight-gradient part, run later
to fill what would be bubbles: the paper's gradient fast-forwarding, in PyTorch's own
runtime (`stage_backward_input` / `stage_backward_weight`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

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

from worker_agent.runtime.workloads.nets import TransformerLM

PipelineSchedule = Literal["gpipe", "1f1b", "zero-bubble"]
PIPELINE_SCHEDULES: tuple[PipelineSchedule, ...] = ("gpipe", "1f1b", "zero-bubble")


class TransformerPart(nn.Module):
    """The blocks of a `TransformerLM` one stage runs, with the embeddings on the first
    stage and the output head on the last."""

    def __init__(self, model: TransformerLM, stage: int, num_stages: int) -> None:
        super().__init__()
        if not 1 <= num_stages <= len(model.blocks):
            raise ValueError(
                f"{num_stages} pipeline stages for {len(model.blocks)} transformer blocks"
            )
        self.first, self.last = stage == 0, stage == num_stages - 1
        bounds = [round(i * len(model.blocks) / num_stages) for i in range(num_stages + 1)]
        self.blocks = nn.ModuleList(model.blocks[bounds[stage] : bounds[stage + 1]])
        self.token_embedding = model.token_embedding if self.first else None
        self.position_embedding = model.position_embedding if self.first else None
        self.head = model.head if self.last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.token_embedding is not None and self.position_embedding is not None:
            positions = torch.arange(x.shape[1], device=x.device)
            x = self.token_embedding(x) + self.position_embedding(positions)
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1], device=x.device)
        for block in self.blocks:
            x = block(x, src_mask=mask, is_causal=True)
        return self.head(x) if self.head is not None else x


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
    """Trains this rank's stage of `model` with one schedule; call `step` on every rank."""

    def __init__(
        self,
        model: TransformerLM,
        schedule: PipelineSchedule,
        n_microbatches: int,
        build_optimizer: Callable[[list[nn.Parameter]], Optimizer],
        device: torch.device,
    ) -> None:
        self.rank, self.num_stages = dist.get_rank(), dist.get_world_size()
        self.part = TransformerPart(model, self.rank, self.num_stages).to(device)
        self.stage = PipelineStage(self.part, self.rank, self.num_stages, device)
        self.busy = BusyTime()
        # The stage's compute calls, timed on this instance only (the idle fraction is
        # what remains of the step).
        for kind, name in (
            ("F", "forward_one_chunk"),
            ("B", "backward_one_chunk"),
            ("W", "backward_weight_one_chunk"),
        ):
            setattr(self.stage, name, self.busy.wrap(kind, getattr(self.stage, name)))
        self.optimizer = build_optimizer(list(self.part.parameters()))
        if schedule == "gpipe":
            self.schedule: Any = ScheduleGPipe(self.stage, n_microbatches, loss_fn=_lm_loss)
        elif schedule == "1f1b":
            self.schedule = Schedule1F1B(self.stage, n_microbatches, loss_fn=_lm_loss)
        elif schedule == "zero-bubble":
            self.schedule = ScheduleInterleavedZeroBubble(
                [self.stage], n_microbatches, loss_fn=_lm_loss
            )
        else:
            raise ValueError(f"unknown pipeline schedule {schedule!r}: use {PIPELINE_SCHEDULES}")

    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> float | None:
        """One iteration over the global batch; the mean microbatch loss on the last stage.

        Every rank passes the same batch: the first stage reads the inputs, the last the
        targets.
        """
        self.optimizer.zero_grad()
        losses: list[torch.Tensor] = []
        kwargs: dict[str, Any] = {"target": targets, "losses": losses} if self.part.last else {}
        if self.part.first:
            self.schedule.step(inputs, **kwargs)
        else:
            self.schedule.step(**kwargs)
        self.optimizer.step()
        return float(torch.stack(losses).detach().mean()) if losses else None


def _lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
