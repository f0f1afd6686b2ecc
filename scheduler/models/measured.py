"""Job models of the real cluster, from what the database knows of each active job.

The simulator builds a `JobModel` from application profiles; on the cluster there are
none, so the snapshot builds one from three sources, in three queries whatever the number
of jobs (no per-job query, and only the last `RECENT_ITERATIONS` rows of each job read
through the `(job_id, iteration)` index):

- speed: the mean step (without the slowest, a run's warm-up) and communication seconds
  of the job's recent iterations, at the size it holds: one size, the one it asked for.
  An elastic job, or one that adapts its batch, has every size it may run instead,
  fitted to the step times it measured at the sizes it ran and, adapting, at the batch
  with the most goodput given the gradient noise it reported
  (`scheduler.models.sizes_measured`: two more queries).
  Iterations at full backprop (no SPB depth reported) are taken as they are; iterations
  under SPB are converted back to full backprop through the SPB profile (the inverse of
  `JobModel.shape`), so a job switched to SPB keeps its model instead of losing it once
  its full-backprop iterations leave the window. A job with no iteration yet has no
  model: the policy schedules it by iterations left and neither packs it nor gives it
  SPB until it has reported some.
- length: `max_iterations`; a job with only a target metric is taken as
  `UNKNOWN_ITERATIONS` long (the longest a spec allows), as SRTF takes it as longest.
- SPB: a profile of its workload (`model_profiles`), only for a spec that says
  `spb: auto`: one measured on the kind of GPU the job holds first, then one priced
  (with SPB's statistical price, as `jigsaw profile --efficiency --save` stores it)
  over the unpriced ones every new job measures, then one at its per-worker batch,
  then the newest (one more query, for the kind of GPU each holds). A job whose spec
  says `off` or a fixed configuration gets none, so no policy prices SPB
  configurations for it.
- memory: the largest peak rank 0 reported in its recent iterations; unknown, it is
  taken to fill its GPU (the largest in the cluster), so nothing is packed beside it.
  Memory freed by SPB is not assumed: `activation_fraction` stays 0.
- utilization: the mean GPU utilization (0-1) its recent full-backprop iterations
  reported, the solo utilization the interference model reads; none reported (or only
  under SPB), it is None and JigSaw neither packs it nor packs beside it.

A job that has reported nothing yet has a model all the same where its workload was
profiled (`jigsaw profile --save`) at its per-worker batch on a kind of GPU the cluster
has, with the device's utilization and peak memory: the step is the profile's full
backprop, the utilization the profile's, the memory twice the profile's peak (its passes
hold no optimizer state, and the allocator reserves more than it hands out), at least
`MEMORY_SLACK_BYTES` above it. So a job submitted beside others can be packed from its
first placement instead of only once it has run alone; what it reports replaces the
profile's figures once it has reported three iterations (its utilization, once it
reports one). Its step is the profile's plus the runtime's own time per iteration as
the jobs that reported show it.

Apart from the model (`colocated_slowdowns`, one more query): how much longer a job's
iterations took beside co-runners than alone, measured, which JigSaw weighs against its
bound in place of the prediction (a guest yields when its host's passes it).
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, case, func, select
from sqlalchemy.orm import Session

from jigsaw import spb
from scheduler.core.jobmodel import JobModel
from scheduler.models.agents import allowance
from scheduler.models.metrics import STEP_TOTALS, steady_step
from scheduler.models.sizes_measured import sized_job, sized_steps
from scheduler.orm import GPU, Allocation, IterationMetric, Job, ModelProfile

logger = logging.getLogger(__name__)

RECENT_ITERATIONS = 20
# How far back a job's iterations alone count as its reference for the slowdown beside
# co-runners: a host's iterations alone precede its guest's arrival, and it keeps the
# guest for leases on end.
SOLO_ITERATIONS = 200
UNKNOWN_ITERATIONS = 10**12  # JobSpec's ceiling for max_iterations


@dataclass(frozen=True)
class _Speed:
    """Mean step and communication seconds of some recent iterations, their peak
    memory and mean GPU utilization (None: not reported)."""

    step_seconds: float
    comm_seconds: float
    peak_memory_bytes: int | None
    utilization: float | None
    iterations: int = 1


@dataclass(frozen=True)
class ActiveJob:
    """What the model of one job is built from, besides its iterations."""

    id: int
    workers: int
    spec: Mapping[str, Any]
    spb: Mapping[str, Any]  # its current hold's configuration ({}: off or not holding)
    held: int = 0  # GPUs it holds now
    held_nodes: int = 0  # nodes they are on


def job_models(
    session: Session,
    jobs: Iterable[ActiveJob],
    active_states: Iterable[str],
    gpu_memory: int,
    *,
    per_node: int = 1,
    max_nodes: int = 1,
    gpu_kinds: Collection[str] = (),
) -> dict[int, JobModel]:
    """A model for each job that has reported iterations, or was profiled on one of
    `gpu_kinds` (three queries; one more for jobs that have not reported, two more when
    some job is elastic or adapts its batch). `per_node` and `max_nodes`: the most GPUs
    of a node and the nodes, the placements an elastic job's sizes are predicted on."""
    full, partial = _recent_speeds(session, list(active_states))
    listed = list(jobs)
    profiles = _preferred_profiles(session, [job for job in listed if _auto(job)])
    resizable = [
        found
        for job in listed
        if (found := sized_job(job.id, dict(job.spec), job.held, job.held_nodes)) is not None
    ]
    sized = sized_steps(session, resizable, per_node, max_nodes)
    unreported = [job for job in listed if job.id not in partial]
    models, prior = _profiled_models(session, unreported, gpu_kinds, profiles, full)
    for job in listed:
        if job.id in models:
            continue  # what it reported is too little yet to replace its profile
        profile = profiles.get(job.id)
        steps = _full_backprop_step(job, profile, full.get(job.id), partial.get(job.id))
        if steps is None:
            continue
        target = job.spec.get("max_iterations")
        peaks = [s.peak_memory_bytes for s in (full.get(job.id), partial.get(job.id)) if s]
        known = [peak for peak in peaks if peak is not None]
        table = sized.get(job.id)
        utilization = _solo_utilization(full.get(job.id))
        models[job.id] = JobModel(
            iterations_total=int(target) if target is not None else UNKNOWN_ITERATIONS,
            workers=job.workers,
            steps=table.steps if table is not None else {job.workers: {1: steps}},
            memory_bytes=max(known) if known else gpu_memory,
            spb_profile=profile,
            utilization=prior.get(job.id) if utilization is None else utilization,
            batches=table.batches if table is not None else {},
            batch_gain=table.batch_gain if table is not None else 0.0,
        )
    return models


