"""The common core of the preemptive baselines: run the jobs first in an order.

SRTF, Tiresias and Gandiva differ only in how they order the jobs that want GPUs; given
that order this admits jobs while their GPUs fit (skipping, not blocking on, one that
does not: these policies preempt, so a large job gets its turn by rising in the order),
keeps admitted running jobs where they are, suspends the running jobs not admitted and
places the waiting ones on what is free after those suspensions.
"""

from __future__ import annotations

from collections.abc import Iterable

from scheduler.core.plan import Placement, Plan
from scheduler.core.snapshot import ClusterSnapshot, JobView
from scheduler.policies.placement import pool_beside, spb_of


def run_in_order(snapshot: ClusterSnapshot, ordered: Iterable[JobView]) -> Plan:
    capacity = snapshot.alive_gpu_count()
    budget = sum(len(node.gpus) for node in snapshot.nodes if node.alive and node.schedulable)
    admitted: list[JobView] = []
    for job in ordered:
        if job.workers > capacity:
            continue  # can never run here; it must not hold back the others
        if job.workers <= budget:
            admitted.append(job)
            budget -= job.workers
    keep = {job.id for job in admitted if job.holding}
    suspend = tuple(sorted(job.id for job in snapshot.jobs if job.holding and job.id not in keep))
    # Free after the suspensions: every schedulable GPU no kept job holds.
    held = {gpu_id for job in snapshot.jobs if job.id in keep for gpu_id in job.allocated_gpu_ids}
    pool = pool_beside(snapshot, held)
    start = []
    for job in admitted:
        if job.holding:
            continue
        placed = pool.take(job.workers)
        if placed is not None:
            start.append(Placement(job.id, tuple(gpu.id for gpu in placed), spb_of(job)))
    return Plan(start=tuple(start), suspend=suspend)
