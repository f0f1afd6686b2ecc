"""One rank's side of an SPB job: its depth at each iteration and the gradient exchange.

The training loop calls `begin` before each forward (the depths may rotate), lets the
trial compute the loss and backward as usual, then `synchronize` in place of DDP's
all-reduce (`schedules.spb` drives this as the loop's backward schedule).
`configure` takes a new configuration at a boundary: the next `begin` cuts accordingly,
with no restart and no lost step.
"""

from __future__ import annotations

from torch import nn

from jigsaw import spb
from jigsaw.jobspec import SPBConfig
from worker_agent.runtime.boundary import BoundarySync
from worker_agent.runtime.spb.exchange import StageExchange
from worker_agent.runtime.spb.stages import Stages


class PartialBackprop:
    def __init__(
        self,
        stages: Stages,
        model: nn.Module,
        *,
        rank: int,
        world_size: int,
        config: SPBConfig | None,
        agreement: BoundarySync | None = None,
    ) -> None:
        """`agreement`: boundary agreements to carry in the exchange (`boundary`)."""
        self.stages = stages
        self._rank = rank
        self._world_size = world_size
        self._exchange = StageExchange(stages, model, rank, world_size, agreement)
        self.config = config
        self.depths: tuple[int, ...] = ()

    def configure(self, config: SPBConfig | None) -> None:
        self.config = config

    def begin(self, iteration: int) -> tuple[int, ...]:
        """Freeze this rank's stages below its cut for the iteration; every rank's depth."""
        depths = spb.worker_depths(self.config, self._world_size, len(self.stages), iteration)
        if depths != self.depths:
            self.stages.train_top(depths[self._rank])
            self.depths = depths
        return depths

    def synchronize(self) -> int:
        """Collective, after backward: every `.grad` holds its stage's contributor mean.
        Returns this rank's wire bytes."""
        return self._exchange.synchronize(self.depths)

    def after_step(self) -> None:
        """Collective, after the optimizer step: replicas take rank 0's buffers."""
        self._exchange.broadcast_buffers()

    @property
    def depth_fraction(self) -> float:
        """Mean depth over the job's workers as a fraction of the stages (1 = full)."""
        return sum(self.depths) / (len(self.depths) * len(self.stages))