# A profiled job's own figures replace its profile's from this many recent iterations
# at full backprop on (fewer, the slowest excluded, say little of its steady pace).
_OWN = 3
# A profile's passes hold no optimizer state and count no allocator reserve: a job that
# has not reported is taken to need this many times the profile's peak.
PROFILED_MEMORY_FACTOR = 2.0


def _profiled_models(
    session: Session,
    jobs: list[ActiveJob],
    gpu_kinds: Collection[str],
    spb_profiles: Mapping[int, spb.SPBProfile],
    full: Mapping[int, _Speed],
) -> tuple[dict[int, JobModel], dict[int, float]]:
    """Models of the jobs that have reported fewer than `_OWN` iterations at full
    backprop, from profiles of their workloads measured at their per-worker batch on a
    kind of GPU the cluster has, with utilization and peak memory (one query); and every
    profiled job's utilization, for a job whose reports carry none of their own yet
    (assumed busy, a guest would be sent away at its host's first report).

    A profile times the model's passes alone; an iteration also runs the optimizer, the
    data loader and the runtime's reports. That time is taken from the jobs that have
    reported and have such a profile too (the median of their measured compute less
    the profile's), so that a job not yet run does not look shorter than running ones
    and displace them."""
    keys = {
        job.id: sorted(f"{kind}/batch-{batch}" for kind in gpu_kinds)
        for job in jobs
        if (batch := _per_worker_batch(job)) is not None
    }
    if not any(keys.values()):
        return {}, {}
    found: dict[tuple[str, str], tuple[spb.SPBProfile, float, int]] = {}
    for workload, key, data in session.execute(
        select(ModelProfile.workload, ModelProfile.key, ModelProfile.data).where(
            ModelProfile.workload.in_({_workload(job) for job in jobs}),
            ModelProfile.key.in_({key for held in keys.values() for key in held}),
        )
    ):
        if (measured := _profiled(data)) is not None:
            found[workload, key] = measured
    profiled = {}
    for job in jobs:
        matching = [
            found[_workload(job), key]
            for key in keys.get(job.id, ())
            if (_workload(job), key) in found
        ]
        if matching:
            profiled[job.id] = matching[0]
    extra = [
        full[job_id].step_seconds - full[job_id].comm_seconds - _step(profile)
        for job_id, (profile, _, _) in profiled.items()
        if job_id in full and full[job_id].iterations >= _OWN
    ]
    overhead = max(statistics.median(extra), 0.0) if extra else 0.0
    models = {}
    for job in jobs:
        if job.id not in profiled or (job.id in full and full[job.id].iterations >= _OWN):
            continue
        profile, utilization, peak = profiled[job.id]
        target = job.spec.get("max_iterations")
        models[job.id] = JobModel(
            iterations_total=int(target) if target is not None else UNKNOWN_ITERATIONS,
            workers=job.workers,
            steps={job.workers: {1: (_step(profile) + overhead, 0.0)}},
            memory_bytes=allowance(peak, PROFILED_MEMORY_FACTOR),
            spb_profile=spb_profiles.get(job.id),
            utilization=utilization,
        )
    return models, {job_id: utilization for job_id, (_, utilization, _) in profiled.items()}


