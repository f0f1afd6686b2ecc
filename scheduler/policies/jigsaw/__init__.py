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
   so that a small difference never pays a restart, and by the start they would pay
   again if displaced, and waiting jobs' charged their start (`JobView.start_seconds`,
   measured on the cluster): a job of seconds displaces another only for more than
   both starts cost. A job that would set the
   makespan if started last counts its GPU-time at `straggler_discount`: one that
   needs at least `straggler_drain` times the cluster's drain time (every known job's
   fewest GPU-seconds over the GPUs) even at its fastest size. Least GPU-time first
   would run it after the jobs queued beside it, then alone, with GPUs idle (a job
   that does not scale) or spent wide at a fraction of their worth (one that does);
   discounted, not first, it starts ahead of longer queued work, not of short jobs.
   Once no job has been submitted for `pace_after_seconds`, the backlog is all there
   is to finish, and the jobs that cannot finish by the least makespan of all known
   work (`scheduler.core.makespan`) times 1 + `pace_slack` at their cheapest size are
   paced: they go first (after priority and starvation), at the width they need to
   finish by then (`ordering.paced`); only while other jobs wait, since the order and
   growth then give them the rest.
2. Size and admit in that order while whole GPUs remain (as the preemptive baselines
   do). A job's base size is what it asked for while all requests fit the cluster;
   else the most GPUs it uses at no less than a floor of its best progress per GPU,
   and a job with more than `long_job_seconds` to go even at that size at no less
   than `long_job_floor` (a running job: that or what it holds, whichever is less); a
   paced job's is its pace. The floor is the one of `efficiency_floors` whose sizes,
   in its order, end the jobs soonest on average were each to run at its base size
   as GPUs free up (`sizing.completion_sum`): shrinking everyone to fit can end them
   all later than queueing some at the sizes they use well (a burst of jobs that each
   run well on 4 GPUs and 78% as well per GPU on 8: two of them one after the other on
   8 beat both on 4 at once; two that each end 1.8x sooner on 4 GPUs than on 1 end
   sooner on average one after the other on 4 than both at once on 2 or 1), and
   admitting everyone is better where width buys little. The floors are a low one and
   high ones: a middle floor's sizes are what growth reaches from a high one's where
   GPUs stay idle. At light load (what the jobs ask for at most `fluid_load` times
   the GPUs) adaptive jobs may take the sizes that maximise the sum of each job's
   completion rate to the power `fluid_exponent` (`fluid`: the short jobs wider, GPUs
   spread over all), taken where they run the jobs the floor's sizes run (every round
   sizes them again), else where their completion sum is no larger.
   Running jobs then keep what they hold above their base while GPUs remain, in
   order, and shrink to it (move) when a job ahead needs them, instead of being
   suspended. Kept jobs stay where they are; a running job sized up grows around its
   GPUs where its node has room (in place on the cluster); newcomers and other moved
   jobs are gang-placed on free GPUs; running jobs not admitted keep running where
   nobody took their GPUs. GPUs still free then grow placed jobs, in order, each to the size
   (including more than it asked for) that finishes it soonest on the nodes those GPUs
   are on (or to fewer GPUs where that is faster: a gang spread over more nodes than its
   size needs gathers on fewer, at its size where GPUs there are free; one measured
   slower at its size than at a smaller one keeps its first GPUs, in place on the
   cluster); a running job only when that saves it `min_grow_saving` seconds, or
   `min_grow_share` of its time to go if less (a job near its end gains in proportion
   to what it has left), its restart included. In a first pass a job with more than
   `grow_floor_seconds` to go grows only to sizes at `grow_floor` of its best progress
   per GPU (it would hold the GPUs for hours), so the jobs behind it grow too; GPUs
   still idle after that go as fast as they speed jobs up.
   In the first pass the jobs that need at least `tail_share` of the drain time even at
   their fastest size (they will still run when the cluster drains) take their turns
   longest first, so that they finish together instead of the last alone on a cluster it
   cannot fill. Idle GPUs add nothing, so growth costs nothing until a job ahead needs
   them back. A running job that ends the round on the GPUs it holds (shrunk in
   admission for a job that then found no room, grown back into them) is not moved.
3. Give every placed job the SPB configuration (or off) with the most useful progress
   alone: fewer bytes to synchronise can outweigh the statistical price.
