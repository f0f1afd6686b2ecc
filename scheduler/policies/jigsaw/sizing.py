"""Step 2, size and admit: each job's base size this round, the jobs admitted in order
while whole GPUs remain, and where they run (kept where they are, or gang-placed on
free GPUs)."""

from __future__ import annotations

import heapq
import math
from collections import defaultdict, deque
from dataclasses import dataclass, field

from jigsaw import spb
from scheduler.core.snapshot import GPUView, JobView
from scheduler.policies.jigsaw.layout import Layout
from scheduler.policies.jigsaw.spb_choice import own_config
from scheduler.policies.jigsaw.speeds import efficient_size, remaining_seconds_at
from scheduler.policies.placement import FreePool, remaining_seconds


@dataclass(frozen=True)
class Sizing:
    """How big each job's base allocation is this round.

    While the requests fit, what each asked for. When they do not, a job gets the most
    GPUs it uses at no less than `floor` of its best progress per GPU; a long job (more
    than `long_seconds` to go even at that size) at no less than `long_floor`. Width
    buys a long job little (an hour saved of ten) and costs the short jobs behind it
    what it takes; at its efficient size it frees those GPUs for them, and growth
    hands it whatever stays idle.
    """

    per_node: int
    floor: float
    long_seconds: float
    long_floor: float
    paced: dict[int, int] = field(default_factory=dict)  # job -> its pace this round

    def base(self, job: JobView) -> int:
        """The job's base size (a running job: that or what it holds, whichever is
        less; it may have grown past it). A paced job's is its pace, held or not."""
        if job.id in self.paced:
            return self.paced[job.id]
        size = efficient_size(job, self.per_node, self.floor)
        if (
            self.floor
            and self.long_floor > self.floor
            and job.model is not None
            and remaining_seconds_at(job, size, self.per_node) > self.long_seconds
        ):
            size = efficient_size(job, self.per_node, self.long_floor)
        return min(size, len(job.allocated_gpu_ids)) if job.holding else size

    def remaining_gpu_seconds(self, job: JobView) -> float:
        """What finishing the job costs the cluster: its remaining time at its base
        size times that size (a small job that is a little longer beats a wide one, as
        SRSF); without a speed model, its iterations left (as SRTF)."""
        if job.model is None:
            return remaining_seconds(job)
        size = self.base(job)
        return size * remaining_seconds_at(job, size, self.per_node)

    def remaining_seconds(self, job: JobView) -> float:
        """Its time to go at its base size (without a speed model, its iterations left)."""
        if job.model is None:
            return remaining_seconds(job)
        return remaining_seconds_at(job, self.base(job), self.per_node)


def shrink_floors(
    jobs: list[JobView], capacity: int, floors: tuple[float, ...]
) -> tuple[float, ...]:
    """The floors to choose from this round: none (0) while what the jobs ask for
    fits, else each of `floors`."""
    if not floors or sum(job.workers for job in jobs) <= capacity:
        return (0.0,)
    return floors


def completion_sum(ordered: list[JobView], sizing: Sizing, capacity: int) -> float:
    """The seconds until each job ends, summed, were each to run at its base size
    from now, started in `ordered` order as GPUs free up (a later job starting first
    where it fits, as admission does). Jobs never done (no end known) hold their GPUs
    and add nothing.

    O(J (S + log J)) for J jobs of S distinct sizes: the next job to start is the
    earliest in order among the first waiting job of each size that fits (one passed
    over in a scan never fits later in it: the free GPUs only fall)."""
    waiting: dict[int, deque[tuple[int, float]]] = defaultdict(deque)
    for position, job in enumerate(ordered):
        waiting[sizing.base(job)].append((position, sizing.remaining_seconds(job)))
    ends: list[tuple[float, int]] = []
    now, free, total = 0.0, capacity, 0.0
    while True:
        while fitting := [
            (queue[0][0], size) for size, queue in waiting.items() if queue and size <= free
        ]:
            _, size = min(fitting)
            _, seconds = waiting[size].popleft()
            free -= size
            heapq.heappush(ends, (now + seconds, size))
            total += now + seconds if math.isfinite(seconds) else 0.0
        if not any(waiting.values()) or not ends or not math.isfinite(ends[0][0]):
            return total  # all started, or what waits never fits or never gets GPUs
        now, size = heapq.heappop(ends)
        free += size


