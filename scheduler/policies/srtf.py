"""Shortest remaining time first, preemptive at every round.

A job's remaining time is its iterations left times its step time when the scheduler
has a model of its speed (`JobView.model`, from profiles), else its iterations left
alone; a job with neither (only a target metric) is longest. Knowing remaining times
is what SRTF assumes; Tiresias is the baseline that does not.
"""

from __future__ import annotations

import math

from scheduler.core.plan import Plan
from scheduler.core.snapshot import ClusterSnapshot, JobView
from scheduler.policies.preemptive import candidates, run_in_order


def remaining_seconds(job: JobView) -> float:
    if job.model is not None:
        left = max(job.model.iterations_total - job.iterations_done, 0)
        return left * job.model.alone_step_seconds
    if job.max_iterations is None:
        return math.inf
    return float(max(job.max_iterations - job.iterations_done, 0))


def schedule(snapshot: ClusterSnapshot) -> Plan:
    ordered = sorted(
        candidates(snapshot),
        key=lambda job: (-job.priority, remaining_seconds(job), job.created_at, job.id),
    )
    return run_in_order(snapshot, ordered)