4. Pack: jobs still waiting, in order, are placed as guests on GPUs of running jobs
   when that raises the cluster's useful progress. A guest's workers go first on the
   partial workers of hosts switched to an SPB configuration (whose idle time and freed
   activation memory host it without slowing the host, whose pace its full workers
   set), then on GPUs whose jobs leave underused (idle during synchronisation, or busy
   at a fraction of the GPU while computing). What sharing a GPU costs each job there
   is the measured interference model of the GPU's generation and `sharing` mode, fed
   every worker's solo utilization (`scheduler.core.jobmodel.colocation_stretch`): a
   GPU one job saturates predicts a loss for any guest, and a job whose utilization is
   not known (on the cluster: not reported yet) is neither guest nor host. GPU memory
   is never over-committed. A job that needs `tail_share` of the drain time even at its
   fastest size (it will still run when the cluster drains; the last such job ends the
   workload) hosts only guests like it: what a guest that ends sooner anyway costs it
   comes due at the end, for everyone, while beside another such job the pair ends
   sooner together than one after the other. A guest is placed only when the gain net
   of what its hosts lose is at least `min_gain` GPUs, and yields at the next lease
   boundary once a host's iteration takes more than `yield_slowdown` times as long as
   alone: measured on the cluster where the host has run beside co-runners (the
   snapshot's `colocated_slowdown`), else predicted; no guest joins a host measured
   past it.

The steps are modules of this package: `ordering` (1), `sizing`, `fluid` and `growth` (2),
`spb_choice` (3), `packing` (4); `params.JigsawParams` holds every constant named here,
`speeds` what is derived from a job's speed model alone.

Cost: sorting is O(J log J) for J jobs, once per shrink floor (the drain time O(J); the
least makespan, when pacing, O(C log C) for the C corners of the jobs' cost curves); the
completion sum O(J (S + log J)) per floor for S distinct sizes; fluid sizing, at light
load, O(J x S) vector steps over the G GPUs; sizing O(J) (per-job
choices cached per model); placement O(J + G) for G GPUs; growth O(S x P) per job for S
sizes and P GPUs per node (how a gang would spread is predicted from free counts per
node), O(1) per job once no GPU is free (but for gangs spread over nodes or faster on
fewer GPUs); packing O(G log G) to rank candidate GPUs once, then O(W) per guest of W
workers over at most `max_guests` guests per round. Jobs without a speed model (or with
one size: on the real cluster, every job not `elastic`) are never resized; without a
model they are scheduled like SRTF by iterations left and are never packed or given SPB.
A running job whose spec is elastic moves by the plan's `Resize` (`resizing`), growing
or shrinking to a faster size only for more than its measured resize cost. The policy
chooses the SPB configuration only of jobs whose spec says `auto`: one that says `off`
or fixes a configuration runs as its spec says, placed, kept or packed."""

from __future__ import annotations

from jigsaw import spb
from scheduler.core.interference import fitted
from scheduler.core.plan import Placement, Plan, Reconfigure
from scheduler.core.snapshot import ClusterSnapshot, GPUView
from scheduler.policies.jigsaw import (
    fluid,
    growth,
    ordering,
    packing,
    resizing,
    sizing,
    spb_choice,
    speeds,
)
from scheduler.policies.jigsaw.layout import Layout, guests_of
from scheduler.policies.jigsaw.params import CONFIGS, JigsawParams
from scheduler.policies.placement import candidates

__all__ = ["CONFIGS", "JigsawParams", "schedule"]

DEFAULTS = JigsawParams()


def schedule(snapshot: ClusterSnapshot, params: JigsawParams = DEFAULTS) -> Plan:
    """One round: the steps of the module docstring, each a function of its own."""
    usable = _usable(snapshot)
    every = snapshot.gpus_by_id()
    fits = fitted()
    layout = Layout(
        {g.id: fits.for_device(g.kind, params.sharing) for g in every.values()},
        node_of={g.id: g.node_id for g in every.values()},
        memory_of={g.id: g.memory_bytes for g in every.values()},
    )
    jobs = candidates(snapshot)
    per_node = max((len(node.gpus) for node in snapshot.nodes), default=1)

    # 1. Order (and size: the shrink floor whose order and sizes end jobs soonest).
    paced = ordering.paced(
        snapshot, jobs, per_node, len(usable), params.pace_after_seconds, params.pace_slack
    )
    drain = ordering.drain_seconds(jobs, per_node, len(usable))
    # The jobs that will still run when the cluster drains (the last of them ends the
    # workload): they grow longest first and host only each other.
    tail = {job.id for job in jobs if speeds.outlasts(job, per_node, drain * params.tail_share)}
    choices = []
    floors = sizing.shrink_floors(jobs, len(usable), params.efficiency_floors)
    for floor in floors:
        rule = sizing.Sizing(per_node, floor, params.long_job_seconds, params.long_job_floor, paced)
        ordered = ordering.order(jobs, snapshot, rule, drain, params)
        ends = sizing.completion_sum(ordered, rule, len(usable)) if len(floors) > 1 else 0.0
        choices.append((ends, rule, ordered))
    _, rule, ordered = min(choices, key=lambda choice: choice[0])

    # 2. Size and admit whole GPUs in order, then grow into what is left.
    guests = guests_of(snapshot)
    base, size = sizing.size_jobs(
        ordered, guests, budget=len(usable), capacity=snapshot.alive_gpu_count(), sizing=rule
    )
    if params.fluid_load and fluid.applies(snapshot, jobs, len(usable), paced, params):
        size = fluid.sizes(ordered, size, guests, len(usable), rule, params)
    packed = {g for job in snapshot.jobs if job.id in guests for g in job.allocated_gpu_ids}
    admission = sizing.admit(ordered, size, guests, layout, usable, packed)
    started, moved = admission.started, admission.moved
    if params.grow:
        admitted = [job for job in ordered if job.id in size]
        regrown = growth.grow(
            admitted,
            guests,
            layout,
            admission.pool,
            usable,
            started,
            per_node,
            tail,
            params,
        )
        started, moved = [*started, *regrown], [*moved, *regrown]
    kept_guests = growth.keep_guests(ordered, guests, layout, usable, params.yield_slowdown)

    # 3. Choose SPB configurations; 4. pack waiting jobs as guests.
    spb_choice.choose(layout, kept_guests, params)
    started += packing.pack(ordered, base, layout, usable, params, tail)
    return _plan(snapshot, layout, started, moved, params.rebatch_gain)


def _usable(snapshot: ClusterSnapshot) -> dict[int, GPUView]:
    """The GPUs new work may go on: those of alive, schedulable nodes."""
    return {
        gpu.id: gpu
        for node in snapshot.nodes
        if node.alive and node.schedulable
        for gpu in node.gpus
    }


def _plan(
    snapshot: ClusterSnapshot,
    layout: Layout,
    started: list[int],
    moved: list[int],
    rebatch_gain: float,
) -> Plan:
    """The changes from what runs now to `layout`: a moved elastic job is resized, the
    other moved jobs suspended and started again; an adaptive job that stays changes its
    batch where it is for `rebatch_gain` more goodput or more. A job moved back onto
    the GPUs it holds (sized below them in admission, then grown into them again, the
    only ones free) stays: restarting it there would change nothing but cost a start."""
    back = {
        job_id
        for job_id in moved
        if set(layout.gpus[job_id]) == set(layout.jobs[job_id].allocated_gpu_ids)
    }
    moved = [job_id for job_id in moved if job_id not in back]
    started = [job_id for job_id in started if job_id not in back]
    resize = resizing.resizes(layout, moved)
    resized = {change.job_id for change in resize}
    suspend = tuple(
        sorted(
            [j.id for j in snapshot.jobs if j.holding and j.id not in layout.jobs]
            + [job_id for job_id in moved if job_id not in resized]
        )
    )
    start = tuple(
        Placement(
            job_id,
            layout.gpus[job_id],
            spb.as_json(layout.config[job_id]),
            resizing.batch(layout, job_id),
        )
        for job_id in started
        if job_id not in resized
    )
    reconfigure = tuple(
        Reconfigure(job_id, spb.as_json(layout.config[job_id]))
        for job_id, job in layout.jobs.items()
        if job.holding and job_id not in moved and spb.as_json(layout.config[job_id]) != job.spb
    )
    reconfigured = {change.job_id for change in reconfigure}
    staying = [
        job_id
        for job_id, job in layout.jobs.items()
        if job.holding
        and job_id not in moved
        and job_id not in reconfigured
        and set(layout.gpus[job_id]) == set(job.allocated_gpu_ids)
    ]
    rebatch = resizing.rebatches(layout, staying, rebatch_gain)
    return Plan(start=start, suspend=suspend, reconfigure=reconfigure, resize=resize + rebatch)
