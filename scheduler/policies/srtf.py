"""Shortest remaining time first, preemptive at every round.

A job's remaining time is `placement.remaining_seconds` (from its speed model when the
scheduler has one, else its iterations left). Knowing remaining times
is what SRTF assumes; Tiresias is the baseline that does not.
"""

from __future__ import annotations

from scheduler.plan import Plan
from scheduler.policies.placement import candidates, remaining_seconds
from scheduler.policies.preemptive import run_in_order
from scheduler.snapshot import ClusterSnapshot


def schedule(snapshot: ClusterSnapshot) -> Plan:
    ordered = sorted(
        candidates(snapshot),
        key=lambda job: (-job.priority, remaining_seconds(job), job.created_at, job.id),
    )
    return run_in_order(snapshot, ordered)
