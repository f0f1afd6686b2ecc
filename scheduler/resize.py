"""Resizing a running elastic job: in place, or checkpoint at the boundary and restart
on the new gang.

A shrink to some of the GPUs of a gang on one node that keeps its rank 0's GPU happens
in place (`in_place`), and so do a growth onto free GPUs of that node and an adaptive
job's rebatch (the same GPUs, another global batch): the dispatcher asks the agent,
whose ranks checkpoint at the boundary and go on in the same processes (at the new
size or batch), or leave, while a growth's new ranks start and resume from that
checkpoint; its SHRUNK report gives back the GPUs left (a growth's new GPUs are held
from the ask) and the cost is measured as below. Every other resize, and one the agent
cannot do in place (it suspends the job instead), is a restart.

The loop applies a restart in three steps across rounds (`SchedulerService`):
it asks the job's processes to suspend, keeping the job RUNNING on its old GPUs (a
shrink's GPUs stay its own until they are free); when they have checkpointed and
exited, it queues the job and at once places it on the new GPUs, resuming from the
checkpoint (`jigsaw.elastic` keeps the global batch); once the new gang reports, the
resize's cost is measured and stored as a `resized` event for policies to read. Pending
resizes live in the leader's memory: after a failover a job still running is asked
nothing more, and one already checkpointed is requeued (as a drained node's jobs are)
and placed again by the policy.

Checkpoint-restart always works (ranks that move, ranks on several nodes, crash
recovery); in place, measured cheaper (docs/results/resize-mechanism.md), is the fast
path where the ranks that stay keep their GPUs on their one node.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from pydantic import ValidationError

from jigsaw import elastic
from jigsaw.jobspec import JobSpec
from scheduler.core.plan import Resize
from scheduler.dispatch import Worker
from scheduler.models.resizes import RESTART


@dataclass(frozen=True)
class PendingResize:
    resize: Resize
    from_workers: int
    boundary: int = 0  # the iteration the old gang checkpointed at, once resumed
    mechanism: str = RESTART


def in_place(
    gang: tuple[Worker, ...], resize: Resize, joiners: tuple[Worker, ...] = ()
) -> tuple[Worker, ...] | None:
    """The new gang when `resize` changes `gang` (by rank) on its one node in place: to
    some of its GPUs, its rank 0's among them, or to all of them with a new global batch
    (an adaptive job's rebatch), its ranks in the order they had; or to all of them and
    `joiners` (free GPUs of that node, the resize's others), which take the next ranks.
    Else None."""
    new, held = set(resize.gpu_ids), {worker.gpu_id for worker in gang}
    added = {worker.gpu_id for worker in joiners}
    if (
        not gang
        or len({worker.node_name for worker in gang + joiners}) != 1
        or gang[0].gpu_id not in new
        or len(new) != len(resize.gpu_ids)
        or added & held
        or not (
            new < held or (new == held and resize.global_batch) or (added and new == held | added)
        )
    ):
        return None
    kept = [worker for worker in gang if worker.gpu_id in new] + list(joiners)
    return tuple(replace(worker, rank=rank) for rank, worker in enumerate(kept))


def refusal(spec_json: dict[str, Any], workers_now: int, resize: Resize) -> str | None:
    """Why the job cannot be resized so, or None when it can."""
    try:
        spec = JobSpec.model_validate(spec_json)
    except ValidationError:
        return "its stored spec no longer validates"
    workers = len(resize.gpu_ids)
    if spec.elastic is None and not (spec.adaptive and workers == workers_now):
        return "it is not elastic"
    if len(set(resize.gpu_ids)) != workers:
        return f"GPUs {list(resize.gpu_ids)} repeat"
    if spec.elastic is not None and not (
        spec.elastic.min_workers <= workers <= spec.elastic.max_workers
    ):
        return (
            f"{workers} workers is outside its range [{spec.elastic.min_workers}, "
            f"{spec.elastic.max_workers}]"
        )
    if workers == workers_now and not resize.global_batch:
        return f"it already runs on {workers} GPUs"
    try:
        if spec.adaptive:
            batch = resize.global_batch or spec.hyperparameters.batch_size
            bounds = spec.batch
            low = bounds.min if bounds is not None and bounds.min is not None else batch
            high = bounds.max if bounds is not None and bounds.max is not None else batch
            if not low <= batch <= high:
                return f"global batch {batch} is outside its [{low}, {high}]"
            elastic.nearest_split(batch, workers, spec.max_micro_batch)
        elif resize.global_batch:
            return "its batch is not adaptive"
        else:
            elastic.split(spec.hyperparameters.batch_size, workers, spec.max_micro_batch)
    except ValueError as exc:
        return str(exc)
    return None
