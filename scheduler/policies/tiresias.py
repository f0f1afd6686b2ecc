"""Tiresias: discretized two-dimensional least-attained-service (Gu et al., NSDI 2019).

A job's attained service is two-dimensional: GPUs x time held (`attained_gpu_seconds`).
Jobs fall into queues by thresholds on it; a lower queue always goes first, and within
a queue jobs run in arrival order, so a job is preempted only when it crosses into a
lower-priority queue while others wait, not for every small difference in service.
The default is the two queues split at 16 GPU-hours that the Pollux artifact's
Tiresias uses (the paper's evaluation uses two queues too). Tiresias needs no job
durations. Its starvation knob (promote a job that waited long) is off here, as in that
artifact; the policy's priorities still come first.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from scheduler.plan import Plan
from scheduler.policies.placement import candidates
from scheduler.policies.preemptive import run_in_order
from scheduler.snapshot import ClusterSnapshot, JobView

QUEUE_THRESHOLDS_GPU_SECONDS: tuple[float, ...] = (16 * 3600.0,)


def queue_of(job: JobView, thresholds: Sequence[float]) -> int:
    """0 for the highest-priority queue; one more for each threshold the job passed."""
    return bisect.bisect_right(thresholds, job.attained_gpu_seconds)


def schedule(
    snapshot: ClusterSnapshot, thresholds: Sequence[float] = QUEUE_THRESHOLDS_GPU_SECONDS
) -> Plan:
    ordered = sorted(
        candidates(snapshot),
        key=lambda job: (-job.priority, queue_of(job, thresholds), job.created_at, job.id),
    )
    return run_in_order(snapshot, ordered)
