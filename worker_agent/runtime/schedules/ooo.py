"""Out-of-order backprop (`backprop: ooo`) in the training loop: reverse first-k across
ranks, the deferred weight gradients of a single device (`worker_agent.runtime.ooo`).

Neither has an all-reduce of everything to carry the boundary agreement: it is
launched on its own, before backward, and hides behind it. Their exchanges overlap the
next forward, so the step's communication is not split out.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from torch import nn

from jigsaw.spb import SPBProfile
from worker_agent.runtime.ooo.gang_first_k import agree_first_k, link_bytes_per_second
from worker_agent.runtime.ooo.reverse_first_k import ReverseFirstK
from worker_agent.runtime.ooo.schedules import DeferredWeightBackprop, kfac_hooks
from worker_agent.runtime.schedules.base import Parts, Stepping
from worker_agent.runtime.spb import stages

logger = logging.getLogger(__name__)


class ReverseFirstKSchedule(Stepping):
    """Every layer's gradient all-reduced as soon as it exists, its update applied
    right before its next forward; SPB's contributors average each layer."""

    def __init__(self, parts: Parts) -> None:
        gradients, whole_step = kfac_hooks(parts.optimizer)
        self._first_k = parts.config.ooo_first_k
        self._backprop = ReverseFirstK(
            parts.model,
            parts.optimizer,
            self._first_k,
            output_gradients=gradients,
            whole_step=whole_step,
        )
        super().__init__(parts, self._backprop)

    @property
    def needs_profile(self) -> bool:
        """A k the spec leaves to the platform is chosen from rank 0's profile."""
        return self._first_k is None

    def start(self, profile: SPBProfile | None) -> None:
        """Collective: k (in stages) from rank 0's profile of the model's stages and the
        link measured on this gang (`ooo.gang_first_k`), when the spec leaves it open."""
        if self._first_k is not None:
            return
        parts = self._parts
        cut = stages.build(parts.model, parts.trial.stages(parts.model), parts.config.spb_stages)
        bandwidth = link_bytes_per_second(parts.device)
        k = agree_first_k(self._backprop, cut.modules, profile, bandwidth)
        if self._rank0:
            logger.info(
                "reverse first-k: the first %d of %d stages compute their weight gradients "
                "after the chain (link measured at %.0f MB/s)",
                k,
                len(cut),
                bandwidth / 1e6,
            )

    def set_contributors(
        self, stages: Sequence[nn.Module], contributors: tuple[frozenset[int], ...]
    ) -> None:
        self._backprop.set_contributors(stages, contributors)
        super().set_contributors(stages, contributors)


class DeferredWeightSchedule(Stepping):
    """One device: the dX chain, then the weight gradients (nothing to exchange)."""

    def __init__(self, parts: Parts) -> None:
        gradients, _ = kfac_hooks(parts.optimizer)
        super().__init__(parts, DeferredWeightBackprop(parts.model, parts.optimizer, gradients))
