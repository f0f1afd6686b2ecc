"""Step 1, the order: priority, then starving jobs, then paced jobs, then least
remaining GPU-time (running jobs' discounted by `stickiness` and by their restart,
waiting jobs' charged their start, the makespan setters' discounted by
`straggler_discount`); and pacing, the width of the jobs that would set the makespan
once submissions stop."""

from __future__ import annotations

from scheduler.core.makespan import Curve, least_cost, shortest_makespan
from scheduler.core.snapshot import ClusterSnapshot, JobView
from scheduler.policies.jigsaw.params import JigsawParams
from scheduler.policies.jigsaw.sizing import Sizing
from scheduler.policies.jigsaw.speeds import curve, least, left, outlasts


def order(
    jobs: list[JobView],
    snapshot: ClusterSnapshot,
    sizing: Sizing,
    drain_seconds: float,
    params: JigsawParams,
) -> list[JobView]:
    """The jobs in the order they are sized, admitted, grown and packed."""
    # A job that needs `straggler_drain` of the drain time even at its fastest size
    # would, started last, run alone at the end and set the makespan (0: never).
    drain = drain_seconds * params.straggler_drain
    return sorted(jobs, key=lambda job: _key(job, snapshot, sizing, drain, params))


def _key(
    job: JobView, snapshot: ClusterSnapshot, sizing: Sizing, drain: float, params: JigsawParams
) -> tuple[int, bool, bool, float, float, int]:
    arrived = (snapshot.now - job.created_at).total_seconds()
    remaining = sizing.remaining_gpu_seconds(job)
    if outlasts(job, sizing.per_node, drain):
        remaining *= params.straggler_discount
    start = (job.start_seconds or 0.0) * job.workers
    if job.holding:
        # Displaced, a running job would pay its start again when it resumes.
        remaining = remaining * params.stickiness - start
    else:
        # A waiting job must start before it progresses: one barely shorter than a
        # running job does not displace it (jobs of seconds, whose start is most of it).
        remaining += start
    return (
        -job.priority,
        not starving(job, snapshot, params),
        job.id not in sizing.paced,
        remaining,
        -arrived,
        job.id,
    )


def starving(job: JobView, snapshot: ClusterSnapshot, params: JigsawParams) -> bool:
    """Whether the job has waited more than `starvation_seconds` in all. Time not
    holding GPUs stops growing once a job runs, so a job promoted for starving keeps
    its place until it ends instead of being preempted next round."""
    arrived = (snapshot.now - job.created_at).total_seconds()
    return arrived - job.attained_gpu_seconds / job.workers > params.starvation_seconds


def drain_seconds(jobs: list[JobView], per_node: int, gpus: int) -> float:
    """How long the cluster needs at least to finish the jobs it knows of, each at its
    cheapest size (jobs without a speed model not counted)."""
    total = sum(least(job, per_node)[0] for job in jobs if job.model is not None)
    return total / max(gpus, 1)


def paced(
    snapshot: ClusterSnapshot,
    jobs: list[JobView],
    per_node: int,
    gpus: int,
    pace_after_seconds: float,
    slack: float,
) -> dict[int, int]:
    """The jobs to pace and the GPUs each gets: none until no job has been submitted
    for `pace_after_seconds`, and none once only paced jobs wait.

    With no new work coming, the backlog is all there is, and the cluster is free when
    its last job ends. The jobs that cannot finish by then at their cheapest size must
    start now, beside the short ones, not after them (least GPU-time first would start
    them last, and they would end alone on a cluster they cannot use well). "By then"
    is the least makespan of every known job's remaining work (`scheduler.core.makespan`, a
    bound no schedule reaches) times 1 + `slack`: paced to the bound itself, the long
    jobs hold the most GPUs while short ones wait (docs/results/elastic-sim.md, "Pacing
    at high load"). A paced job runs on the most GPUs (of its sizes) no
    wider than the width it needs on average to finish by then (its least GPU-seconds
    to do so over that time); narrower, it falls behind, and the bound, computed again
    every round, raises its width until it is moved up. A job that holds a size
    between the sizes around its width keeps it while the GPUs go round (the most to
    go first): moved each time its width crossed a size, it would restart every few
    leases, and kept beyond the GPUs, a paced job would wait behind the others.

    Once no unpaced job waits, least GPU-time first and growth give the paced jobs the
    whole cluster anyway, and pacing would only hold the first of them back to finish
    with the last (docs/results: 0.8 points of median average JCT for 2.2 of
    efficiency at the end of the Pollux traces).
    """
    newest = snapshot.last_submitted_at
    if newest is None or (snapshot.now - newest).total_seconds() < pace_after_seconds:
        return {}
    modelled = [job for job in jobs if job.model is not None]
    if all(len(job.model.sizes) < 2 for job in modelled if job.model is not None):
        return {}  # none can be resized (the real cluster's jobs, Philly's)
    work = [(curve(job.model, per_node), float(left(job))) for job in modelled if job.model]
    deadline = shortest_makespan(work, gpus) * (1.0 + slack)
    widths = _widths(modelled, work, deadline)
    if not any(job.waiting and job.id not in widths for job in jobs):
        return {}
    return _keep_held(modelled, work, widths, gpus)


def _widths(
    modelled: list[JobView], work: list[tuple[Curve, float]], deadline: float
) -> dict[int, tuple[int, int]]:
    """Each job that cannot finish by `deadline` at its cheapest: its sizes just
    below and just above the width it needs on average to finish by then."""
    widths: dict[int, tuple[int, int]] = {}
    for job, (costs, to_go) in zip(modelled, work, strict=True):
        assert job.model is not None
        if len(job.model.sizes) < 2 or not to_go or deadline >= to_go * costs[-1][0]:
            continue  # cannot be resized, or finishes in time at its cheapest
        width = least_cost(costs, deadline, to_go) / deadline
        sizes = job.model.sizes
        below = max((w for w in sizes if w <= width), default=sizes[0])
        above = min((w for w in sizes if w >= width), default=sizes[-1])
        widths[job.id] = (below, above)
    return widths


def _keep_held(
    modelled: list[JobView],
    work: list[tuple[Curve, float]],
    widths: dict[int, tuple[int, int]],
    gpus: int,
) -> dict[int, int]:
    """Each paced job's size: the one below its width, or the size it holds between
    the two while GPUs remain, the most time to go first."""
    paced = {job_id: below for job_id, (below, _) in widths.items()}
    keep: list[tuple[float, int, int]] = []  # (minus time to go at best, job, size held)
    for job, (costs, to_go) in zip(modelled, work, strict=True):
        held = len(job.allocated_gpu_ids)
        if job.id in widths and widths[job.id][0] < held <= widths[job.id][1]:
            keep.append((-to_go * costs[0][0], job.id, held))
    spare = gpus - sum(paced.values())
    for _, job_id, held in sorted(keep):
        if held - paced[job_id] <= spare:
            spare -= held - paced[job_id]
            paced[job_id] = held
    return paced
