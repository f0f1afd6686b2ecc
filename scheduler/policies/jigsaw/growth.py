"""Step 2, growth: GPUs nobody is admitted to grow placed jobs, each to the size that
finishes it soonest; and the guests not admitted stay where they are packed."""

from __future__ import annotations

import math
from dataclasses import dataclass

from jigsaw import spb
from scheduler.core.snapshot import GPUView, JobView
from scheduler.policies.jigsaw import resizing
from scheduler.policies.jigsaw.layout import Layout, yields
from scheduler.policies.jigsaw.params import JigsawParams
from scheduler.policies.jigsaw.speeds import (
    fastest_size,
    per_gpu_values,
    remaining_on,
    remaining_seconds_at,
)
from scheduler.policies.placement import FreePool


@dataclass(frozen=True)
class Growth:
    """How wide growth may make a job in this pass.

    A job with more than `long_seconds` to go grows only to sizes where it makes at
    least `floor` of its best progress per GPU: grown, it would hold those GPUs for
    hours (it moves again only for a real saving), where a short job hands them back
    soon. Without a floor (the last pass) a job grows as far as finishing sooner goes.
    """

    per_node: int
    floor: float
    long_seconds: float
    min_saving: float
    min_share: float

    def least_saving(self, to_go: float) -> float:
        """What moving a running job with `to_go` seconds left must save it:
        `min_saving`, or `min_share` of `to_go` if less. A fixed 600 s kept every
        job with under 10 minutes to go on its best size from ever growing once
        started (the Pollux workloads' cifar10 jobs ran to the end on the 4 GPUs
        their first epoch favours, 3x slower than on 16 once their gradient noise
        grows); a move that halves what is left is worth its restart."""
        return min(self.min_saving, self.min_share * to_go)

    def widest(self, job: JobView, held: int) -> float:
        assert job.model is not None
        if not self.floor or remaining_seconds_at(job, held, self.per_node) <= self.long_seconds:
            return math.inf
        values = per_gpu_values(job.model, self.per_node)
        best = max(values.values())
        return max(w for w in job.model.sizes if w <= held or values[w] >= self.floor * best)


def grow(
    admitted: list[JobView],
    guests: set[int],
    layout: Layout,
    pool: FreePool,
    usable: dict[int, GPUView],
    started: list[int],
    per_node: int,
    tail: set[int],
    params: JigsawParams,
) -> list[int]:
    """Grow placed jobs into the GPUs left free, in two passes, and return the running
    jobs it moved (`started` lists the jobs already (re)started this round).

    Long jobs first grow only as far as they use GPUs well, so the jobs behind them
    grow too; then what is still idle goes as fast as it speeds jobs up. In the first
    pass the jobs of `tail` (they will still run when the cluster drains) grow longest
    first, so that they finish together rather than one alone."""
    tail_first = _tail_first(admitted, layout, tail)
    moved: list[int] = []
    for order, floor in ((tail_first, params.grow_floor), (admitted, 0.0)):
        growth = Growth(
            per_node,
            floor,
            params.grow_floor_seconds,
            params.min_grow_saving,
            params.min_grow_share,
        )
        fresh = {*started, *moved}
        for job in order:
            if pool.total == 0 and not _may_shrink(job, layout, per_node):
                continue  # nothing to grow into, and no faster smaller size
            grew = job.id not in guests and _grow_one(job, layout, pool, usable, growth, fresh)
            if grew and job.id not in fresh:
                moved.append(job.id)
    return moved


