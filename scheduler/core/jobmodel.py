"""What a policy may know of a job's speed, and what co-locating jobs on a GPU costs.

The simulator fills a `JobModel` from measured application profiles; on the real
cluster it comes from the job's measured iterations and its SPB profile when known
(a policy given no model falls back to what it can do without one). The co-location
rule is here, not in the simulator, because a policy that packs jobs must predict
exactly what the simulator (or the cluster) will then charge: the measured
interference model of `scheduler.core.interference`, fed each worker's solo
utilization.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from jigsaw import spb
from jigsaw.jobspec import SPBConfig
from scheduler.core.interference import InterferenceModel


@dataclass(frozen=True)
class Shape:
    """One way to run a job: its iteration time, each worker's GPU demand, its price."""

    config: SPBConfig | None  # None: full backprop
    step_seconds: float  # one iteration alone on its GPUs (compute of the slowest + sync)
    sync_seconds: float
    worker_compute_seconds: tuple[float, ...]  # by rank
    worker_memory_bytes: tuple[int, ...]  # by rank
    steps_ratio: float  # iterations needed relative to full backprop
    # Fraction of the GPU a worker keeps busy while it computes (None: not measured).
    intensity: float | None = None

    @cached_property
    def demands(self) -> tuple[float, ...]:
        """Fraction of each worker's step spent computing; the rest is slack."""
        return tuple(c / self.step_seconds for c in self.worker_compute_seconds)

    @cached_property
    def utilizations(self) -> tuple[float, ...] | None:
        """Each worker's solo GPU utilization (0-1) in this shape: busy while it
        computes, idle while it waits at the synchronisation (None: not measured)."""
        if self.intensity is None:
            return None
        return tuple(min(1.0, self.intensity * d) for d in self.demands)

    @property
    def progress_per_second(self) -> float:
        """Full-backprop-equivalent iterations per second alone on its GPUs."""
        return 1.0 / (self.step_seconds * self.steps_ratio)


