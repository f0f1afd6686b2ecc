"""What JigSaw derives from a job's speed model alone: its step time, progress per GPU
and cost curve by size on the fewest nodes, its efficient size, its time to go.

Pure functions of the (immutable) model, cached across rounds: a job's model lives as
long as the job in the simulator, and the live loop builds one per round.
"""

from __future__ import annotations

from functools import lru_cache

from scheduler.core.jobmodel import JobModel
from scheduler.core.makespan import Curve, hull
from scheduler.core.snapshot import JobView

_CACHED = 1 << 16  # entries per function: the active jobs' sizes, several rounds over


@lru_cache(maxsize=_CACHED)
def steps_by_size(model: JobModel, per_node: int) -> dict[int, float]:
    """Seconds per iteration by size, on the fewest nodes, full backprop."""
    return {workers: model.step_at(workers, -(-workers // per_node))[0] for workers in model.sizes}


@lru_cache(maxsize=_CACHED)
def per_gpu_values(model: JobModel, per_node: int) -> dict[int, float]:
    """Progress per GPU by size, on the fewest nodes (relative units)."""
    steps = steps_by_size(model, per_node)
    return {workers: 1.0 / (step * workers) for workers, step in steps.items()}


@lru_cache(maxsize=_CACHED)
def curve(model: JobModel, per_node: int) -> Curve:
    """The (seconds, GPU-seconds) per iteration by size, on the fewest nodes at full
    backprop, as a lower convex hull (`scheduler.core.makespan.hull`)."""
    return hull((t, w * t) for w, t in steps_by_size(model, per_node).items())


@lru_cache(maxsize=_CACHED)
def fastest_size(model: JobModel, per_node: int) -> int:
    """The size with the shortest step on the fewest nodes (the fewer GPUs on a tie)."""
    steps = steps_by_size(model, per_node)
    return min(steps, key=lambda w: (steps[w], w))


def efficient_size(job: JobView, per_node: int, floor: float) -> int:
    """The most GPUs, up to what it asked for and its fastest size, the job runs on at
    no less than `floor` of its best useful progress per GPU (a job that asked for
    more GPUs than it can use well gets fewer; a job whose speed is known only as
    asked gets what it asked)."""
    if job.model is None or len(job.model.sizes) < 2:
        return job.workers
    return _efficient_size(job.model, job.workers, per_node, floor)


@lru_cache(maxsize=_CACHED)
def _efficient_size(model: JobModel, asked: int, per_node: int, floor: float) -> int:
    # Shrink only: sizes above what the job asked for are for growing into idle GPUs.
    # Never wider than its fastest size: GPUs past it slow the job down (an adaptive
    # job's goodput can peak below what it asked for, its batch then too inefficient).
    values = per_gpu_values(model, per_node)
    sizes = [w for w in values if w <= min(asked, fastest_size(model, per_node))]
    best = max(values[w] for w in sizes)
    return max(w for w in sizes if values[w] >= floor * best)


def left(job: JobView) -> int:
    """Iterations the job has still to run."""
    assert job.model is not None
    return max(job.model.iterations_total - job.iterations_done, 0)


def remaining_on(job: JobView, workers: int, nodes: int) -> float:
    """Seconds to finish on `workers` GPUs spanning `nodes` nodes, full backprop."""
    assert job.model is not None
    return left(job) * job.model.step_at(workers, nodes)[0]


def remaining_seconds_at(job: JobView, workers: int, per_node: int) -> float:
    """Seconds to finish on `workers` GPUs on the fewest nodes, full backprop."""
    return remaining_on(job, workers, -(-workers // per_node))


def least(job: JobView, per_node: int) -> tuple[float, float]:
    """The fewest GPU-seconds and the fewest seconds the job needs to finish, over its
    sizes on the fewest nodes, full backprop: its cost curve's cheapest and fastest
    ends."""
    assert job.model is not None
    costs, to_go = curve(job.model, per_node), left(job)
    return to_go * costs[-1][1], to_go * costs[0][0]


def outlasts(job: JobView, per_node: int, seconds: float) -> bool:
    """Whether the job needs at least `seconds` even at its fastest size (0: never)."""
    return bool(seconds) and job.model is not None and least(job, per_node)[1] >= seconds
