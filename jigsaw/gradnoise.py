"""Gradient noise: what statistical efficiency and AdaScale's learning rate follow from.

The pieces of the goodput model (`scheduler.core.goodput`, whose docstring has the
formulas and sources) that the training runtime needs as well: the noise parameters,
statistical efficiency, AdaScale's gain ratio and learning-rate rule, and the running
estimate of the noise from gradients measured across workers and micro-batches
(`NoiseEstimator`, as AdaptDL's `GradientNoiseScale` makes it). Pure Python floats:
the runtime hands in squared norms, the scheduler reads what was reported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class GradParams:
    """Gradient noise at the job's base batch B0: |G|^2 (`sqr`) and tr(Sigma) (`var`)
    of a gradient averaged over B0 samples. A variance measured between micro-batches
    of m samples converts as var(B0) = var(m) x m / B0 (AdaptDL's `accum_scale`)."""

    sqr: float
    var: float

    def __post_init__(self) -> None:
        for name in ("sqr", "var"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"gradient {name} must be finite and >= 0, not {value!r}")

    @classmethod
    def from_estimates(cls, sqr: float, var: float) -> GradParams:
        """Running estimates are differences of noisy norms and can dip below zero:
        clamped at zero, as AdaptDL does."""
        if not (math.isfinite(sqr) and math.isfinite(var)):
            raise ValueError(f"gradient estimates must be finite, not sqr={sqr!r} var={var!r}")
        return cls(max(sqr, 0.0), max(var, 0.0))

    def noise_scale(self, base_batch: float) -> float:
        """B_noise = B0 var / sqr: the batch size past which efficiency falls fast."""
        return math.inf if self.sqr == 0 else base_batch * self.var / self.sqr


def efficiency_at_scale(grad: GradParams, scale: Any) -> Any:
    """E at batch `scale` x B0, elementwise; 1/scale when there is no signal at all."""
    if grad.sqr == 0 and grad.var == 0:
        return 1.0 / scale
    return (grad.var + grad.sqr) / (grad.var + grad.sqr * scale)


def check_batch(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive batch size, not {value!r}")


def efficiency(grad: GradParams, base_batch: float, batch: float) -> float:
    """Statistical efficiency of `batch` relative to `base_batch` (1 there)."""
    check_batch("base_batch", base_batch)
    check_batch("batch", batch)
    return float(efficiency_at_scale(grad, batch / base_batch))


def gain(grad: GradParams, scale: float) -> float:
    """AdaScale's gain ratio at `scale` = batch / base batch: how many base-batch steps
    one step at the larger batch is worth."""
    check_batch("scale", scale)
    return float(efficiency_at_scale(grad, scale)) * scale


@dataclass(frozen=True)
class AdaScaleStep:
    """A step at an adaptive batch: its learning rate and the base-batch steps of
    progress it counts as (its gain)."""

    lr: float
    gain: float


def adascale(base_lr: float, base_batch: float, new_batch: float, grad: GradParams) -> AdaScaleStep:
    """The learning rate at `new_batch` for a job tuned at `base_lr` and `base_batch`, and
    the gain the step counts as.

    AdaScale (Johnson et al., ICML 2020; AdaptDL's `AdaScale` scaling rule): the rate
    times the gain ratio. It is the rule the efficiency model assumes (one step at
    r x B0 makes gain(r) base steps of progress only if the step is gain(r) times as
    long), it is never bolder than linear scaling (gain <= r), it is linear scaling
    where noise dominates and no scaling where the gradient is exact, and it needs only
    the gradient noise the runtime measures anyway. The runtime advances the job's
    progress by the gain per step (AdaScale's scale-invariant iterations).
    """
    if not (math.isfinite(base_lr) and base_lr >= 0):
        raise ValueError(f"base_lr must be finite and >= 0, not {base_lr!r}")
    check_batch("base_batch", base_batch)
    check_batch("new_batch", new_batch)
    step_gain = gain(grad, new_batch / base_batch)
    return AdaScaleStep(lr=base_lr * step_gain, gain=step_gain)


# AdaptDL smooths its noise estimates over about 1 / (1 - 0.999) steps at its batch
# sizes; the jobs here are short, so a tenth of that still averages over many steps.
_SMOOTHING = 0.99


class NoiseEstimator:
    """The gradient noise at a job's base batch, smoothed over steps.

    Per step the runtime measures `n` >= 2 gradients of `m` samples each (one per
    micro-batch on each worker), their mean squared norm `local_sqr`, and the squared
    norm of their average `total_sqr` (the gradient the step applies). For independent
    micro-batches E[local_sqr] = |G|^2 + var(m) and E[total_sqr] = |G|^2 + var(m) / n,
    so var(m) = (local_sqr - total_sqr) n / (n - 1) and |G|^2 = total_sqr - var(m) / n
    are unbiased; var(m) converts to the base batch as var(m) m / B0 (`GradParams`).
    Both are exponential moving averages with bias correction (AdaptDL's).
    """

    def __init__(self, base_batch: int, smoothing: float = _SMOOTHING) -> None:
        check_batch("base_batch", base_batch)
        if not 0 <= smoothing < 1:
            raise ValueError(f"smoothing must be in [0, 1), not {smoothing!r}")
        self._base_batch = base_batch
        self._smoothing = smoothing
        self._sqr = 0.0
        self._var = 0.0
        self._weight = 0.0  # of the averages so far: 1 - smoothing^steps

    def update(self, *, local_sqr: float, total_sqr: float, count: int, micro_batch: int) -> None:
        """One step's measurement: `count` gradients of `micro_batch` samples each."""
        if count < 2:
            raise ValueError(f"the noise needs at least two gradients a step, not {count}")
        check_batch("micro_batch", micro_batch)
        if not (math.isfinite(local_sqr) and math.isfinite(total_sqr)):
            return  # a diverged step says nothing about the noise
        var = (local_sqr - total_sqr) * count / (count - 1)
        sqr = total_sqr - var / count
        keep = self._smoothing
        self._sqr = keep * self._sqr + (1 - keep) * sqr
        self._var = keep * self._var + (1 - keep) * var * micro_batch / self._base_batch
        self._weight = keep * self._weight + (1 - keep)

    def state(self) -> list[float]:
        """What `restore` takes: the averages so far (a checkpoint carries them, so a
        resumed run, at any batch, goes on averaging instead of starting over)."""
        return [self._sqr, self._var, self._weight]

    def restore(self, state: list[float]) -> None:
        sqr, var, weight = (float(value) for value in state)
        if not (math.isfinite(sqr) and math.isfinite(var) and 0 <= weight <= 1):
            raise ValueError(f"not a noise estimator's state: {state!r}")
        self._sqr, self._var, self._weight = sqr, var, weight

    @property
    def params(self) -> GradParams | None:
        """The smoothed noise at the base batch; None before the first measurement."""
        if self._weight == 0:
            return None
        return GradParams.from_estimates(self._sqr / self._weight, self._var / self._weight)