def _step(profile: spb.SPBProfile) -> float:
    """A profiled worker's full-backprop compute per iteration."""
    return spb.job_cost(profile, None, 1).iteration_compute_seconds


def _profiled(data: Mapping[str, Any]) -> tuple[spb.SPBProfile, float, int] | None:
    """A stored profile, its utilization and peak memory; None when it lacks either (or
    is malformed: a bad row must not stop every round)."""
    utilization, peak = data.get("utilization"), data.get("peak_memory_bytes")
    if not isinstance(utilization, int | float) or not 0.0 <= utilization <= 1.0:
        return None
    if not isinstance(peak, int) or peak <= 0:
        return None
    try:
        profile = spb.SPBProfile.from_json(data)
    except (KeyError, TypeError, ValueError):
        return None
    if _step(profile) <= 0:
        return None
    return profile, float(utilization), peak


def _auto(job: ActiveJob) -> bool:
    return job.spec.get("spb") == "auto"


def _recent_speeds(
    session: Session, active_states: list[str]
) -> tuple[dict[int, _Speed], dict[int, _Speed]]:
    """Each active job's recent iterations at full backprop and under SPB, averaged; the
    step time without its warm-up (`metrics.steady_step`)."""
    at_full = IterationMetric.spb_depth.is_(None)
    rows = session.execute(
        select(
            IterationMetric.job_id,
            at_full,
            *STEP_TOTALS,
            func.avg(IterationMetric.comm_seconds),
            func.max(IterationMetric.peak_memory_bytes),
            # Solo utilization: what the job keeps busy alone, not beside co-runners.
            func.avg(
                case(
                    (IterationMetric.co_runners > 0, None),
                    else_=IterationMetric.utilization,
                )
            ),
        )
        .join(Job, Job.id == IterationMetric.job_id)
        .where(
            Job.state.in_(active_states),
            IterationMetric.iteration > Job.iterations_done - RECENT_ITERATIONS,
        )
        .group_by(IterationMetric.job_id, at_full)
    )
    full: dict[int, _Speed] = {}
    partial: dict[int, _Speed] = {}
    for job_id, is_full, count, total, slowest, comm, peak, busy in rows:
        step = steady_step(count, total, slowest)
        if not step or step <= 0:
            continue  # no time measured: nothing to price the job with
        speed = _Speed(
            float(step),
            float(comm),
            None if peak is None else int(peak),
            None if busy is None else float(busy),
            int(count),
        )
        (full if is_full else partial)[job_id] = speed
    return full, partial


def colocated_slowdowns(session: Session, active_states: Iterable[str]) -> dict[int, float]:
    """Each active job's measured slowdown beside co-runners: the mean step of its
    recent iterations (the last `RECENT_ITERATIONS`) that had another job on its GPU
    over the mean step of its iterations alone (within the last `SOLO_ITERATIONS`), at
    the same backprop (full, or under SPB); the larger of the two where both are
    measured. Only jobs with both kinds of iterations; iterations whose co-runners were
    not reported count as neither. One query."""
    at_full = IterationMetric.spb_depth.is_(None)
    recent = IterationMetric.iteration > Job.iterations_done - RECENT_ITERATIONS
    rows = session.execute(
        select(
            IterationMetric.job_id,
            at_full,
            func.avg(
                case((and_(IterationMetric.co_runners > 0, recent), IterationMetric.step_seconds))
            ),
            func.avg(case((IterationMetric.co_runners == 0, IterationMetric.step_seconds))),
        )
        .join(Job, Job.id == IterationMetric.job_id)
        .where(
            Job.state.in_(list(active_states)),
            IterationMetric.iteration > Job.iterations_done - SOLO_ITERATIONS,
        )
        .group_by(IterationMetric.job_id, at_full)
    )
    slowdowns: dict[int, float] = {}
    for job_id, _, shared, alone in rows:
        if shared is None or alone is None or alone <= 0:
            continue
        slowdowns[job_id] = max(slowdowns.get(job_id, 0.0), float(shared) / float(alone))
    return slowdowns


