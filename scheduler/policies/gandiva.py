"""Gandiva-style time slicing (Xiao et al., OSDI 2018): when more jobs want GPUs than
the cluster has, they take turns in quanta.

A job that started its slice less than `quantum_seconds` ago keeps its GPUs; every
other job, running or waiting, competes by the GPU time it has had per GPU so far
(least first), so an oversubscribed cluster rotates jobs and each gets an equal share
of time. Gandiva's packing and migration are not modelled here (JigSaw packs).
"""

from __future__ import annotations

from scheduler.plan import Plan
from scheduler.policies.placement import candidates
from scheduler.policies.preemptive import run_in_order
from scheduler.snapshot import ClusterSnapshot, JobView

QUANTUM_SECONDS = 600.0


def _in_slice(job: JobView, snapshot: ClusterSnapshot, quantum_seconds: float) -> bool:
    return (
        job.holding
        and job.held_since is not None
        and (snapshot.now - job.held_since).total_seconds() < quantum_seconds
    )


def schedule(snapshot: ClusterSnapshot, quantum_seconds: float = QUANTUM_SECONDS) -> Plan:
    ordered = sorted(
        candidates(snapshot),
        key=lambda job: (
            -job.priority,
            not _in_slice(job, snapshot, quantum_seconds),
            job.attained_gpu_seconds / job.workers,
            job.created_at,
            job.id,
        ),
    )
    return run_in_order(snapshot, ordered)
