"""How short a makespan any schedule could reach: a lower bound on finishing a set of
jobs, used by JigSaw to pace the jobs that would otherwise set the makespan, and by the
simulator to say how much of the possible gain in cluster efficiency a policy attains.

Every job must finish by the makespan T, and the cluster can spend at most GPUs x T
GPU-seconds. A job finishing within T costs at least the least GPU-seconds of any way
to run it within T: at one size, node count and SPB configuration, or a mix of two (run
part of it wide, the rest narrow), which is the lower convex hull of its (time,
GPU-seconds) points. The smallest T where those least costs fit in GPUs x T, and where
every job can finish at all, is the bound.

It is a relaxation, so no schedule beats it: it knows every job's length, moves work
between sizes at no cost (no restarts), ignores which node a GPU is on (whole-node
gangs, fragmentation) and lets GPU-seconds flow between jobs freely. It assumes one job
per GPU at a time: co-location (JigSaw's packing) could in principle beat it, by the
idle time of partial workers it fills.

A job partly done is its whole curve scaled: a fraction f of its work left takes f of
the time and f of the GPU-seconds of every way to run it, so a curve is computed once
per job and scaled by what is left.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Iterable, Sequence

from jigsaw.jobspec import SPBConfig
from scheduler.core.jobmodel import JobModel

# (seconds to finish, GPU-seconds it costs), fastest first.
Curve = list[tuple[float, float]]


def hull(points: Iterable[tuple[float, float]]) -> Curve:
    """The corners of the lower convex hull of (seconds, GPU-seconds) ways to run a job
    that a slower way makes cheaper (a slower way that costs no less is never worth it)."""
    corners: Curve = []
    for point in sorted(set(points)):
        # Monotone chain: drop the last corner while it lies on or above the chord.
        while len(corners) >= 2 and _cross(corners[-2], corners[-1], point) <= 0:
            corners.pop()
        corners.append(point)
    falling = corners[:1]
    for point in corners[1:]:
        if point[1] < falling[-1][1]:
            falling.append(point)
    return falling


def cost_curve(model: JobModel, configs: Sequence[SPBConfig | None]) -> Curve:
    """The least GPU-seconds that finish the whole job within a time, as the corners of
    the lower convex hull of its ways to run (slower corners cost less)."""
    points = []
    for workers in model.sizes:
        for nodes in model.steps[workers]:
            for config in configs:
                shape = model.shape(config, workers, nodes)
                seconds = model.iterations_total * shape.step_seconds * shape.steps_ratio
                if math.isfinite(seconds):
                    points.append((seconds, workers * seconds))
    return hull(points)


def _cross(a: tuple[float, float], b: tuple[float, float], c: tuple[float, float]) -> float:
    return (b[0] - a[0]) * (c[1] - a[1]) - (b[1] - a[1]) * (c[0] - a[0])


def least_cost(curve: Curve, seconds: float, scale: float = 1.0) -> float:
    """GPU-seconds to finish within `seconds` (inf: it cannot) with `scale` of the
    curve's work left."""
    if scale <= 0:
        return 0.0
    seconds /= scale
    if seconds < curve[0][0]:
        return math.inf
    for (t0, c0), (t1, c1) in zip(curve, curve[1:], strict=False):
        if seconds <= t1:
            return scale * (c0 + (c1 - c0) * (seconds - t0) / (t1 - t0))
    return scale * curve[-1][1]


def shortest_makespan(work: Sequence[tuple[Curve, float]], gpus: int) -> float:
    """The least makespan of jobs given as (curve, share of its work left) on `gpus`
    GPUs (see the module docstring for what it relaxes).

    The least T at which the least costs fit, sum(cost_j(T)) <= gpus x T. Each cost is
    piecewise linear and falls as T grows, so their excess over gpus x T is too: it
    is walked from the least T at which every job can finish (its fastest way) through
    the corners where a cost's slope changes, in time order, to the segment where it
    reaches zero. O(C log C) for C corners in all, and exact.
    """
    work = [(curve, scale) for curve, scale in work if curve and scale > 0]
    if not work or gpus < 1:
        return 0.0
    start = max(scale * curve[0][0] for curve, scale in work)
    excess, slope = -gpus * start, -float(gpus)
    changes: list[tuple[float, float]] = []  # (time, change of slope there)
    for curve, scale in work:
        # The segment of the curve `start` falls in, in the curve's own time (the job
        # that sets `start` may land a rounding error before its first corner).
        segment = max(bisect_right(curve, (start / scale, math.inf)) - 1, 0)
        slopes = [_slope(curve, k) for k in range(len(curve))]
        t, c = curve[segment]
        excess += scale * c + slopes[segment] * (start - scale * t)
        slope += slopes[segment]
        for k in range(segment + 1, len(curve)):
            changes.append((scale * curve[k][0], slopes[k] - slopes[k - 1]))
    if excess <= 0:
        return start
    at = start
    for time, change in sorted(changes):
        reach = excess + slope * (time - at)
        if reach <= 0:
            break
        excess, at = reach, time
        slope += change
    return at - excess / slope


def _slope(curve: Curve, k: int) -> float:
    """GPU-seconds per second of the segment from corner k (0 past the last corner)."""
    if k + 1 >= len(curve):
        return 0.0
    (t0, c0), (t1, c1) = curve[k], curve[k + 1]
    return (c1 - c0) / (t1 - t0)


def makespan_lower_bound(
    models: Iterable[JobModel], gpus: int, configs: Sequence[SPBConfig | None] = (None,)
) -> float:
    """The least makespan of the jobs submitted together on `gpus` GPUs."""
    return shortest_makespan([(cost_curve(model, configs), 1.0) for model in models], gpus)
