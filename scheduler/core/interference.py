"""Measured co-location interference: how much jobs sharing one GPU slow each other.

A job's demand is its solo utilization: the fraction of time it keeps the GPU busy when
it runs alone (NVML's utilization, 0-1). Alone, a job is never slowed. With co-runners,
job i, of demand d, whose co-runners' demands add up to o (capped at 1), meets
contention with probability

    c = 1 - (1 - (d*o)^p) * (1 - o^r) * (1 - d^m)

the chance of at least one of three events, taken as independent: both want the GPU at
once (d*o: the queueing that slows even underused pairs a little), the co-runners keep
the GPU busy by themselves (o^r, steep: r is large), or the job itself does (d^m). Met
contention costs what equal time slicing costs: each of n jobs gets capacity/n of the
GPU, so job i's iteration takes

    stretch = 1 + (n / capacity - 1) * c

times as long as alone, between 1 (no contention) and n / capacity (every job saturated).
`capacity` is the combined normalized throughput of jobs that each saturate the GPU:
below 1 under plain time slicing (the context switches cost; 0.90 measured on an H100),
above 1 under CUDA MPS (kernels of both processes run at once; 1.08-1.09 measured).
So a GPU saturated by one job predicts a loss for any guest under time slicing (every
job gets capacity/n: combined = capacity < 1), and two jobs that leave the GPU mostly
idle barely slow each other.

The fitted parameters, per GPU generation and sharing mode, ship in `interference.json`
beside this module; `benchmarks/interference_fit.py` refits them from the measurements
and reports the error on pairs held out of the fit (docs/results/interference.md).
Memory plays no part in the slowdown (none was measured); whether jobs fit in a GPU's
memory together is the caller's check.

Pure and cheap: plain floats, called in a scheduling round's inner loop.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import cache
from importlib import resources


class Sharing(StrEnum):
    """How co-located processes share a GPU."""

    TIME_SLICING = "time-slicing"  # plain CUDA: the GPU switches between processes
    MPS = "mps"  # the CUDA MPS daemon: kernels of different processes run at once


@dataclass(frozen=True, slots=True)
class InterferenceModel:
    """The slowdown rule of one GPU generation in one sharing mode (module docstring)."""

    capacity: float  # combined normalized throughput when every co-runner saturates
    overlap_exponent: float  # p, on (own demand x co-runners' demand)
    saturation_exponent: float  # r, on the co-runners' demand
    self_exponent: float  # m, on the job's own demand

    def __post_init__(self) -> None:
        # Below capacity 2 a co-runner always costs something; exponents keep every
        # term a probability that rises with demand.
        if not 0.0 < self.capacity < 2.0:
            raise ValueError(f"capacity must be in (0, 2), not {self.capacity}")
        exponents = (self.overlap_exponent, self.saturation_exponent, self.self_exponent)
        if not all(e > 0.0 for e in exponents):
            raise ValueError(f"exponents must be positive, not {exponents}")

    def contention(self, own: float, others: float) -> float:
        """Probability that a job of demand `own` meets contention beside co-runners
        whose demands add up to `others`."""
        others = min(1.0, others)
        free = (
            (1.0 - (own * others) ** self.overlap_exponent)
            * (1.0 - others**self.saturation_exponent)
            * (1.0 - own**self.self_exponent)
        )
        return 1.0 - free

    def stretch(self, utilizations: Sequence[float]) -> tuple[float, ...]:
        """How many times longer each co-runner's iteration takes than alone, given
        each one's solo utilization (0-1), in the same order."""
        for u in utilizations:
            if not 0.0 <= u <= 1.0:  # also refuses NaN
                raise ValueError(f"a utilization is a fraction in [0, 1], not {u}")
        n = len(utilizations)
        if n < 2:
            return (1.0,) * n
        total = math.fsum(utilizations)
        worst = n / self.capacity - 1.0
        return tuple(1.0 + worst * self.contention(u, max(0.0, total - u)) for u in utilizations)

    def speeds(self, utilizations: Sequence[float]) -> tuple[float, ...]:
        """Each co-runner's speed as a fraction of its speed alone."""
        return tuple(1.0 / s for s in self.stretch(utilizations))


PARAMETERS_FILE = "interference.json"
# Generations with no fit of their own take the nearest fitted one by SM architecture:
# Turing (T4) is Volta's SM with new tensor-core modes; the H200 is the H100's chip with
# more and faster memory.
NEAREST_FITTED = {"t4": "v100", "h200": "h100"}


@dataclass(frozen=True)
class Fits:
    """The fitted models, by generation and sharing mode."""

    models: Mapping[str, Mapping[Sharing, InterferenceModel]]

    def get(self, generation: str, sharing: Sharing = Sharing.TIME_SLICING) -> InterferenceModel:
        """The model of a generation ("h100", "v100", "t4", ...). A generation measured
        only under time slicing uses that fit under MPS too: MPS was measured no worse
        than time slicing for every pair, so this errs on the side of not packing."""
        by_sharing = self.models[NEAREST_FITTED.get(generation, generation)]
        return by_sharing.get(sharing, by_sharing[Sharing.TIME_SLICING])

    def for_device(
        self, device_name: str, sharing: Sharing = Sharing.TIME_SLICING
    ) -> InterferenceModel:
        """The model for a GPU by the name its driver reports ("NVIDIA H100 80GB HBM3",
        "Tesla T4"). A GPU of no known generation gets the most pessimistic fit (the
        lowest capacity), so the scheduler packs it no more than any measured GPU."""
        name = device_name.lower()
        for generation in (*self.models, *NEAREST_FITTED):
            if generation in name:
                return self.get(generation, sharing)
        return min(
            (self.get(generation, sharing) for generation in self.models),
            key=lambda model: model.capacity,
        )


def fits_from_json(document: Mapping[str, object]) -> Fits:
    """Fits from the parameters file's content (`{"fits": {generation: {mode: {...}}}}`)."""
    fits = document["fits"]
    if not isinstance(fits, Mapping):
        raise ValueError("the parameters file has no 'fits' object")
    return Fits(
        {
            generation: {Sharing(mode): InterferenceModel(**p) for mode, p in modes.items()}
            for generation, modes in fits.items()
        }
    )


@cache
def fitted() -> Fits:
    """The fits shipped with the package."""
    text = resources.files("scheduler.core").joinpath(PARAMETERS_FILE).read_text()
    return fits_from_json(json.loads(text))