@dataclass(frozen=True, eq=False)
class JobModel:
    """A job's speed by how many GPUs it gets and how many nodes they span.

    `steps[w][n]` = (seconds per iteration, of them in synchronisation) at full
    backprop on w GPUs over n nodes, at the job's global batch size; `workers` is what
    it asked for (its run alone there is the yardstick of useful work). A missing n
    uses the nearest known. Sizes other than `workers` are the ones the job may be
    resized to (none: it runs only as asked). `memory_bytes`: per GPU at full
    backprop, `activation_fraction` of it saved activations (what a partial worker
    holds less of). `spb_profile`: the per-stage costs that price SPB configurations
    (None: SPB not available for this job). `utilization`: the solo GPU utilization
    (0-1, NVML's) of a worker at full backprop on `workers` GPUs, measured (None: not
    known, and then the job is never packed). `batches[w][n]`: the global batch a job
    that adapts its batch size runs at there (the one with the most goodput,
    `scheduler.core.goodput`); its `steps` are then seconds per step of the base batch's
    statistical progress and `iterations_total` that progress (empty: a fixed batch).
    `batch_gain`: how much more goodput such a job running makes at the best batch of
    the size it holds than at the batch it reported last (0: none, or not known).

    Compared and hashed by identity: it never changes, so what a policy derives from
    it alone is cached per model (`functools.lru_cache`), and its tables are dicts.
    """

    iterations_total: int
    workers: int
    steps: Mapping[int, Mapping[int, tuple[float, float]]]
    memory_bytes: int = 0
    activation_fraction: float = 0.0
    spb_profile: spb.SPBProfile | None = None
    utilization: float | None = None
    batches: Mapping[int, Mapping[int, int]] = field(default_factory=dict)
    batch_gain: float = 0.0
    _shapes: dict[tuple[int, int, tuple[float, float, int] | None], Shape] = field(
        default_factory=dict, compare=False, hash=False, repr=False
    )

    @cached_property
    def sizes(self) -> tuple[int, ...]:
        return tuple(sorted(self.steps))

    def step_at(self, workers: int, nodes: int) -> tuple[float, float]:
        by_nodes = self.steps[workers]
        if nodes in by_nodes:
            return by_nodes[nodes]
        return by_nodes[min(by_nodes, key=lambda n: (abs(n - nodes), n))]

    @cached_property
    def intensity(self) -> float | None:
        """How busy a worker keeps its GPU while it computes: the measured utilization
        over the share of the step it computes at the size it asked for (what a shape
        scales by its own compute share)."""
        if self.utilization is None:
            return None
        step, sync = self.step_at(self.workers, min(self.steps[self.workers]))
        share = (step - min(sync, step)) / step if step > 0 else 1.0
        return min(1.0, self.utilization / share) if share > 0 else 1.0

    def batch_at(self, workers: int, nodes: int) -> int:
        """The global batch an adaptive job runs at there (0: a fixed batch)."""
        by_nodes = self.batches.get(workers)
        if not by_nodes:
            return 0
        return by_nodes[min(by_nodes, key=lambda n: (abs(n - nodes), n))]

    @property
    def alone_step_seconds(self) -> float:
        """An iteration on the GPUs it asked for, on the fewest nodes, full backprop."""
        return self.step_at(self.workers, min(self.steps[self.workers]))[0]

    def shape(self, config: SPBConfig | None, workers: int, nodes: int = 1) -> Shape:
        """The job's shape under `config` on `workers` GPUs spanning `nodes` nodes.

        Measured step and sync times are at full backprop; the SPB profile scales the
        compute of each worker (its depth) and the bytes synchronised (the contributors
        of each stage), the first-order model of `jigsaw.spb.job_cost`.
        """
        key = (workers, nodes, _config_fields(config))
        cached = self._shapes.get(key)
        if cached is not None:
            return cached
        step, sync = self.step_at(workers, nodes)
        sync = min(sync, step)
        compute = step - sync
        if config is None or self.spb_profile is None:
            shape = Shape(
                None,
                step,
                sync,
                (compute,) * workers,
                (self.memory_bytes,) * workers,
                1.0,
                self.intensity,
            )
        else:
            full = spb.job_cost(self.spb_profile, None, workers)
            cost = spb.job_cost(self.spb_profile, config, workers)
            base_compute = full.iteration_compute_seconds
            base_activations = max(full.worker_activation_bytes) or 1
            worker_compute = tuple(compute * c / base_compute for c in cost.worker_compute_seconds)
            byte_ratio = (
                cost.bytes_exchanged / full.bytes_exchanged if full.bytes_exchanged else 1.0
            )
            scaled_sync = sync * byte_ratio
            kept = 1.0 - self.activation_fraction
            memory = tuple(
                int(self.memory_bytes * (kept + self.activation_fraction * a / base_activations))
                for a in cost.worker_activation_bytes
            )
            ratio = cost.steps_ratio
            shape = Shape(
                config,
                max(worker_compute) + scaled_sync,
                scaled_sync,
                worker_compute,
                memory,
                ratio if ratio is not None else float("inf"),
                self.intensity,
            )
        self._shapes[key] = shape
        return shape


def _config_fields(config: SPBConfig | None) -> tuple[float, float, int] | None:
    if config is None:
        return None
    return (config.full_fraction, config.partial_depth, config.rotation_period)


def colocation_stretch(
    workers: Sequence[tuple[int, float | None]], model: InterferenceModel
) -> dict[int, float]:
    """How many times longer each job's compute takes on one GPU shared by `workers`,
    `(job_id, solo utilization)` of every worker there (None: not measured, taken as
    saturating). A GPU with one job runs it at full speed; a job with two workers there
    is one co-runner at their summed utilization."""
    by_job: dict[int, float] = {}
    for job_id, utilization in workers:
        busy = 1.0 if utilization is None else utilization
        by_job[job_id] = min(1.0, by_job.get(job_id, 0.0) + busy)
    if len(by_job) < 2:
        return dict.fromkeys(by_job, 1.0)
    return dict(zip(by_job, model.stretch(list(by_job.values())), strict=True))


def stretched_step(shape: Shape, factors: Iterable[float]) -> float:
    """A job's iteration time when its workers' GPUs stretch their compute by `factors`
    (by rank): the slowest worker sets the pace, so slack on partial workers absorbs
    a guest's interference."""
    slowest = max(c * f for c, f in zip(shape.worker_compute_seconds, factors, strict=True))
    return slowest + shape.sync_seconds
