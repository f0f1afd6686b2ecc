"""Pollux (Qiao et al., OSDI 2021) as a baseline: every round, every job's GPUs afresh
by the artifact's objective (`speedup.share`), kept where a job's count is unchanged,
the others gang-placed on the fewest nodes, the widest first. Like Pollux it needs no
job durations and knows no priorities.

It is here for the simulator to compare JigSaw with on the same jobs
(`benchmarks/goodput_sim.py`), not tuned for the live cluster.
"""

from __future__ import annotations

from scheduler.core.plan import Placement, Plan
from scheduler.core.snapshot import ClusterSnapshot
from scheduler.policies.placement import candidates, pool_beside, spb_of
from scheduler.policies.speedup import share


def schedule(snapshot: ClusterSnapshot) -> Plan:
    jobs = candidates(snapshot)
    schedulable = [node for node in snapshot.nodes if node.alive and node.schedulable]
    counts = share(
        jobs,
        sum(len(node.gpus) for node in schedulable),
        nodes=len(schedulable),
        per_node=max((len(node.gpus) for node in snapshot.nodes), default=1),
        now=snapshot.now,
    )
    kept = {
        job.id for job in jobs if job.holding and counts.get(job.id) == len(job.allocated_gpu_ids)
    }
    pool = pool_beside(
        snapshot, {g for job in jobs if job.id in kept for g in job.allocated_gpu_ids}
    )
    start = []
    widest = sorted(
        jobs,
        key=lambda job: (-counts.get(job.id, 0), job.attained_gpu_seconds, job.created_at, job.id),
    )
    for job in widest:
        if job.id in kept or not counts.get(job.id):
            continue
        placed = pool.take(counts[job.id])
        if placed is not None:
            start.append(Placement(job.id, tuple(gpu.id for gpu in placed), spb_of(job)))
    suspend = tuple(sorted(job.id for job in jobs if job.holding and job.id not in kept))
    return Plan(start=tuple(start), suspend=suspend)
