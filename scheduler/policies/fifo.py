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
from typing import Any

from scheduler.plan import Placement, Plan
from scheduler.snapshot import ClusterSnapshot, GPUView, JobView
from scheduler.states import JobState

logger = logging.getLogger(__name__)


def queue_order(job: JobView) -> tuple[int, datetime, int]:
    return (-job.priority, job.created_at, job.id)


def schedule(snapshot: ClusterSnapshot) -> Plan:
    free = {node_id: list(gpus) for node_id, gpus in snapshot.free_gpus_by_node().items()}
    capacity = snapshot.alive_gpu_count()
    placements: list[Placement] = []
    for job in sorted(snapshot.jobs_in(JobState.QUEUED), key=queue_order):
        if job.workers > capacity:
            logger.debug("job %d needs %d GPUs; the cluster has %d", job.id, job.workers, capacity)
            continue
        gpus = gang_place(free, job.workers)
        if gpus is None:
            break  # head-of-line blocking is deliberate, see the module docstring
        placements.append(Placement(job.id, tuple(gpu.id for gpu in gpus), spb_of(job)))
    return Plan(start=tuple(placements))


def gang_place(free: dict[int, list[GPUView]], workers: int) -> list[GPUView] | None:
    """Take `workers` GPUs from `free` (consumed in place), or None and take nothing.

    While no single node can hold what is left, take the node with the most free GPUs;
    then finish on the node with the fewest free GPUs that still fits (best fit), which
    keeps large holes open for large jobs. This uses the fewest nodes possible.
    """
    if sum(len(gpus) for gpus in free.values()) < workers:
        return None
    chosen: list[GPUView] = []
    while len(chosen) < workers:
        needed = workers - len(chosen)
        fitting = [node_id for node_id, gpus in free.items() if len(gpus) >= needed]
        if fitting:
            node_id = min(fitting, key=lambda n: (len(free[n]), *_node_key(free[n])))
        else:
            node_id = min(free, key=lambda n: (-len(free[n]), *_node_key(free[n])))
        taken, free[node_id] = free[node_id][:needed], free[node_id][needed:]
        if not free[node_id]:
            del free[node_id]
        chosen.extend(taken)
    return chosen


def _node_key(gpus: list[GPUView]) -> tuple[str, int]:
    # Ties between equally good nodes go to the first by name, so plans are deterministic.
    return (gpus[0].node_name, gpus[0].node_id)


def spb_of(job: JobView) -> dict[str, Any]:
    # A fixed SPB configuration passes through; "auto" awaits the SPB planner, "off" is {}.
    spb = job.spec.get("spb")
    return dict(spb) if isinstance(spb, dict) else {}
