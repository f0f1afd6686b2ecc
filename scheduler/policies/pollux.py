"""Pollux (Qiao et al., OSDI 2021) as a baseline: GPUs shared by goodput speedup.

Every round each job gets the GPU count that maximises the power mean (p = -1) of the
jobs' speedups, a job's speedup being its goodput on its GPUs over its goodput on a
fair share of the cluster (GPUs / jobs), as the Pollux artifact's simulator scores an
allocation (`simulator/pollux.py`): a job left without GPUs scores almost nothing, so
every job runs while there are GPUs for it, and a job whose allocation changes is
scored at (age - 30 s x restarts) / (age + 30 s) of its speedup, for the restart it
pays. The artifact searches allocations with a genetic algorithm; the objective is a
sum over jobs, so here a dynamic program over GPU counts finds its optimum exactly,
over the sizes the job's model knows, on the fewest nodes. Jobs that score alike go in
order of attained service, as the artifact orders them. Goodput is what the job's model
holds: seconds per base step, for an adaptive batch at its best batch per size. Like
Pollux it needs no job durations and knows no priorities.

It is here for the simulator to compare JigSaw with on the same jobs
(`benchmarks/goodput_sim.py`), not tuned for the live cluster.
"""

from __future__ import annotations

import math

from scheduler.core.plan import Placement, Plan
from scheduler.core.snapshot import ClusterSnapshot, JobView
from scheduler.policies.placement import candidates, pool_beside, spb_of

P = -1.0  # the power mean's exponent: more negative is fairer (the artifact's)
SMALL = 1e-3  # added to each speedup before the power, as the artifact does
RESTART_SECONDS = 30.0  # the artifact's restart delay in its penalty
TIE = 1e-6  # per rank: breaks ties between equal sums, far below any real difference


def _goodput(job: JobView, workers: int, per_node: int) -> float:
    """Base steps per second on `workers` GPUs on the fewest nodes (GPUs alone when the
    job's speed is not known)."""
    if job.model is None or workers not in job.model.sizes:
        return float(workers)
    return 1.0 / job.model.step_at(workers, -(-workers // per_node))[0]


def _sizes(job: JobView, capacity: int) -> list[int]:
    known = job.model.sizes if job.model is not None else (job.workers,)
    return [w for w in known if w <= capacity]


def _fair_goodput(job: JobView, fair: int, per_node: int, sizes: list[int]) -> float:
    """Goodput at the largest known size within the fair share (else its least)."""
    within = [w for w in sizes if w <= fair]
    return _goodput(job, max(within) if within else min(sizes), per_node)


def _scores(
    job: JobView, sizes: list[int], fair: int, per_node: int, scale: float, age: float, rank: int
) -> dict[int, float]:
    """Each GPU count's term of the power mean's sum (0: no GPUs). Of jobs that score
    alike, those of less attained service (lower `rank`) get GPUs first, as the
    artifact's repair gives them out in that order."""
    base = _fair_goodput(job, fair, per_node, sizes)
    held = len(job.allocated_gpu_ids)
    restart = max(age - job.restarts * RESTART_SECONDS, 0.0) / (age + RESTART_SECONDS)
    scores = {0: SMALL**P - TIE * rank}
    for workers in sizes:
        speedup = _goodput(job, workers, per_node) / base * scale
        if workers != held:
            speedup *= restart
        scores[workers] = (speedup + SMALL) ** P
    return scores


def allocate(scores: list[dict[int, float]], capacity: int) -> list[int]:
    """The GPU count of each job that minimises the sum of its scores within
    `capacity` GPUs in all (p < 0: minimising the sum maximises the power mean)."""
    best = [0.0] + [math.inf] * capacity  # least sum with exactly g GPUs used
    choices: list[list[int]] = []
    for options in scores:
        nxt = [math.inf] * (capacity + 1)
        chose = [0] * (capacity + 1)
        for used, total in enumerate(best):
            if total == math.inf:
                continue
            for workers, score in options.items():
                if used + workers <= capacity and total + score < nxt[used + workers]:
                    nxt[used + workers] = total + score
                    chose[used + workers] = workers
        best = nxt
        choices.append(chose)
    used = min(range(capacity + 1), key=lambda g: (best[g], g))
    counts = []
    for chose in reversed(choices):
        counts.append(chose[used])
        used -= chose[used]
    return counts[::-1]


def schedule(snapshot: ClusterSnapshot) -> Plan:
    jobs = sorted(
        candidates(snapshot), key=lambda job: (job.attained_gpu_seconds, job.created_at, job.id)
    )
    capacity = sum(len(node.gpus) for node in snapshot.nodes if node.alive and node.schedulable)
    if not jobs or capacity == 0:
        return Plan()
    per_node = max(len(node.gpus) for node in snapshot.nodes)
    nodes = sum(1 for node in snapshot.nodes if node.alive and node.schedulable)
    fair = math.ceil(capacity / len(jobs))
    scale = nodes / capacity  # a node's share of the cluster scores a speedup of 1
    scores = [
        _scores(
            job,
            _sizes(job, capacity),
            fair,
            per_node,
            scale,
            max((snapshot.now - job.created_at).total_seconds(), 0.0),  # clocks may differ
            rank,
        )
        for rank, job in enumerate(jobs)
    ]
    counts = allocate(scores, capacity)
    kept = {
        job.id
        for job, count in zip(jobs, counts, strict=True)
        if job.holding and count == len(job.allocated_gpu_ids)
    }
    pool = pool_beside(
        snapshot, {g for job in jobs if job.id in kept for g in job.allocated_gpu_ids}
    )
    suspend = [job.id for job in jobs if job.holding and job.id not in kept]
    start = []
    moved = [(job, count) for job, count in zip(jobs, counts, strict=True) if count]
    for job, count in sorted(moved, key=lambda pair: -pair[1]):
        if job.id in kept:
            continue
        placed = pool.take(count)
        if placed is not None:
            start.append(Placement(job.id, tuple(gpu.id for gpu in placed), spb_of(job)))
    return Plan(start=tuple(start), suspend=tuple(sorted(suspend)))