def _solo_utilization(speed: _Speed | None) -> float | None:
    """The utilization a job reported at full backprop, as a fraction in [0, 1]; None
    when it reported none or a value outside it (agents report fractions; a bad report
    must not make the job look idle)."""
    if speed is None or speed.utilization is None:
        return None
    return speed.utilization if 0.0 <= speed.utilization <= 1.0 else None


@dataclass(frozen=True)
class _StoredProfile:
    profile: spb.SPBProfile
    device_kind: str | None
    order: int  # position by measurement time: greater is newer


def _preferred_profiles(session: Session, jobs: list[ActiveJob]) -> dict[int, spb.SPBProfile]:
    """Each job's profile of its workload: measured on the kind of GPU the job holds,
    priced, at its per-worker batch, newest, in that order of preference."""
    if not jobs:
        return {}
    stored: dict[str, list[_StoredProfile]] = {}
    for order, (workload, data) in enumerate(
        session.execute(
            select(ModelProfile.workload, ModelProfile.data)
            .where(ModelProfile.workload.in_(sorted({_workload(job) for job in jobs})))
            .order_by(ModelProfile.created_at, ModelProfile.id)
        )
    ):
        try:
            profile = spb.SPBProfile.from_json(data)
        except (KeyError, TypeError, ValueError):
            # One bad row must not stop every round: the job is priced without it.
            logger.warning("model profile of %r is malformed; ignored", workload)
            continue
        kind = data.get("device_kind")
        stored.setdefault(workload, []).append(
            _StoredProfile(profile, kind if isinstance(kind, str) else None, order)
        )
    held = {
        job_id: kind
        for job_id, kind in session.execute(
            select(Allocation.job_id, func.min(GPU.kind))
            .join(GPU, GPU.id == Allocation.gpu_id)
            .where(
                Allocation.job_id.in_([job.id for job in jobs]), Allocation.released_at.is_(None)
            )
            .group_by(Allocation.job_id)
        )
    }
    chosen = {}
    for job in jobs:
        candidates = stored.get(_workload(job))
        if not candidates:
            continue
        kind = held.get(job.id)
        batch = _per_worker_batch(job)
        best = max(
            candidates,
            key=lambda s: (
                kind is not None and s.device_kind == kind,
                bool(s.profile.steps_ratio),
                s.profile.per_worker_batch == batch,
                s.order,
            ),
        )
        chosen[job.id] = best.profile
    return chosen


def _workload(job: ActiveJob) -> str:
    return str(job.spec.get("workload"))


def _per_worker_batch(job: ActiveJob) -> int | None:
    hyperparameters = job.spec.get("hyperparameters")
    batch = hyperparameters.get("batch_size") if isinstance(hyperparameters, Mapping) else None
    return batch // job.workers if isinstance(batch, int) and job.workers > 0 else None


def _full_backprop_step(
    job: ActiveJob, profile: spb.SPBProfile | None, full: _Speed | None, partial: _Speed | None
) -> tuple[float, float] | None:
    """(step, sync) seconds of one full-backprop iteration at the job's own size."""
    if full is not None:
        return full.step_seconds, min(full.comm_seconds, full.step_seconds)
    if partial is None:
        return None
    config = spb.resolve(job.spb) or spb.resolve(job.spec.get("spb"))
    if profile is None or config is None:
        # No profile to convert with (its spec fixes the configuration, which no policy
        # changes): its speed is the one it runs at.
        return partial.step_seconds, min(partial.comm_seconds, partial.step_seconds)
    full_cost = spb.job_cost(profile, None, job.workers)
    cost = spb.job_cost(profile, config, job.workers)
    compute_ratio = cost.iteration_compute_seconds / (full_cost.iteration_compute_seconds or 1.0)
    byte_ratio = (
        cost.bytes_exchanged / full_cost.bytes_exchanged if full_cost.bytes_exchanged else 1.0
    )
    sync = min(partial.comm_seconds, partial.step_seconds)
    full_sync = sync / byte_ratio if byte_ratio > 0 else sync
    full_compute = (partial.step_seconds - sync) / (compute_ratio or 1.0)
    return full_compute + full_sync, full_sync
