"""How short a makespan any schedule could reach: a lower bound, to say how much of the
possible gain in cluster efficiency a policy attains.

Submitted together at time 0, every job must finish by the makespan T, and the
cluster can spend at most GPUs x T GPU-seconds. A job finishing within T costs at least
the least GPU-seconds of any way to run it within T: at one size, node count and SPB
configuration, or a mix of two (run part of it wide, the rest narrow), which is the
lower convex hull of its (time, GPU-seconds) points. The smallest T where those least
costs fit in GPUs x T, and where every job can finish at all, is the bound.

It is a relaxation, so no schedule beats it: it knows every job's length, moves work
between sizes at no cost (no restarts), ignores which node a GPU is on (whole-node
gangs, fragmentation) and lets GPU-seconds flow between jobs freely. It assumes one job
per GPU at a time: co-location (JigSaw's packing) could in principle beat it, by the
idle time of partial workers it fills.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from scheduler.jobmodel import JobModel
from scheduler.jobspec import SPBConfig

# (seconds to finish, GPU-seconds it costs), fastest first.
Curve = list[tuple[float, float]]


def cost_curve(model: JobModel, configs: Sequence[SPBConfig | None]) -> Curve:
    """The least GPU-seconds that finish the job within a time, as the corners of the
    lower convex hull of its ways to run (slower corners cost less)."""
    points = set()
    for workers in model.sizes:
        for nodes in model.steps[workers]:
            for config in configs:
                shape = model.shape(config, workers, nodes)
                seconds = model.iterations_total * shape.step_seconds * shape.steps_ratio
                if math.isfinite(seconds):
                    points.add((seconds, workers * seconds))
    hull: Curve = []
    for point in sorted(points):
        # Monotone chain: drop the last corner while it lies on or above the chord.
        while len(hull) >= 2 and _cross(hull[-2], hull[-1], point) <= 0:
            hull.pop()
        hull.append(point)
    # A slower way that costs no less is never worth it: keep the falling part.
    falling = hull[:1]
    for point in hull[1:]:
        if point[1] < falling[-1][1]:
            falling.append(point)
    return falling


def _cross(a: tuple[float, float], b: tuple[float, float], c: tuple[float, float]) -> float:
    return (b[0] - a[0]) * (c[1] - a[1]) - (b[1] - a[1]) * (c[0] - a[0])


def least_cost(curve: Curve, seconds: float) -> float:
    """GPU-seconds to finish within `seconds` (inf: it cannot)."""
    if seconds < curve[0][0]:
        return math.inf
    for (t0, c0), (t1, c1) in zip(curve, curve[1:], strict=False):
        if seconds <= t1:
            return c0 + (c1 - c0) * (seconds - t0) / (t1 - t0)
    return curve[-1][1]


def makespan_lower_bound(
    models: Iterable[JobModel],
    gpus: int,
    configs: Sequence[SPBConfig | None] = (None,),
    *,
    tolerance: float = 1e-6,
) -> float:
    """The least makespan of the jobs submitted together on `gpus` GPUs (see the module
    docstring for what it relaxes), to a relative `tolerance`."""
    curves = [cost_curve(model, configs) for model in models]
    if not curves:
        return 0.0
    # Feasible at `high`: every job runs its cheapest way, which then fits in time and
    # in GPU-seconds; infeasible below the slowest job's fastest way.
    low = max(curve[0][0] for curve in curves)
    high = max(low, sum(curve[-1][1] for curve in curves) / gpus, max(c[-1][0] for c in curves))
    while high - low > tolerance * high:
        middle = (low + high) / 2
        if sum(least_cost(curve, middle) for curve in curves) <= gpus * middle:
            high = middle
        else:
            low = middle
    return high
