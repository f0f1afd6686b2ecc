"""Pollux's sharing objective (Qiao et al., OSDI 2021), solved exactly: the GPU count of
every job that maximises the power mean (p = -1) of the jobs' goodput speedups.

A job's speedup is its goodput on a GPU count over its goodput on a fair share of the
cluster (GPUs / jobs), as the Pollux artifact's simulator scores an allocation
(`simulator/pollux.py`): a job left without GPUs scores almost nothing, so every job
runs while there are GPUs for it, and a job whose GPU count changes is scored at
(age - d x restarts) / (age + d) of its speedup, d a restart's cost. The objective is a
sum over jobs, so a dynamic program over GPU counts (`scheduler.core.shares`) finds its
optimum (the artifact searches with a genetic algorithm), over the sizes each job's
model knows, on the fewest nodes. Jobs that score alike go in order of attained
service, as the artifact orders them. Goodput is what the job's model holds: seconds
per base step, for an adaptive batch at its best batch per size.

Cost: O(J x S) vector steps over G GPUs for J jobs and S sizes a job may take (the
DP's table), a baseline's price, not one for rounds of thousands of GPUs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime

from scheduler.core.shares import allocate
from scheduler.core.snapshot import JobView

P = -1.0  # the power mean's exponent: more negative is fairer (the artifact's)
SMALL = 1e-3  # added to each speedup before the power, as the artifact does
RESTART_SECONDS = 30.0  # the artifact's restart cost in its penalty
TIE = 1e-6  # per rank: breaks ties between equal sums, far below any real difference


def share(
    jobs: Sequence[JobView],
    capacity: int,
    *,
    nodes: int,
    per_node: int,
    now: datetime,
) -> dict[int, int]:
    """Each job's GPU count (0: none) out of `capacity` GPUs on `nodes` nodes."""
    ordered = sorted(jobs, key=lambda job: (job.attained_gpu_seconds, job.created_at, job.id))
    if not ordered or capacity <= 0:
        return {}
    fair = math.ceil(capacity / len(ordered))
    scale = nodes / capacity  # a node's share of the cluster scores a speedup of 1
    scores = []
    for rank, job in enumerate(ordered):
        # At least a second (clocks may differ): at zero the penalty would score a first
        # start as no GPUs, and a job submitted at a round's instant would wait a round.
        age = max((now - job.created_at).total_seconds(), 1.0)
        restart = max(age - job.restarts * RESTART_SECONDS, 0.0) / (age + RESTART_SECONDS)
        scores.append(_scores(job, _sizes(job, capacity), fair, per_node, scale, restart, rank))
    counts = allocate(scores, capacity)
    return {job.id: count for job, count in zip(ordered, counts, strict=True)}


def _goodput(job: JobView, workers: int, per_node: int) -> float:
    """Base steps per second on `workers` GPUs on the fewest nodes (GPUs alone when the
    job's speed is not known)."""
    if job.model is None or workers not in job.model.sizes:
        return float(workers)
    return 1.0 / job.model.step_at(workers, -(-workers // per_node))[0]


def _sizes(job: JobView, capacity: int) -> list[int]:
    known = job.model.sizes if job.model is not None else (job.workers,)
    return [w for w in known if w <= capacity]


def _scores(
    job: JobView,
    sizes: list[int],
    fair: int,
    per_node: int,
    scale: float,
    restart: float,
    rank: int,
) -> dict[int, float]:
    """Each GPU count's term of the power mean's sum (0: no GPUs); a count other than
    what the job holds has its speedup scaled by `restart`."""
    scores = {0: SMALL**P - TIE * rank}
    if not sizes:
        return scores
    within = [w for w in sizes if w <= fair]
    base = _goodput(job, max(within) if within else min(sizes), per_node)
    held = len(job.allocated_gpu_ids)
    for workers in sizes:
        speedup = _goodput(job, workers, per_node) / base * scale
        if workers != held:
            speedup *= restart
        scores[workers] = (speedup + SMALL) ** P
    return scores
