"""How a running job moves to another size: by the plan's `Resize` when its spec is
elastic (the live cluster checkpoints it at its boundary and restarts it on the new
gang), else by suspending it and starting it again (the simulator's trace jobs, whose
sizes come from their profiles, and a guest moving to GPUs of its own); what the move
costs; the batch an adaptive job runs at where it is placed, and when a running one
changes it where it is (a rebatch)."""

from __future__ import annotations

from scheduler.core.plan import Resize
from scheduler.core.snapshot import JobView
from scheduler.policies.jigsaw.layout import Layout


def cost(job: JobView, in_place: bool = False) -> float:
    """Seconds a move costs the job (the checkpoint, the restart, the iterations not
    run meanwhile): measured on the cluster, the restart in the simulator; a growth
    `in_place`, what such growths measured where known. Before any resize is measured,
    a start (a resize restarts the gang; charging nothing took a one-minute job's first
    growth for free, and it paid 20-30 s); 0 when neither is known."""
    if in_place and job.grow_seconds is not None:
        return job.grow_seconds
    if job.resize_seconds is not None:
        return job.resize_seconds
    return job.start_seconds or 0.0


def batch(layout: Layout, job_id: int) -> int:
    """The global batch of an adaptive job where the layout puts it (0: a fixed batch)."""
    model = layout.jobs[job_id].model
    if model is None:
        return 0
    return model.batch_at(len(layout.gpus[job_id]), layout.nodes[job_id])


def resizes(layout: Layout, moved: list[int]) -> tuple[Resize, ...]:
    """The moved jobs that move by a `Resize`: elastic ones whose size changes."""
    return tuple(
        Resize(job_id, layout.gpus[job_id], batch(layout, job_id))
        for job_id in moved
        if layout.jobs[job_id].sizes
        and len(layout.gpus[job_id]) != len(layout.jobs[job_id].allocated_gpu_ids)
    )


def rebatches(layout: Layout, staying: list[int], least_gain: float) -> tuple[Resize, ...]:
    """A `Resize` to the GPUs it holds, at the batch with the most goodput there, for
    each adaptive job of `staying` whose goodput that batch raises by `least_gain` or
    more over its own: the live cluster changes it at the job's next boundary in place
    (no restart). Where goodput is flat in the batch (a job near convergence: its
    gradient barely measurable), the noise of the estimate would move it back and
    forth for nothing. A job whose gain is not known (the simulator's, whose batch
    follows its model at no cost) stays as it is."""
    found = []
    for job_id in staying:
        job = layout.jobs[job_id]
        best = batch(layout, job_id)
        if best and job.model is not None and job.model.batch_gain >= least_gain > 0:
            found.append(Resize(job_id, job.allocated_gpu_ids, best))
    return tuple(found)
