"""Goodput: how fast a job makes statistical progress at a size and a batch size.

Pollux's model (Qiao et al., "Pollux: Co-adaptive Cluster Scheduling for
Goodput-Optimized Deep Learning", OSDI 2021), as AdaptDL implements it
(petuum/adaptdl: `adaptdl/goodput.py`, and `simulator/goodput.py` of the OSDI'21
artifact): goodput = throughput x statistical efficiency.

Statistical efficiency, from the gradient noise measured at the job's base batch B0
(`GradParams`: `sqr` = |G|^2 of the true gradient, `var` = tr(Sigma), the variance of a
gradient averaged over B0 samples), at a global batch B = r B0:

    gain(r) = (var + sqr) / (var / r + sqr)          AdaScale's gain ratio, 1 <= gain <= r
    E(B)    = gain(r) / r = (B_noise + B0) / (B_noise + B),   B_noise = B0 var / sqr

E(B0) = 1: one sample at B makes E(B) of the progress one sample makes at B0. E stays
near 1 while B << B_noise (the gradient noise scale) and falls like B_noise / B beyond.

Throughput, from `PerfParams` fitted to measured step times (Pollux's model):

    compute(m)    = alpha_c + beta_c m                       one micro-batch of m samples
    network(n, w) = alpha_r ring(w) + beta_r max(w - 2, 0)   w GPUs on one node
                  = alpha_n ring(w) + beta_n max(w - 2, 0)   w GPUs over n > 1 nodes
    ring(w)       = 2 (w - 1) / w                            (0 for one GPU: no network)
    step          = a compute(m) + (compute(m)^gamma + network(n, w)^gamma)^(1/gamma)

with `a` micro-batches accumulated before the synchronised one; gamma in [1, 10] is how
far synchronisation overlaps the backward pass (1: not at all; 10: nearly fully).
Throughput = B / step samples per second; goodput = throughput x E(B), in samples per
second as the base batch would use them.

One change from Pollux: its network term is alpha + beta max(w - 2, 0). The ring factor
(the traffic a ring all-reduce sends over each link, which saturates as w grows) cuts
the error of predicting 5-8 GPUs from runs on up to 4, on the Pollux profiles, from
medians up to 32% to at most 21% (docs/results/goodput.md).

The noise parameters, efficiency and AdaScale's rule live in the kernel
(`jigsaw.gradnoise`), since the training runtime applies them too.

A policy builds one `GoodputModel` per job state (perf and gradient parameters, batch
limits); its answers are memoised on it, so a round asks as often as it likes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from functools import lru_cache
from typing import Any, NamedTuple

import numpy as np

from jigsaw.gradnoise import GradParams, check_batch, efficiency, efficiency_at_scale

# Network terms the measurements cannot tell are fixed here: no cost (Pollux's choice,
# optimistic, so a policy tries the size and then learns it).
_UNSEEN = 1e-8
_MAX_SECONDS = 1e4
_GAMMA_RANGE = (1.0, 10.0)
# Batch sizes best_batch tries, spaced geometrically between the limits (AdaptDL: 50).
_CANDIDATES = 64


@dataclass(frozen=True)
class PerfParams:
    """Pollux's step-time model (the module docstring has the formula)."""

    alpha_c: float  # seconds of a micro-batch's compute, fixed part
    beta_c: float  # ... and per sample
    alpha_n: float  # seconds of synchronisation over nodes, fixed part
    beta_n: float  # ... and per GPU beyond two
    alpha_r: float  # seconds of synchronisation within a node, fixed part
    beta_r: float  # ... and per GPU beyond two
    gamma: float  # overlap of synchronisation with compute, in [1, 10]

    def __post_init__(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{item.name} must be finite and >= 0, not {value!r}")
        if not _GAMMA_RANGE[0] <= self.gamma <= _GAMMA_RANGE[1]:
            raise ValueError(f"gamma must be in {list(_GAMMA_RANGE)}, not {self.gamma!r}")

    def as_array(self) -> np.ndarray:
        return np.array([getattr(self, item.name) for item in fields(self)])

    def step_seconds(self, nodes: int, workers: int, per_gpu: float, accum_steps: int = 0) -> float:
        """Seconds per optimizer step: `accum_steps` + 1 micro-batches of `per_gpu`."""
        _check_size(workers, nodes)
        step, _ = _predict(self.as_array(), nodes, workers, per_gpu, accum_steps)
        return float(step)

    def sync_seconds(self, nodes: int, workers: int, per_gpu: float) -> float:
        """The part of a step spent waiting for synchronisation after the compute."""
        _check_size(workers, nodes)
        step, compute = _predict(self.as_array(), nodes, workers, per_gpu, 0)
        return max(float(step - compute), 0.0)  # no rounding below zero


def _predict(params: np.ndarray, nodes: Any, workers: Any, per_gpu: Any, accum: Any) -> Any:
    """(step seconds, compute seconds of one micro-batch), elementwise."""
    alpha_c, beta_c, alpha_n, beta_n, alpha_r, beta_r, gamma = params
    compute = alpha_c + beta_c * np.asarray(per_gpu, dtype=float)
    workers = np.asarray(workers)
    # A ring all-reduce moves 2(w - 1)/w of the gradient through each GPU's link (1 at
    # w = 2, where Pollux's alpha is measured); beta is the per-hop latency beyond two.
    ring = 2.0 * (workers - 1) / np.maximum(workers, 1)
    beyond_two = np.maximum(workers - 2, 0)
    network = np.where(
        np.asarray(nodes) > 1,
        alpha_n * ring + beta_n * beyond_two,
        alpha_r * ring + beta_r * beyond_two,
    )
    # The gamma-norm: log-sum-exp form, so a large gamma cannot overflow.
    log_c, log_n = np.log(np.maximum(compute, 1e-300)), np.log(np.maximum(network, 1e-300))
    top = np.maximum(log_c, log_n)
    optim = np.exp(
        top + np.log(np.exp(gamma * (log_c - top)) + np.exp(gamma * (log_n - top))) / gamma
    )
    return np.asarray(accum) * compute + optim, compute


def _check_size(workers: int, nodes: int) -> None:
    if not (isinstance(workers, int | np.integer) and isinstance(nodes, int | np.integer)):
        raise ValueError(f"workers and nodes must be integers, not {workers!r} and {nodes!r}")
    if not 1 <= nodes <= workers:
        raise ValueError(f"need 1 <= nodes <= workers, not {nodes} nodes for {workers} GPUs")


@dataclass(frozen=True)
class StepSample:
    """One measured configuration: seconds per optimizer step, and of it the wait for
    synchronisation, at `per_gpu` samples per micro-batch with `accum_steps`
    micro-batches accumulated before the synchronised one."""

    nodes: int
    workers: int
    per_gpu: float
    step_seconds: float
    sync_seconds: float
    accum_steps: int = 0

    def __post_init__(self) -> None:
        _check_size(self.workers, self.nodes)
        check_batch("per_gpu", self.per_gpu)
        if not (isinstance(self.accum_steps, int) and self.accum_steps >= 0):
            raise ValueError(f"accum_steps must be an integer >= 0, not {self.accum_steps!r}")
        if not (math.isfinite(self.step_seconds) and 0 < self.step_seconds < _MAX_SECONDS):
            raise ValueError(
                f"step_seconds must be in (0, {_MAX_SECONDS:g}), not {self.step_seconds!r}"
            )
        if not (math.isfinite(self.sync_seconds) and 0 <= self.sync_seconds < self.step_seconds):
            raise ValueError(
                f"sync_seconds must be in [0, step_seconds={self.step_seconds!r}), "
                f"not {self.sync_seconds!r}"
            )

    @property
    def compute_seconds(self) -> float:
        """One micro-batch's compute: the step less the synchronisation wait, shared
        evenly by the micro-batches."""
        return (self.step_seconds - self.sync_seconds) / (self.accum_steps + 1)


def profile_samples(rows: Iterable[Mapping[str, str]]) -> list[StepSample]:
    """Samples from rows of a Pollux application profile: `placements.csv` (`placement`
    as GPUs per node, e.g. "22") or `scalability.csv` (`num_nodes`, `num_replicas`),
    with `local_bsz`, `step_time` and `sync_time`."""
    samples = []
    for number, row in enumerate(rows, start=1):
        try:
            if "placement" in row:
                digits = [int(d) for d in row["placement"].strip()]
                if not digits or min(digits) < 1:
                    raise ValueError(f"placement {row['placement']!r} is not GPUs per node")
                nodes, workers = len(digits), sum(digits)
            else:
                nodes, workers = int(row["num_nodes"]), int(row["num_replicas"])
            samples.append(
                StepSample(
                    nodes,
                    workers,
                    float(row["local_bsz"]),
                    float(row["step_time"]),
                    float(row["sync_time"]),
                )
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"profile row {number}: {exc}") from exc
    return samples


_NAMES = [item.name for item in fields(PerfParams)]
_GAMMA = _NAMES.index("gamma")
_LOGGED = np.arange(len(_NAMES)) != _GAMMA  # fitted as logarithms: positive, any scale
# Weights of the priors against the mean squared log error of the fit: a smaller gamma
# and little retrogression (Pollux's regularisation, rescaled to squared errors).
_GAMMA_WEIGHT = 0.003
_RETROGRESSION_WEIGHT = 0.01


def fit_throughput(samples: Iterable[StepSample]) -> PerfParams:
    """Fit `PerfParams` to measured steps, as Pollux's `fit_perf_params` does.

    Bounded least squares on the log of each micro-batch's compute time and of each
    step time, with priors for what the samples cannot show: with one per-GPU batch
    seen, the fixed part of compute is half of it; the network terms of a kind of
    placement never seen (over nodes, within a node, beyond two GPUs) cost nothing, so
    the model is optimistic about sizes not yet run, except that synchronisation over
    nodes is never cheaper than 1.1 times within a node. One sample is enough; each
    new size measured corrects the optimism.
    """
    samples = list(samples)
    if not samples:
        raise ValueError("need at least one measured step to fit a throughput model")
    nodes = np.array([s.nodes for s in samples])
    workers = np.array([s.workers for s in samples])
    per_gpu = np.array([s.per_gpu for s in samples], dtype=float)
    accum = np.array([s.accum_steps for s in samples])
    compute = np.array([s.compute_seconds for s in samples])
    sync = np.array([s.sync_seconds for s in samples])
    log_compute = np.log(compute)
    log_step = np.log([s.step_seconds for s in samples])

    start = np.full(len(_NAMES), _UNSEEN)
    start[_GAMMA] = 1.0
    free = np.zeros(len(_NAMES), dtype=bool)
    if len(np.unique(per_gpu)) > 1:
        slope, intercept = np.polyfit(per_gpu, compute, 1)
        start[0] = max(intercept, compute.min() / 10)
        start[1] = max(slope, compute.min() / per_gpu.max() / 10)
        free[0:2] = True
    else:
        start[0] = compute.mean() / 2
        start[1] = compute.mean() / 2 / per_gpu[0]
        free[1] = True
    for alpha, beta, seen in ((2, 3, nodes > 1), (4, 5, (nodes == 1) & (workers > 1))):
        if seen.any():
            start[alpha] = max(float(np.median(sync[seen])), 1e-6)
            free[alpha] = True
            if (seen & (workers > 2)).any():
                start[beta] = start[alpha] / 10
                free[beta] = True
    free[_GAMMA] = bool((workers > 1).any())

    def unpack(x: np.ndarray) -> np.ndarray:
        params = start.copy()
        params[free] = np.where(_LOGGED[free], np.exp(x), x)
        return params

    weight = 1.0 / math.sqrt(len(samples))

    def residuals(x: np.ndarray) -> np.ndarray:
        params = unpack(x)
        step, compute = _predict(params, nodes, workers, per_gpu, accum)
        priors = [_GAMMA_WEIGHT * (params[_GAMMA] - 1.0)]
        priors += [_RETROGRESSION_WEIGHT * params[b] / params[a] for a, b in ((2, 3), (4, 5))]
        return np.concatenate(
            [weight * (np.log(compute) - log_compute), weight * (np.log(step) - log_step), priors]
        )

    lower = np.where(_LOGGED, math.log(_UNSEEN), _GAMMA_RANGE[0])[free]
    upper = np.where(_LOGGED, math.log(_MAX_SECONDS), _GAMMA_RANGE[1])[free]
    x0 = np.clip(np.where(_LOGGED, np.log(start), start)[free], lower + 1e-9, upper - 1e-9)
    # Imported here: scipy.optimize takes most of a second to import, which every CLI
    # command (through `jigsaw simulate`'s registration) would pay for nothing.
    import scipy.optimize

    fitted = scipy.optimize.least_squares(residuals, x0, bounds=(lower, upper), method="trf")
    params = unpack(fitted.x)
    if not free[2]:
        # Never seen over nodes: no cheaper than within a node (Pollux's prior).
        params[2] = max(params[2], 1.1 * params[4])
        params[3] = max(params[3], 1.1 * params[5])
    return PerfParams(*(float(v) for v in params))


@dataclass(frozen=True)
class BatchLimits:
    """What batch sizes a job allows: the global batch it was tuned at (`base`:
    efficiency and the learning rate are relative to it), the global range the policy
    may choose from (a fixed job: `min` = `max` = `base`), and the per-GPU micro-batch
    range (`max_per_gpu`: what fits in memory; more per GPU runs as accumulation)."""

    base: int
    min: int
    max: int
    max_per_gpu: int
    min_per_gpu: int = 1

    def __post_init__(self) -> None:
        for item in fields(self):
            if not isinstance(getattr(self, item.name), int):
                raise ValueError(f"batch limit {item.name} must be an integer")
        if not 1 <= self.min <= self.base <= self.max:
            raise ValueError(
                f"need 1 <= min <= base <= max, not min={self.min} base={self.base} max={self.max}"
            )
        if not 1 <= self.min_per_gpu <= self.max_per_gpu:
            raise ValueError(
                "need 1 <= min_per_gpu <= max_per_gpu, "
                f"not {self.min_per_gpu} and {self.max_per_gpu}"
            )

    @classmethod
    def fixed(cls, batch: int, max_per_gpu: int) -> BatchLimits:
        return cls(batch, batch, batch, max_per_gpu)


class BatchChoice(NamedTuple):
    """A global batch and how it runs: `batch` split as evenly as it goes over
    `workers` x (`accum_steps` + 1) micro-batches, the largest of them `per_gpu`."""

    batch: int
    per_gpu: int
    accum_steps: int
    goodput: float


def split_batch(batch: Any, workers: int, limits: BatchLimits) -> tuple[Any, Any, Any]:
    """(largest micro-batch, accumulation steps, whether it runs) of a global batch on
    `workers` GPUs, elementwise: as few micro-batches as memory allows, and on one GPU a
    job that adapts its batch runs at least two, at its base batch too, as the runtime
    does (`jigsaw.elastic.nearest_split`: the gradient noise is measured between
    micro-batches, so one alone cannot estimate it)."""
    batch = np.asarray(batch)
    accum = np.ceil(batch / (workers * limits.max_per_gpu) - 1e-9).astype(int) - 1
    if workers == 1 and limits.max > limits.min:
        accum = np.where(batch >= 2, np.maximum(accum, 1), accum)
    micro_batches = workers * (accum + 1)
    per_gpu = np.ceil(batch / micro_batches - 1e-9).astype(int)
    runs = batch // micro_batches >= limits.min_per_gpu
    return per_gpu, accum, runs


def _candidates(workers: int, limits: BatchLimits, low: int) -> np.ndarray:
    """Batch sizes worth trying: spaced geometrically over the range, where goodput is
    smooth, and the ends of each number of micro-batches per GPU (k of them full, or
    each at the least allowed), where goodput jumps as one more micro-batch is needed;
    each also rounded to a whole number of samples per micro-batch (the largest
    micro-batch sets the pace, so between multiples goodput saw-tooths)."""
    counts = np.unique(
        np.concatenate(
            [
                np.arange(1, 9),
                np.rint(np.geomspace(1, max(1, limits.max // (workers * limits.min_per_gpu)), 48)),
            ]
        )
    )
    batch = np.concatenate(
        [
            np.rint(np.geomspace(low, limits.max, _CANDIDATES)),
            workers * counts * limits.max_per_gpu,
            workers * counts * limits.min_per_gpu,
            [low, limits.max, limits.base],
        ]
    ).astype(int)
    _, accum, _ = split_batch(batch, workers, limits)
    micro_batches = workers * (accum + 1)
    rounded = [batch // micro_batches * micro_batches, -(-batch // micro_batches) * micro_batches]
    batch = np.concatenate([batch, *rounded])
    return np.unique(batch[(low <= batch) & (batch <= limits.max)])


@lru_cache(maxsize=1 << 11)  # a simulation's applications x placements; up to 8 kB each
def _throughputs(
    perf: PerfParams, limits: BatchLimits, workers: int, nodes: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """(candidate batches, their largest micro-batch, accumulation steps, throughput,
    -inf where a batch cannot be split so) on `workers` GPUs over `nodes` nodes; None
    when no batch in the limits reaches every GPU. Only the gradient noise changes from
    epoch to epoch, so a simulation asks this again for every job and epoch of the same
    application: cached, read-only."""
    low = max(limits.min, workers * limits.min_per_gpu)
    if low > limits.max:
        return None
    batch = _candidates(workers, limits, low)
    per_gpu, accum, runs = split_batch(batch, workers, limits)
    step, _ = _predict(perf.as_array(), nodes, workers, per_gpu, accum)
    throughput = np.where(runs, batch / step, -np.inf)
    arrays = (batch, per_gpu, accum, throughput)
    for array in arrays:
        array.setflags(write=False)
    return arrays


@dataclass(frozen=True)
class GoodputModel:
    """A job's goodput by size and batch: fitted throughput, measured gradient noise,
    its batch limits. `speedup` is relative to its goodput at `base_workers` GPUs over
    `base_nodes` nodes (Pollux: one GPU)."""

    perf: PerfParams
    grad: GradParams
    limits: BatchLimits
    base_workers: int = 1
    base_nodes: int = 1
    _memo: dict[tuple[object, ...], Any] = field(
        default_factory=dict, init=False, compare=False, hash=False, repr=False
    )

    def __post_init__(self) -> None:
        _check_size(self.base_workers, self.base_nodes)

    def efficiency(self, batch: float) -> float:
        return efficiency(self.grad, self.limits.base, batch)

    def throughput(self, workers: int, nodes: int, batch: int) -> float:
        """Samples per second at a global batch (0 when it cannot be split so)."""
        per_gpu, accum, runs = self._split(workers, nodes, batch)
        if not runs:
            return 0.0
        return batch / self.perf.step_seconds(nodes, workers, per_gpu, accum)

    def goodput(self, workers: int, nodes: int, batch: int) -> float:
        """Throughput x efficiency at a global batch, whatever the limits' range (a
        policy may price a fixed job's batch); 0 when it cannot be split so."""
        return self.throughput(workers, nodes, batch) * self.efficiency(batch)

    def _split(self, workers: int, nodes: int, batch: int) -> tuple[int, int, bool]:
        _check_size(workers, nodes)
        if not (isinstance(batch, int | np.integer) and batch >= 1):
            raise ValueError(f"batch must be a positive integer, not {batch!r}")
        per_gpu, accum, runs = split_batch(batch, workers, self.limits)
        return int(per_gpu), int(accum), bool(runs)

    def best_batch(self, workers: int, nodes: int) -> BatchChoice | None:
        """The global batch in the limits with the most goodput on `workers` GPUs over
        `nodes` nodes (ties: the smallest), None when no batch in them splits so."""
        key = ("best", workers, nodes)
        if key in self._memo:
            return self._memo[key]
        _check_size(workers, nodes)
        choice = None
        grid = _throughputs(self.perf, self.limits, workers, nodes)
        if grid is not None:
            batch, per_gpu, accum, throughput = grid
            goodput = throughput * efficiency_at_scale(self.grad, batch / self.limits.base)
            best = int(np.argmax(goodput))
            if goodput[best] > -np.inf:
                choice = BatchChoice(
                    int(batch[best]), int(per_gpu[best]), int(accum[best]), float(goodput[best])
                )
        self._memo[key] = choice
        return choice

    def speedup(self, workers: int, nodes: int) -> float:
        """Best goodput at this size over best goodput at the base size (0: no batch in
        the limits runs at this size)."""
        base = self.best_batch(self.base_workers, self.base_nodes)
        if base is None:
            raise ValueError(
                f"no batch in {self.limits} runs at the base size "
                f"({self.base_workers} GPUs over {self.base_nodes} nodes)"
            )
        choice = self.best_batch(workers, nodes)
        return 0.0 if choice is None else choice.goodput / base.goodput
