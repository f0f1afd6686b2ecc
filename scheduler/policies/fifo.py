"""Strict FIFO with gang placement on as few nodes as possible.

Jobs run in (priority desc, submission time, id) order. When the head job cannot be
placed, every later job waits too: backfilling smaller jobs around it would let a stream
of small jobs keep a large one waiting forever. The exception is a job larger than every
GPU on the alive cluster: it cannot run however long it waits, so it must not block the
queue (it is placed once enough nodes join).
"""

from __future__ import annotations

import logging
from datetime import datetime

from scheduler.plan import Placement, Plan
from scheduler.policies.placement import FreePool, spb_of
from scheduler.snapshot import ClusterSnapshot, JobView
from scheduler.states import JobState

logger = logging.getLogger(__name__)


def queue_order(job: JobView) -> tuple[int, datetime, int]:
    return (-job.priority, job.created_at, job.id)


def schedule(snapshot: ClusterSnapshot) -> Plan:
    free = FreePool(snapshot.free_gpus_by_node())
    capacity = snapshot.alive_gpu_count()
    placements: list[Placement] = []
    for job in sorted(snapshot.jobs_in(JobState.QUEUED), key=queue_order):
        if job.workers > capacity:
            logger.debug("job %d needs %d GPUs; the cluster has %d", job.id, job.workers, capacity)
            continue
        gpus = free.take(job.workers)
        if gpus is None:
            break  # head-of-line blocking is deliberate, see the module docstring
        placements.append(Placement(job.id, tuple(gpu.id for gpu in gpus), spb_of(job)))
    return Plan(start=tuple(placements))
