"""FIFO that resizes elastic jobs: the simplest policy that uses the resize mechanism.

FIFO's order and gang placement (`fifo`), with two moves for jobs whose spec has an
`elastic` range: a waiting elastic job starts on fewer GPUs than it asked for when
that is all that is free (down to its `min_workers`); when the head of the queue does
not fit, running elastic jobs above their `min_workers` shrink (newest first) to free
what it needs; and while nothing waits, running elastic jobs grow into idle GPUs (up to
their `max_workers`, oldest first). Only sizes the job's global batch splits on exactly
are used (`jigsaw.elastic`). It knows nothing of speed or goodput: it is the baseline
the goodput-aware sizing of the JigSaw policy is measured against, and what
`benchmarks/elastic.py` drives the live resizes with.
"""

from __future__ import annotations

from scheduler.core.plan import Placement, Plan, Resize
from scheduler.core.snapshot import ClusterSnapshot, JobView
from scheduler.core.states import JobState
from scheduler.policies.fifo import queue_order
from scheduler.policies.placement import FreePool, spb_of


def sizes(job: JobView) -> list[int]:
    """The worker counts the job may run on, largest first (its `workers` alone unless
    elastic)."""
    return list(job.sizes or (job.workers,))


def schedule(snapshot: ClusterSnapshot) -> Plan:
    free = FreePool(snapshot.free_gpus_by_node())
    gpus = snapshot.gpus_by_id()
    running = sorted(snapshot.jobs_in(JobState.RUNNING), key=queue_order)
    placements: list[Placement] = []
    resizes: list[Resize] = []
    waiting = False
    for job in sorted(snapshot.jobs_in(JobState.QUEUED), key=queue_order):
        counts = sizes(job)
        fits = next((n for n in counts if n <= free.total), None)
        taken = free.take(fits) if fits is not None else None
        if taken is not None:
            placements.append(Placement(job.id, tuple(g.id for g in taken), spb_of(job)))
            continue
        waiting = True
        resizes.extend(_shrink_for(min(counts) - free.total, running))
        break  # head-of-line blocking, as in fifo
    if not waiting:
        for job in running:
            bigger = [n for n in sizes(job) if n > len(job.allocated_gpu_ids)]
            grow = next((n for n in bigger if n - len(job.allocated_gpu_ids) <= free.total), None)
            extra = free.take(grow - len(job.allocated_gpu_ids)) if grow is not None else None
            if extra:
                held = tuple(gpus[i] for i in job.allocated_gpu_ids)
                resizes.append(Resize(job.id, tuple(g.id for g in (*held, *extra))))
    return Plan(start=tuple(placements), resize=tuple(resizes))


def _shrink_for(needed: int, running: list[JobView]) -> list[Resize]:
    """Shrink the newest running elastic jobs until `needed` GPUs are freed."""
    resizes = []
    for job in reversed(running):
        if needed <= 0:
            break
        held = len(job.allocated_gpu_ids)
        smaller = [n for n in sizes(job) if n < held]
        if not smaller:
            continue
        # The largest size that frees enough, else the smallest it may run on.
        to = next((n for n in smaller if held - n >= needed), smaller[-1])
        resizes.append(Resize(job.id, job.allocated_gpu_ids[:to]))
        needed -= held - to
    return resizes