def _grow_one(
    job: JobView,
    layout: Layout,
    pool: FreePool,
    usable: dict[int, GPUView],
    growth: Growth,
    fresh: set[int],
) -> bool:
    """Move `job` to the size that finishes it soonest on the nodes the free GPUs are
    on (a gang spread thin can be slower than a smaller one on one node), up to
    `growth.widest`: more GPUs, or fewer where it is faster on fewer (a gang spread
    over more nodes than its size needs; one measured slower at its size than at a
    smaller one, which then keeps its first GPUs: in place on the cluster), or its
    size on fewer nodes (a gang spread when the cluster was full, once nodes free up:
    a drain's last jobs otherwise run spread to the end). Idle, the
    GPUs it takes would add nothing; a running job not (re)started this round
    (`fresh`) moves only when that saves it `growth.least_saving`, and no less than
    the move costs it (`resizing.cost`: a growth onto its own node is in place; a
    shrink is charged a restart, which it costs where the gang spans nodes). Whether
    it moved."""
    held = layout.gpus.get(job.id)
    if held is None or job.model is None or len(job.model.sizes) < 2:
        return False
    if any(g not in usable for g in held):
        return False
    mine = [usable[g] for g in held]
    nodes = layout.nodes[job.id]
    chosen, soonest = 0, remaining_on(job, len(held), nodes)
    least = growth.least_saving(soonest)
    widest = growth.widest(job, len(held))
    for workers in job.model.sizes:
        if workers > widest:
            break
        span = pool.span(workers, mine)
        if span is None:
            break
        if workers == len(held) and span >= nodes:
            continue  # its size on no fewer nodes than now
        finish = remaining_on(job, workers, span)
        if job.id not in fresh:
            in_place = workers > len(held) and pool.fits_around(workers, mine)
            finish += max(least, resizing.cost(job, in_place))
        if finish < soonest:
            chosen, soonest = workers, finish
    if not chosen:
        return False
    config = layout.config[job.id]
    layout.take(job.id)
    pool.give(mine)
    # Where it runs when it fits there (a growth onto its node, a shrink to its
    # first GPUs): a resize in place keeps its processes.
    placed = pool.take_around(chosen, mine[:chosen]) or pool.take(chosen)
    assert placed is not None  # span said it fits
    layout.put(job, tuple(g.id for g in placed), config)
    return True


def _may_shrink(job: JobView, layout: Layout, per_node: int) -> bool:
    """Whether the placed job may be faster on fewer GPUs: it spans more nodes than its
    size needs, or it is faster at a smaller size (on the fewest nodes)."""
    held = layout.gpus.get(job.id)
    if held is None or job.model is None:
        return False
    if layout.nodes[job.id] > -(-len(held) // per_node):
        return True
    return fastest_size(job.model, per_node) < len(held)


def _tail_first(admitted: list[JobView], layout: Layout, tail: set[int]) -> list[JobView]:
    """`admitted`, with the jobs of `tail` reordered among their own places, most time
    to go where they are first."""

    def to_go(job: JobView) -> float:
        if job.id not in layout.gpus:
            return 0.0
        return remaining_on(job, len(layout.gpus[job.id]), layout.nodes[job.id])

    longest = iter(sorted((job for job in admitted if job.id in tail), key=to_go, reverse=True))
    return [next(longest) if job.id in tail else job for job in admitted]


def keep_guests(
    ordered: list[JobView],
    guests: set[int],
    layout: Layout,
    usable: dict[int, GPUView],
    yield_slowdown: float,
) -> set[int]:
    """Put the guests not placed on GPUs of their own back where they are packed (on
    usable GPUs), unless a host there takes more than `yield_slowdown` times as long
    per iteration as alone, measured where it has been (`Layout.host_slowdown`), else
    predicted, and loses more by it than moving the guest costs (`layout.yields`): the
    guest yields (it is suspended and waits); the guests so kept."""
    kept: set[int] = set()
    for job in ordered:
        if (
            job.id in guests
            and job.id not in layout.jobs
            and all(g in usable for g in job.allocated_gpu_ids)
        ):
            layout.put(job, job.allocated_gpu_ids, spb.resolve(job.spb))
            hosts = {h for g in job.allocated_gpu_ids for h in layout.on_gpu[g] if h != job.id}
            if any(
                yields(layout.jobs[h], job, layout.host_slowdown(h), yield_slowdown)
                for h in hosts
                if h not in guests
            ):
                layout.take(job.id)
                continue
            kept.add(job.id)
    return kept
