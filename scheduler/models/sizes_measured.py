"""What the database knows of an elastic or adaptive job's speed at every size: the
step times measured at each size it ran, fitted (`scheduler.core.elastic_model`), and
the gradient noise and the global batch it last reported.

Two queries for all such jobs together, whatever their number: each job's mean step and
synchronisation seconds by (workers, global batch) over every iteration it ran alone at
full backprop with its size reported (every size it ever ran counts, not the recent
window: a size it left an hour ago is still what it measured there), and its newest
gradient noise; one more for adaptive jobs' newest batches. Which nodes an iteration
ran on is not reported: the size it holds now is taken at the nodes it holds, the
others on the fewest nodes.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import ValidationError
from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from jigsaw.gradnoise import GradParams
from jigsaw.jobspec import JobSpec
from scheduler.core import elastic_model
from scheduler.core.elastic_model import SizedSteps
from scheduler.core.goodput import BatchLimits, StepSample
from scheduler.models.metrics import STEP_TOTALS, newest, steady_step
from scheduler.orm import IterationMetric

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SizedJob:
    """An elastic or adaptive job as its sizes are learned: its spec, and the GPUs and
    nodes it holds now (0: none)."""

    id: int
    spec: JobSpec
    held: int
    held_nodes: int


def sized_job(job_id: int, spec: dict[str, object], held: int, held_nodes: int) -> SizedJob | None:
    """The job if its spec is elastic or adapts its batch (None: one size, one batch)."""
    if spec.get("elastic") is None and not isinstance(spec.get("batch"), dict):
        return None
    try:
        parsed = JobSpec.model_validate(spec)
    except ValidationError:
        return None  # validated at submission; a spec that no longer is has one size
    if parsed.elastic is None and not parsed.adaptive:
        return None
    return SizedJob(job_id, parsed, held, held_nodes)


def sized_steps(
    session: Session, jobs: Sequence[SizedJob], per_node: int, max_nodes: int
) -> dict[int, SizedSteps]:
    """Each job's step times at every size it may run, of the jobs that reported some
    iteration with its size (two queries)."""
    if not jobs:
        return {}
    measured = _measured(session, [job.id for job in jobs])
    adaptive = [job.id for job in jobs if job.spec.adaptive]
    noise, batches_now = _noise(session, adaptive), _batches_now(session, adaptive)
    tables = {}
    for job in jobs:
        samples = _samples(job, measured.get(job.id, []), per_node)
        if not samples:
            continue
        sizes = job.spec.worker_counts()
        micro = job.spec.max_micro_batch
        grad = noise.get(job.id)
        try:
            if job.spec.adaptive and grad is not None:
                now = batches_now.get(job.id)
                running = (job.held, job.held_nodes, now) if now and job.held else None
                table = elastic_model.adaptive_batch(
                    samples, sizes, max_nodes, grad, _limits(job.spec), running
                )
            else:
                table = elastic_model.fixed_batch(
                    samples, sizes, max_nodes, job.spec.hyperparameters.batch_size, micro
                )
        except ValueError as exc:
            # A round must not fail on one job's numbers: it keeps the size it asked for.
            logger.warning("job %d: no throughput model (%s)", job.id, exc)
            continue
        if job.spec.workers in table.steps:
            tables[job.id] = table
    return tables


def _measured(
    session: Session, job_ids: list[int]
) -> dict[int, list[tuple[int, int, float, float]]]:
    """(workers, global batch, mean step seconds, mean sync seconds) of each job's
    iterations alone at full backprop, by size and batch; the step without its warm-up
    (`metrics.steady_step`), as a fixed size's is."""
    rows = session.execute(
        select(
            IterationMetric.job_id,
            IterationMetric.workers,
            IterationMetric.batch_size,
            *STEP_TOTALS,
            func.avg(IterationMetric.comm_seconds),
        )
        .where(
            IterationMetric.job_id.in_(job_ids),
            IterationMetric.workers.is_not(None),
            IterationMetric.batch_size.is_not(None),
            IterationMetric.spb_depth.is_(None),
            or_(IterationMetric.co_runners.is_(None), IterationMetric.co_runners == 0),
        )
        .group_by(IterationMetric.job_id, IterationMetric.workers, IterationMetric.batch_size)
    )
    by_job: dict[int, list[tuple[int, int, float, float]]] = defaultdict(list)
    for job_id, workers, batch, count, total, slowest, sync in rows:
        step = steady_step(count, total, slowest)
        if step and math.isfinite(step) and step > 0:
            by_job[job_id].append((int(workers), int(batch), float(step), float(sync or 0.0)))
    return by_job


def _noise(session: Session, job_ids: list[int]) -> dict[int, GradParams]:
    """Each job's newest reported gradient noise (at its base batch)."""
    columns = (IterationMetric.grad_sqr, IterationMetric.grad_var)
    noise = {}
    for job_id, (sqr, var) in newest(
        session, job_ids, columns, IterationMetric.grad_sqr.is_not(None)
    ).items():
        try:
            noise[job_id] = GradParams.from_estimates(float(sqr or 0.0), float(var or 0.0))
        except ValueError:
            continue  # not finite: efficiency unknown, the batch stays
    return noise


def _batches_now(session: Session, job_ids: list[int]) -> dict[int, int]:
    """Each job's global batch at its newest reported iteration (one that reported none
    is absent). Not the noise's row: a run reports noise only once it has estimated some,
    and a rebatch must see the batch it made at once, or it would be asked again."""
    latest = newest(session, job_ids, (IterationMetric.batch_size,))
    return {job_id: batch for job_id, (batch,) in latest.items() if batch is not None}


def _samples(
    job: SizedJob, measured: list[tuple[int, int, float, float]], per_node: int
) -> list[StepSample]:
    samples = []
    for workers, batch, step, sync in measured:
        nodes = (
            job.held_nodes if workers == job.held and job.held_nodes else -(-workers // per_node)
        )
        found = elastic_model.sample(
            workers,
            min(max(nodes, 1), workers),
            batch,
            job.spec.max_micro_batch,
            step,
            sync,
            adaptive=job.spec.adaptive,
        )
        if found is not None:
            samples.append(found)
    return samples


def _limits(spec: JobSpec) -> BatchLimits:
    """The batches an adaptive job allows: its spec's range around the batch it asked
    for, micro-batches up to the per-worker batch it asked for."""
    base = spec.hyperparameters.batch_size
    bounds = spec.batch
    low = bounds.min if bounds is not None and bounds.min is not None else base
    high = bounds.max if bounds is not None and bounds.max is not None else base
    return BatchLimits(base, low, high, spec.max_micro_batch)
