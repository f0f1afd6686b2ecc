"""JigSaw: SPB-aware packing at lease granularity, to maximize useful progress per
GPU-second.

Useful progress of a job is measured in GPU-seconds of its run alone: a job of W GPUs
whose iteration takes `s0` alone at full backprop produces `W * s0 / (step * ratio)`
useful GPUs while each iteration takes `step` and it needs `ratio` times the
iterations (its SPB configuration's statistical price). Cluster efficiency is the sum
over jobs divided by the GPUs. Each round:

1. Order the jobs that want or hold GPUs: priority first; then jobs starving (that
   have waited longer than `starvation_seconds` in all; they keep that place while they
   run); then least remaining GPU-time (remaining time at the job's base size, below,
   times that size: a narrow job a little longer goes before a wide one, which frees
   more GPUs for everyone's benefit later), running jobs' discounted by `stickiness`
   so that a small difference never pays a restart. A job that would set the
   makespan if started last counts its GPU-time at `straggler_discount`: one that
   needs at least `straggler_drain` times the cluster's drain time (every known job's
   fewest GPU-seconds over the GPUs) even at its fastest size. Least GPU-time first
   would run it after the jobs queued beside it, then alone, with GPUs idle (a job
   that does not scale) or spent wide at a fraction of their worth (one that does);
   discounted, not first, it starts ahead of longer queued work, not of short jobs.
   Once no job has been submitted for `pace_after_seconds`, the backlog is all there
   is to finish, and the jobs that cannot finish by the least makespan of all known
   work (`scheduler.core.makespan`) at their cheapest size are paced: they go first (after
   priority and starvation), at the width they need to finish by then (`_paced`);
   only while other jobs wait, since the order and growth then give them the rest.
2. Size and admit in that order while whole GPUs remain (as the preemptive baselines
   do). A job's base size is what it asked for while all requests fit the cluster;
   else the most GPUs it uses at no less than a floor of its best progress per GPU,
   the mildest of `efficiency_floors` under which the requests fit, and a job with
   more than `long_job_seconds` to go even at that size at no less than
   `long_job_floor` (a running job: that or what it holds, whichever is less); a
   paced job's is its pace.
   Running jobs then keep what they hold above their base while GPUs remain, in
   order, and shrink to it (move) when a job ahead needs them, instead of being
   suspended. Kept jobs stay where they are; newcomers and moved jobs are
   gang-placed on free GPUs; running jobs not admitted keep running where nobody took
   their GPUs. GPUs still free then grow placed jobs, in order, each to the size
   (including more than it asked for) that finishes it soonest on the nodes those
   GPUs are on; a running job only when that saves it `min_grow_saving` seconds, its
   restart included. In a first pass a job with more than `grow_floor_seconds` to go
   grows only to sizes at `grow_floor` of its best progress per GPU (it would hold
   the GPUs for hours), so the jobs behind it grow too; GPUs still idle after that go
   as fast as they speed jobs up. In the first pass the jobs that need at least
   `tail_share` of the drain time even at their fastest size (they will still run
   when the cluster drains) take their turns longest first, so that they finish
   together instead of the last alone on a cluster it cannot fill. Idle GPUs add
   nothing, so growth costs nothing until a job ahead needs them back.
3. Give every placed job the SPB configuration (or off) with the most useful progress
   alone: fewer bytes to synchronise can outweigh the statistical price.
4. Pack: jobs still waiting, in order, are placed as guests on GPUs of running jobs
   when that raises the cluster's useful progress. A guest's workers go first on the
   partial workers of hosts switched to an SPB configuration (whose idle time and freed
   activation memory host it without slowing the host, whose pace its full workers
   set), then on GPUs whose jobs leave them idle during synchronisation. Sharing a GPU
   costs every job there `interference` and, past the whole GPU, time-slicing (the
   rule of `scheduler.core.jobmodel.colocation_factors`); GPU memory is never
   over-committed. A guest is placed only when the gain net of what its hosts lose is
   at least `min_gain` GPUs.

Cost: sorting is O(J log J) for J jobs (the drain time O(J); the least makespan, when
pacing, O(C log C) for the C corners of the jobs' cost curves); sizing O(J) (per-job
choices memoized on the model); placement O(J + G) for G GPUs; growth O(S x P) per job
for S sizes and P GPUs per node (how a gang would spread is predicted from free counts
per node), and stops when no GPU is free; packing O(G log G) to rank candidate GPUs
once, then O(W) per guest of W workers over at most `max_guests` guests per round. Jobs
without a speed model (or with one size, as on the real cluster) are never resized;
without a model they are scheduled like SRTF by iterations left and are never packed or
given SPB. The policy chooses the SPB configuration only of jobs whose spec says `auto`:
one that says `off` or fixes a configuration runs as its spec says, placed, kept or
packed."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

from jigsaw import spb
from jigsaw.jobspec import SPBConfig
from scheduler.core.jobmodel import Shape, colocation_factors, stretched_step
from scheduler.core.makespan import Curve, hull, least_cost, shortest_makespan
from scheduler.core.plan import Placement, Plan, Reconfigure
from scheduler.core.snapshot import ClusterSnapshot, GPUView, JobView
from scheduler.policies.fifo import FreePool
from scheduler.policies.preemptive import candidates
from scheduler.policies.srtf import remaining_seconds

INTERFERENCE = 0.15
STARVATION_SECONDS = 12 * 3600.0
STICKINESS = 0.7
MIN_GAIN = 0.1
MAX_GUESTS = 64
MAX_FAILURES = 8
MAX_HOST_LOSS = 0.02
EFFICIENCY_FLOORS = (0.5, 0.7, 0.8)
LONG_JOB_SECONDS = 3600.0
LONG_JOB_FLOOR = 0.95
MIN_GROW_SAVING = 600.0
GROW_FLOOR = 0.7
GROW_FLOOR_SECONDS = 4 * 3600.0
STRAGGLER_DRAIN = 1.0
STRAGGLER_DISCOUNT = 0.25
TAIL_SHARE = 0.45
PACE_AFTER_SECONDS = 3600.0
CONFIGS: tuple[SPBConfig, ...] = (
    SPBConfig(full_fraction=0.5, partial_depth=0.5),
    SPBConfig(full_fraction=0.5, partial_depth=0.25),
    SPBConfig(full_fraction=0.25, partial_depth=0.5),
)


@dataclass
class _Layout:
    """The plan being built: who is on which GPU under which configuration."""

    interference: float
    node_of: dict[int, int]
    memory_of: dict[int, int]
    jobs: dict[int, JobView] = field(default_factory=dict)
    gpus: dict[int, tuple[int, ...]] = field(default_factory=dict)  # job -> GPUs by rank
    nodes: dict[int, int] = field(default_factory=dict)  # job -> how many nodes it spans
    config: dict[int, SPBConfig | None] = field(default_factory=dict)
    on_gpu: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))

    def shape(self, job_id: int) -> Shape | None:
        job = self.jobs[job_id]
        if job.model is None:
            return None
        nodes = self.nodes[job_id]
        return job.model.shape(self.config[job_id], len(self.gpus[job_id]), nodes)

    def put(self, job: JobView, gpus: tuple[int, ...], config: SPBConfig | None) -> None:
        self.jobs[job.id] = job
        self.gpus[job.id] = gpus
        self.nodes[job.id] = len({self.node_of[g] for g in gpus})
        self.config[job.id] = config
        for gpu in gpus:
            self.on_gpu[gpu].append(job.id)

    def take(self, job_id: int) -> None:
        for gpu in self.gpus.pop(job_id):
            self.on_gpu[gpu].remove(job_id)
        del self.nodes[job_id]
        del self.config[job_id]
        del self.jobs[job_id]

    def demand(self, job_id: int, gpu: int) -> float:
        shape = self.shape(job_id)
        if shape is None:
            return 1.0
        return shape.demands[self.gpus[job_id].index(gpu)]

    def memory_used(self, gpu: int) -> int:
        used = 0
        for job_id in self.on_gpu[gpu]:
            shape = self.shape(job_id)
            used += 0 if shape is None else shape.worker_memory_bytes[self.gpus[job_id].index(gpu)]
        return used

    def useful(self, job_id: int) -> float:
        """Useful GPUs the job yields where it is now (sharing included)."""
        job = self.jobs[job_id]
        shape = self.shape(job_id)
        if shape is None or job.model is None:
            return float(len(self.gpus[job_id]))
        factors = colocation_factors(
            {g: [(j, self.demand(j, g)) for j in self.on_gpu[g]] for g in self.gpus[job_id]},
            self.interference,
        )
        step = stretched_step(shape, [factors[g] for g in self.gpus[job_id]])
        return job.workers * job.model.alone_step_seconds / (step * shape.steps_ratio)


def schedule(
    snapshot: ClusterSnapshot,
    *,
    interference: float = INTERFERENCE,
    starvation_seconds: float = STARVATION_SECONDS,
    stickiness: float = STICKINESS,
    min_gain: float = MIN_GAIN,
    max_guests: int = MAX_GUESTS,
    max_host_loss: float = MAX_HOST_LOSS,
    efficiency_floors: tuple[float, ...] = EFFICIENCY_FLOORS,
    long_job_seconds: float = LONG_JOB_SECONDS,
    long_job_floor: float = LONG_JOB_FLOOR,
    min_grow_saving: float = MIN_GROW_SAVING,
    grow_floor: float = GROW_FLOOR,
    grow_floor_seconds: float = GROW_FLOOR_SECONDS,
    grow: bool = True,
    spb_enabled: bool = True,
    straggler_drain: float = STRAGGLER_DRAIN,
    straggler_discount: float = STRAGGLER_DISCOUNT,
    tail_share: float = TAIL_SHARE,
    pace_after_seconds: float = PACE_AFTER_SECONDS,
) -> Plan:
    every = snapshot.gpus_by_id()
    usable = {
        gpu.id: gpu
        for node in snapshot.nodes
        if node.alive and node.schedulable
        for gpu in node.gpus
    }
    layout = _Layout(
        interference,
        node_of={g.id: g.node_id for g in every.values()},
        memory_of={g.id: g.memory_bytes for g in every.values()},
    )
    jobs = candidates(snapshot)
    per_node = max((len(node.gpus) for node in snapshot.nodes), default=1)
    floor = _shrink_floor(jobs, per_node, len(usable), efficiency_floors)
    paced = _paced(snapshot, jobs, per_node, len(usable), pace_after_seconds)
    sizing = _Sizing(per_node, floor, long_job_seconds, long_job_floor, paced)
    # A job that needs `straggler_drain` of the drain time even at its fastest size
    # would, started last, run alone at the end and set the makespan (0: never).
    drain_seconds = _drain_seconds(jobs, per_node, len(usable))
    drain = drain_seconds * straggler_drain
    ordered = sorted(
        jobs,
        key=lambda job: _order(
            job,
            snapshot,
            starvation_seconds,
            stickiness,
            sizing,
            drain,
            straggler_discount,
            paced,
        ),
    )
    guests = _guests(snapshot)

    # 2. Whole GPUs in order, each job sized for this round. A guest admitted moves to
    # GPUs of its own when there are any, else it runs on where it is packed.
    base, size = _size_jobs(
        ordered,
        guests,
        budget=len(usable),
        capacity=snapshot.alive_gpu_count(),
        sizing=sizing,
    )
    admitted = [job for job in ordered if job.id in size]
    kept = {
        job.id
        for job in admitted
        if job.holding and (job.id in guests or size[job.id] == len(job.allocated_gpu_ids))
    }
    for job in admitted:
        if job.id in kept and job.id not in guests:
            layout.put(job, job.allocated_gpu_ids, spb.resolve(job.spb))
    packed = {g for job in snapshot.jobs if job.id in guests for g in job.allocated_gpu_ids}
    free: dict[int, list[GPUView]] = defaultdict(list)
    for gpu in usable.values():
        if not layout.on_gpu.get(gpu.id) and gpu.id not in packed:
            free[gpu.node_id].append(gpu)
    pool = FreePool(free)
    started: list[int] = []
    moved: list[int] = []
    for job in admitted:
        if job.id in kept and job.id not in guests:
            continue
        placed = pool.take(size[job.id])
        if placed is not None:
            layout.put(job, tuple(g.id for g in placed), _own_config(job))
            started.append(job.id)
            if job.holding:
                moved.append(job.id)
    # Running jobs not admitted keep running where no newcomer needed their GPUs.
    for job in ordered:
        if (
            job.holding
            and job.id not in layout.jobs
            and job.id not in guests
            and all(g in usable and not layout.on_gpu.get(g) for g in job.allocated_gpu_ids)
        ):
            layout.put(job, job.allocated_gpu_ids, spb.resolve(job.spb))
            pool.claim([usable[g] for g in job.allocated_gpu_ids])
    if grow:
        # Long jobs first grow only as far as they use GPUs well, so the jobs behind
        # them grow too; then what is still idle goes as fast as it speeds jobs up.
        # In the first pass the jobs that will still run when the cluster drains grow
        # longest first, so that they finish together rather than one alone.
        tail_first = _tail_first(admitted, layout, per_node, drain_seconds * tail_share)
        for order, floor_now in ((tail_first, grow_floor), (admitted, 0.0)):
            _grow(
                order,
                guests,
                layout,
                pool,
                usable,
                started,
                moved,
                min_grow_saving,
                _Growth(per_node, floor_now, grow_floor_seconds),
            )
    kept_guests = set()
    for job in ordered:
        if (
            job.id in guests
            and job.id not in layout.jobs
            and all(g in usable for g in job.allocated_gpu_ids)
        ):
            layout.put(job, job.allocated_gpu_ids, spb.resolve(job.spb))
            kept_guests.add(job.id)

    # 3. Each job's best configuration alone (a guest keeps its own; a job whose spec
    # fixes its configuration, or turns SPB off, keeps what the spec says). A host
    # keeps the configuration its guests were packed under: switched back to full
    # backprop, its partial workers would time-slice with the guests and slow it.
    hosting = {
        host
        for guest in kept_guests
        for gpu in layout.gpus[guest]
        for host in layout.on_gpu[gpu]
        if host not in kept_guests
    }
    for job_id in list(layout.jobs):
        if job_id not in kept_guests and job_id not in hosting:
            job = layout.jobs[job_id]
            chosen = spb_enabled and _chooses_spb(job)
            layout.config[job_id] = _best_alone(job, layout) if chosen else _own_config(job)

    # 4. Pack waiting jobs as guests.
    waiting = [
        job
        for job in ordered
        if job.waiting
        and job.id not in layout.jobs
        and job.model is not None
        and job.workers <= len(usable)
    ]
    rooms = _Rooms(layout, usable)
    failures = 0
    for job in waiting[:max_guests]:
        if _pack(rooms, job, base[job.id], min_gain, max_host_loss):
            started.append(job.id)
            failures = 0
        else:
            failures += 1
            if failures == MAX_FAILURES:
                break  # the rest of the queue is unlikely to fit where these did not

    suspend = tuple(
        sorted([j.id for j in snapshot.jobs if j.holding and j.id not in layout.jobs] + moved)
    )
    start = tuple(
        Placement(job_id, layout.gpus[job_id], spb.as_json(layout.config[job_id]))
        for job_id in started
    )
    reconfigure = tuple(
        Reconfigure(job_id, spb.as_json(layout.config[job_id]))
        for job_id, job in layout.jobs.items()
        if job.holding and job_id not in moved and spb.as_json(layout.config[job_id]) != job.spb
    )
    return Plan(start=start, suspend=suspend, reconfigure=reconfigure)


def _chooses_spb(job: JobView) -> bool:
    """Whether the policy may choose the job's SPB configuration: only when its spec
    leaves it to the scheduler (`auto`; the simulator's traces carry no setting and are
    all left to it)."""
    return job.spb_setting == "auto"


def _own_config(job: JobView) -> SPBConfig | None:
    """The configuration the job runs at unless the policy chooses one: its spec's fixed
    configuration, else off."""
    return spb.resolve(job.spb_setting)


def _order(
    job: JobView,
    snapshot: ClusterSnapshot,
    starvation_seconds: float,
    stickiness: float,
    sizing: _Sizing,
    drain: float,
    straggler_discount: float,
    paced: dict[int, int],
) -> tuple[int, bool, bool, float, float, int]:
    arrived = (snapshot.now - job.created_at).total_seconds()
    waited = arrived - job.attained_gpu_seconds / job.workers
    # Time not holding GPUs stops growing once a job runs, so a job promoted for
    # starving keeps its place until it ends instead of being preempted next round.
    starving = waited > starvation_seconds
    remaining = sizing.remaining_gpu_seconds(job)
    if _outlasts(job, sizing.per_node, drain):
        remaining *= straggler_discount
    if job.holding:
        remaining *= stickiness
    return (-job.priority, not starving, job.id not in paced, remaining, -arrived, job.id)


def _least(job: JobView, per_node: int) -> tuple[float, float]:
    """The fewest GPU-seconds and the fewest seconds the job needs to finish, over its
    sizes on the fewest nodes, full backprop: its cost curve's cheapest and fastest
    ends."""
    curve, left = _curve(job, per_node), _left(job)
    return left * curve[-1][1], left * curve[0][0]


def _outlasts(job: JobView, per_node: int, seconds: float) -> bool:
    """Whether the job needs at least `seconds` even at its fastest size (0: never)."""
    return bool(seconds) and job.model is not None and _least(job, per_node)[1] >= seconds


def _drain_seconds(jobs: list[JobView], per_node: int, gpus: int) -> float:
    """How long the cluster needs at least to finish the jobs it knows of, each at its
    cheapest size (jobs without a speed model not counted)."""
    total = sum(_least(job, per_node)[0] for job in jobs if job.model is not None)
    return total / max(gpus, 1)


def _paced(
    snapshot: ClusterSnapshot,
    jobs: list[JobView],
    per_node: int,
    gpus: int,
    pace_after_seconds: float,
) -> dict[int, int]:
    """The jobs to pace and the GPUs each gets: none until no job has been submitted
    for `pace_after_seconds`, and none once only paced jobs wait.

    With no new work coming, the backlog is all there is, and the cluster is free when
    its last job ends. The jobs that cannot finish by then at their cheapest size must
    start now, beside the short ones, not after them (least GPU-time first would start
    them last, and they would end alone on a cluster they cannot use well). "By then"
    is the least makespan of every known job's remaining work (`scheduler.core.makespan`, a
    bound no schedule reaches). A paced job runs on the most GPUs (of its sizes) no
    wider than the width it needs on average to finish by then (its least GPU-seconds
    to do so over that time); narrower, it falls behind, and the bound, computed again
    every round, raises its width until it is moved up. A job that holds a size
    between the sizes around its width keeps it while the GPUs go round (the most to
    go first): moved each time its width crossed a size, it would restart every few
    leases, and kept beyond the GPUs, a paced job would wait behind the others.

    Once no unpaced job waits, least GPU-time first and growth give the paced jobs the
    whole cluster anyway, and pacing would only hold the first of them back to finish
    with the last: at the end of the Pollux traces (arrivals over, long jobs left) that
    cost 0.8 points of median average JCT for 2.2 of efficiency (README).
    """
    newest = snapshot.last_submitted_at
    if newest is None or (snapshot.now - newest).total_seconds() < pace_after_seconds:
        return {}
    modelled = [job for job in jobs if job.model is not None]
    if all(len(job.model.sizes) < 2 for job in modelled if job.model is not None):
        return {}  # none can be resized (the real cluster's jobs, Philly's)
    work = [(_curve(job, per_node), float(_left(job))) for job in modelled]
    deadline = shortest_makespan(work, gpus)
    paced: dict[int, int] = {}
    keep: list[tuple[float, int, int]] = []  # (minus time to go at best, job, size held)
    for job, (curve, left) in zip(modelled, work, strict=True):
        assert job.model is not None
        if len(job.model.sizes) < 2 or not left or deadline >= left * curve[-1][0]:
            continue  # cannot be resized, or finishes in time at its cheapest
        width = least_cost(curve, deadline, left) / deadline
        sizes = job.model.sizes
        paced[job.id] = max((w for w in sizes if w <= width), default=sizes[0])
        wider = min((w for w in sizes if w >= width), default=sizes[-1])
        held = len(job.allocated_gpu_ids)
        if paced[job.id] < held <= wider:
            keep.append((-left * curve[0][0], job.id, held))
    if not any(job.waiting and job.id not in paced for job in jobs):
        return {}
    spare = gpus - sum(paced.values())
    for _, job_id, held in sorted(keep):
        if held - paced[job_id] <= spare:
            spare -= held - paced[job_id]
            paced[job_id] = held
    return paced


def _curve(job: JobView, per_node: int) -> Curve:
    """The job's (seconds, GPU-seconds) per iteration by size, on the fewest nodes at
    full backprop, as a lower convex hull (`scheduler.core.makespan.hull`)."""
    assert job.model is not None
    key = ("curve", per_node)
    if key not in job.model.memo:
        job.model.memo[key] = hull((t, w * t) for w, t in _steps(job, per_node).items())
    return job.model.memo[key]  # type: ignore[return-value]


def _left(job: JobView) -> int:
    """Iterations the job has still to run."""
    assert job.model is not None
    return max(job.model.iterations_total - job.iterations_done, 0)


@dataclass(frozen=True)
class _Sizing:
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
        size = _efficient_size(job, self.per_node, self.floor)
        if (
            self.floor
            and self.long_floor > self.floor
            and job.model is not None
            and remaining_seconds_at(job, size, self.per_node) > self.long_seconds
        ):
            size = _efficient_size(job, self.per_node, self.long_floor)
        return min(size, len(job.allocated_gpu_ids)) if job.holding else size

    def remaining_gpu_seconds(self, job: JobView) -> float:
        """What finishing the job costs the cluster: its remaining time at its base
        size times that size (a small job that is a little longer beats a wide one, as
        SRSF); without a speed model, its iterations left (as SRTF)."""
        if job.model is None:
            return remaining_seconds(job)
        size = self.base(job)
        return size * remaining_seconds_at(job, size, self.per_node)


def _size_jobs(
    ordered: list[JobView],
    guests: set[int],
    *,
    budget: int,
    capacity: int,
    sizing: _Sizing,
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


def _grow(
    admitted: list[JobView],
    guests: set[int],
    layout: _Layout,
    pool: FreePool,
    usable: dict[int, GPUView],
    started: list[int],
    moved: list[int],
    min_grow_saving: float,
    growth: _Growth,
) -> None:
    """GPUs nobody else is admitted to grow placed jobs, in order: each to the size
    that finishes it soonest on the nodes the free GPUs are on (a gang spread thin can
    be slower than a smaller one on one node), up to `growth.widest`. Idle, those GPUs
    would add nothing; a running job moves only when that saves it `min_grow_saving`
    seconds, its restart included."""
    for job in admitted:
        if pool.total == 0:
            return
        held = layout.gpus.get(job.id)
        if job.id in guests or held is None or job.model is None or len(job.model.sizes) < 2:
            continue
        if any(g not in usable for g in held):
            continue
        mine = [usable[g] for g in held]
        fresh = job.id in started
        chosen, soonest = 0, _remaining_on(job, len(held), layout.nodes[job.id])
        if not fresh:
            soonest -= min_grow_saving
        widest = growth.widest(job, len(held))
        for workers in job.model.sizes:
            if workers <= len(held):
                continue
            if workers > widest:
                break
            span = pool.span(workers, mine)
            if span is None:
                break
            finish = _remaining_on(job, workers, span)
            if finish < soonest:
                chosen, soonest = workers, finish
        if chosen:
            config = layout.config[job.id]
            layout.take(job.id)
            pool.give(mine)
            placed = pool.take(chosen)
            assert placed is not None  # span said it fits
            layout.put(job, tuple(g.id for g in placed), config)
            if not fresh:
                started.append(job.id)
                moved.append(job.id)


def _tail_first(
    admitted: list[JobView], layout: _Layout, per_node: int, threshold: float
) -> list[JobView]:
    """`admitted`, with the jobs that need at least `threshold` seconds even at their
    fastest size (0: none) reordered among their own places, most time to go where
    they are first."""

    def left(job: JobView) -> float:
        if job.id not in layout.gpus:
            return 0.0
        return _remaining_on(job, len(layout.gpus[job.id]), layout.nodes[job.id])

    tail = {job.id for job in admitted if _outlasts(job, per_node, threshold)}
    longest = iter(sorted((job for job in admitted if job.id in tail), key=left, reverse=True))
    return [next(longest) if job.id in tail else job for job in admitted]


@dataclass(frozen=True)
class _Growth:
    """How wide growth may make a job in this pass.

    A job with more than `long_seconds` to go grows only to sizes where it makes at
    least `floor` of its best progress per GPU: grown, it would hold those GPUs for
    hours (it moves again only for a real saving), where a short job hands them back
    soon. Without a floor (the last pass) a job grows as far as finishing sooner goes.
    """

    per_node: int
    floor: float
    long_seconds: float

    def widest(self, job: JobView, held: int) -> float:
        assert job.model is not None
        if not self.floor or remaining_seconds_at(job, held, self.per_node) <= self.long_seconds:
            return math.inf
        values = _per_gpu_values(job, self.per_node)
        best = max(values.values())
        return max(w for w in job.model.sizes if w <= held or values[w] >= self.floor * best)


def remaining_seconds_at(job: JobView, workers: int, per_node: int) -> float:
    """Seconds to finish on `workers` GPUs on the fewest nodes, full backprop."""
    return _remaining_on(job, workers, -(-workers // per_node))


def _remaining_on(job: JobView, workers: int, nodes: int) -> float:
    """Seconds to finish on `workers` GPUs spanning `nodes` nodes, full backprop."""
    assert job.model is not None
    return _left(job) * job.model.step_at(workers, nodes)[0]


def _steps(job: JobView, per_node: int) -> dict[int, float]:
    """Seconds per iteration by size, on the fewest nodes, full backprop."""
    assert job.model is not None
    key = ("steps", per_node)
    if key not in job.model.memo:
        job.model.memo[key] = {
            workers: job.model.step_at(workers, -(-workers // per_node))[0]
            for workers in job.model.sizes
        }
    return job.model.memo[key]  # type: ignore[return-value]


def _per_gpu_values(job: JobView, per_node: int) -> dict[int, float]:
    """Progress per GPU by size, on the fewest nodes (relative units)."""
    assert job.model is not None
    key = ("per_gpu", per_node)
    if key not in job.model.memo:
        steps = _steps(job, per_node)
        job.model.memo[key] = {workers: 1.0 / (step * workers) for workers, step in steps.items()}
    return job.model.memo[key]  # type: ignore[return-value]


def _shrink_floor(
    jobs: list[JobView], per_node: int, capacity: int, floors: tuple[float, ...]
) -> float:
    """How hard to shrink jobs this round: not at all while what they ask for fits,
    else the mildest floor under which they do (the hardest when none does)."""
    if sum(job.workers for job in jobs) <= capacity:
        return 0.0
    for floor in floors:
        if sum(_efficient_size(job, per_node, floor) for job in jobs) <= capacity:
            return floor
    return floors[-1] if floors else 0.0


def _efficient_size(job: JobView, per_node: int, floor: float) -> int:
    """The most GPUs the job runs on at no less than `floor` of its best useful
    progress per GPU (a job that asked for more GPUs than it can use well gets fewer;
    a job whose speed is known only as asked gets what it asked)."""
    if job.model is None or len(job.model.sizes) < 2:
        return job.workers
    key = ("size", per_node, floor)
    if key not in job.model.memo:
        job.model.memo[key] = _efficient_size_at(job, per_node, floor)
    return job.model.memo[key]  # type: ignore[return-value]


def _efficient_size_at(job: JobView, per_node: int, floor: float) -> int:
    # Shrink only: sizes above what the job asked for are for growing into idle GPUs.
    values = _per_gpu_values(job, per_node)
    asked = [w for w in values if w <= job.workers]
    best = max(values[w] for w in asked)
    return max(w for w in asked if values[w] >= floor * best)


def _guests(snapshot: ClusterSnapshot) -> set[int]:
    """Running jobs that joined a GPU another job held first."""
    jobs = {job.id: job for job in snapshot.jobs}
    first = snapshot.now.timestamp()
    guests: set[int] = set()
    for node in snapshot.nodes:
        for gpu in node.gpus:
            if len(gpu.holders) < 2:
                continue
            since = {
                j: (held.timestamp() if (held := jobs[j].held_since) else first, j)
                for j in gpu.holders
                if j in jobs
            }
            if since:
                primary = min(since, key=since.__getitem__)
                guests.update(j for j in since if j != primary)
    return guests


def _alone_useful(job: JobView, shape: Shape) -> float:
    assert job.model is not None
    return job.workers * job.model.alone_step_seconds / (shape.step_seconds * shape.steps_ratio)


def _best_alone(job: JobView, layout: _Layout) -> SPBConfig | None:
    """Off, or the configuration that yields more useful progress on its own."""
    workers = len(layout.gpus[job.id])
    if job.model is None or job.model.spb_profile is None or workers < 2:
        return None
    nodes = len({layout.node_of[g] for g in layout.gpus[job.id]})
    key = ("best_alone", workers, nodes)
    if key not in job.model.memo:
        job.model.memo[key] = _best_alone_at(job, workers, nodes)
    return job.model.memo[key]  # type: ignore[return-value]


def _best_alone_at(job: JobView, workers: int, nodes: int) -> SPBConfig | None:
    assert job.model is not None
    best: SPBConfig | None = None
    best_value = _alone_useful(job, job.model.shape(None, workers, nodes))
    for config in CONFIGS:
        value = _alone_useful(job, job.model.shape(config, workers, nodes))
        if value > best_value * 1.01:  # not for a rounding error's worth
            best, best_value = config, value
    return best


def _hosting_config(job: JobView, layout: _Layout) -> SPBConfig | None:
    """The SPB configuration that leaves the most room on its partial workers for a
    guest at the least statistical price."""
    workers = len(layout.gpus[job.id])
    if job.model is None or job.model.spb_profile is None or workers < 2 or not _chooses_spb(job):
        return layout.config[job.id]
    nodes = len({layout.node_of[g] for g in layout.gpus[job.id]})
    key = ("hosting", workers, nodes)
    if key not in job.model.memo:

        def room(config: SPBConfig) -> float:
            shape = job.model.shape(config, workers, nodes)  # type: ignore[union-attr]
            slack = sum(1.0 - d for d in shape.demands)
            return slack * _alone_useful(job, shape)

        job.model.memo[key] = max(CONFIGS, key=room)
    return job.model.memo[key]  # type: ignore[return-value]


@dataclass
class _Rooms:
    """GPUs a guest may join, least loaded first, under the hosts' current
    configurations or with every host switched to its hosting configuration.

    Ranked once per round: a guest scans from the front for GPUs its memory fits on,
    so placing one costs about its own size, not the cluster's.
    """

    layout: _Layout
    usable: dict[int, GPUView]
    ranked: dict[bool, list[tuple[float, int, int, int]]] = field(default_factory=dict)
    taken: set[int] = field(default_factory=set)

    def hosting(self) -> dict[int, SPBConfig | None]:
        hosts = {on[0] for g in self.usable if len(on := self.layout.on_gpu.get(g, [])) == 1}
        switched = {h: _hosting_config(self.layout.jobs[h], self.layout) for h in hosts}
        return {h: c for h, c in switched.items() if c != self.layout.config[h]}

    def rank(self, switch: bool) -> list[tuple[float, int, int, int]]:
        if switch not in self.ranked:
            layout = self.layout
            changed = self.hosting() if switch else {}
            saved = {h: layout.config[h] for h in changed}
            layout.config.update(changed)
            entries = [
                (0.0, layout.node_of[gpu], gpu, 0)
                for gpu in self.usable
                if not layout.on_gpu.get(gpu)
            ]
            for job_id, gpus in layout.gpus.items():
                shape = layout.shape(job_id)
                if shape is None:
                    continue
                for rank, gpu in enumerate(gpus):
                    if gpu in self.usable and len(layout.on_gpu[gpu]) == 1:
                        entries.append(
                            (
                                shape.demands[rank],
                                layout.node_of[gpu],
                                gpu,
                                shape.worker_memory_bytes[rank],
                            )
                        )
            layout.config.update(saved)
            entries.sort()
            self.ranked[switch] = entries
        return self.ranked[switch]

    def choose(self, size: int, need: int, switch: bool) -> tuple[int, ...] | None:
        chosen = []
        memory = self.layout.memory_of
        for _, _, gpu, used in self.rank(switch):
            if gpu in self.taken or used + need > memory[gpu]:
                continue
            chosen.append(gpu)
            if len(chosen) == size:
                return tuple(chosen)
        return None


def _pack(
    rooms: _Rooms,
    job: JobView,
    size: int,
    min_gain: float,
    max_host_loss: float,
) -> bool:
    """Place `job` as a guest where it adds the most, if it adds at least `min_gain`
    useful GPUs per GPU it takes."""
    assert job.model is not None
    layout = rooms.layout
    guest = job.model.shape(_own_config(job), size, 1)
    need = max(guest.worker_memory_bytes)
    best: tuple[float, tuple[int, ...], dict[int, SPBConfig | None]] | None = None
    for switch in (False, True):
        choice = rooms.choose(size, need, switch)
        if choice is None:
            continue
        touched = {layout.on_gpu[g][0] for g in choice if layout.on_gpu.get(g)}
        configs = {}
        if switch:
            configs = {
                h: c
                for h in touched
                if (c := _hosting_config(layout.jobs[h], layout)) != layout.config[h]
            }
            if not configs:
                continue
        gain = _gain(layout, job, choice, configs, max_host_loss)
        if gain >= min_gain * len(choice) and (best is None or gain > best[0]):
            best = (gain, choice, configs)
    if best is None:
        return False
    _, choice, configs = best
    layout.config.update(configs)
    layout.put(job, choice, _own_config(job))
    rooms.taken.update(choice)
    return True


def _gain(
    layout: _Layout,
    job: JobView,
    choice: tuple[int, ...],
    configs: dict[int, SPBConfig | None],
    max_host_loss: float,
) -> float:
    """Useful GPUs gained by placing `job` on `choice` with these host configurations."""
    hosts = {layout.on_gpu[g][0] for g in choice if layout.on_gpu.get(g)}
    # Every job sharing a GPU with a host is affected through the host's pace only.
    before = {h: layout.useful(h) for h in hosts}
    saved = {h: layout.config[h] for h in configs}
    layout.config.update(configs)
    layout.put(job, choice, _own_config(job))
    after = {h: layout.useful(h) for h in hosts}
    guest = layout.useful(job.id)
    layout.take(job.id)
    layout.config.update(saved)
    # Hosts are ahead of the guest in the order (shorter, or starving): packing must
    # not cost them more than `max_host_loss` of their progress.
    if any(after[h] < before[h] * (1.0 - max_host_loss) for h in hosts):
        return -math.inf
    return guest + sum(after.values()) - sum(before.values())