def size_jobs(
    ordered: list[JobView],
    guests: set[int],
    *,
    budget: int,
    capacity: int,
    sizing: Sizing,
) -> tuple[dict[int, int], dict[int, int]]:
    """Each job's base size, and the GPUs of each job admitted this round (absent:
    not admitted), in order.

    First every job at its base size while GPUs remain: a waiting job its efficient
    size at this round's shrink floor, a running one that size or less (it may have
    grown past it). Then running jobs keep what they hold above their base, in order,
    while GPUs remain (else they shrink to it).
    """
    base: dict[int, int] = {}
    size: dict[int, int] = {}
    for job in ordered:
        held = len(job.allocated_gpu_ids)
        base[job.id] = held if job.id in guests else sizing.base(job)
        if base[job.id] <= min(budget, capacity):
            size[job.id] = base[job.id]
            budget -= base[job.id]
    for job in ordered:
        if job.id in size and job.holding and job.id not in guests:
            extra = len(job.allocated_gpu_ids) - size[job.id]
            if 0 < extra <= budget:
                size[job.id] += extra
                budget -= extra
    return base, size


@dataclass(frozen=True)
class Admission:
    """Where step 2 left things: the GPUs still free, the jobs (re)started in order,
    and of them the running jobs moved to other GPUs."""

    pool: FreePool
    started: list[int]
    moved: list[int]


def admit(
    ordered: list[JobView],
    size: dict[int, int],
    guests: set[int],
    layout: Layout,
    usable: dict[int, GPUView],
    packed: set[int],
) -> Admission:
    """Put the admitted jobs (those `size` holds) on `layout`: a running job whose size
    is what it holds stays where it is, one sized up grows around its GPUs where its
    node has room, the others are gang-placed on free GPUs (none of `packed`, where
    guests run); running jobs not admitted then keep running where no newcomer took
    their GPUs. An admitted guest moves to GPUs of its own when there are any, else it
    runs on where it is packed (`growth.keep_guests`)."""
    admitted = [job for job in ordered if job.id in size]
    for job in admitted:
        if job.holding and job.id not in guests and size[job.id] == len(job.allocated_gpu_ids):
            layout.put(job, job.allocated_gpu_ids, spb.resolve(job.spb))
    free: dict[int, list[GPUView]] = defaultdict(list)
    for gpu in usable.values():
        if not layout.on_gpu.get(gpu.id) and gpu.id not in packed:
            free[gpu.node_id].append(gpu)
    pool = FreePool(free)
    started: list[int] = []
    moved: list[int] = []
    # GPUs of running jobs sized anew: one sized up grows onto the others' last.
    resized = {
        g
        for job in admitted
        if job.id not in layout.jobs and job.id not in guests
        for g in job.allocated_gpu_ids
    }
    for job in admitted:
        if job.id in layout.jobs:
            continue  # kept where it runs
        placed = _around(pool, job, size[job.id], usable, resized) or pool.take(size[job.id])
        if placed is not None:
            layout.put(job, tuple(g.id for g in placed), own_config(job))
            started.append(job.id)
            if job.holding:
                moved.append(job.id)
    for job in ordered:
        if (
            job.holding
            and job.id not in layout.jobs
            and job.id not in guests
            and all(g in usable and not layout.on_gpu.get(g) for g in job.allocated_gpu_ids)
        ):
            layout.put(job, job.allocated_gpu_ids, spb.resolve(job.spb))
            pool.claim([usable[g] for g in job.allocated_gpu_ids])
    return Admission(pool, started, moved)


def _around(
    pool: FreePool, job: JobView, workers: int, usable: dict[int, GPUView], resized: set[int]
) -> list[GPUView] | None:
    """A running job's larger gang around the GPUs it holds, if its node has room:
    those and the node's free ones, those of other `resized` jobs last (the cluster
    grows it in place, not by a restart). None: no such gang, or a shrink (placed as a
    newcomer is: keeping its GPUs there fragments the nodes, and cost the simulated
    JCTs 0.4%)."""
    mine = [usable[g] for g in job.allocated_gpu_ids if g in usable]
    if not mine or len(mine) < len(job.allocated_gpu_ids) or workers < len(mine):
        return None
    return pool.take_around(workers, mine, resized)
