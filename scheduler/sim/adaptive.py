"""Jobs that adapt their batch size: progress by goodput, as in the Pollux artifact.

A job's statistical progress is counted in steps of its application's base batch B0
(the smallest validated): one step at a global batch B makes B / B0 x E(B) of them,
E the statistical efficiency of B in the epoch the job is in (`scheduler.core.goodput`,
from the gradient noise the validation runs measured). It finishes at the progress
the application's validation runs reached by their last epoch (`Application`).

On each size (GPUs and nodes) the job runs at the batch `GoodputModel.best_batch`
chooses, from the throughput model fitted to the application's step times and the
gradient noise measured in the current epoch at the batch the job last ran (as a
running job measures it, taken at the nearest validated batch size); what that batch
then yields is the measured step time and the efficiency at that batch: the policy
chooses with a model, the simulated cluster charges the measurements. Batches range
over the validated ones, per-GPU micro-batches over the measured ones, larger per-GPU
batches as accumulation.

The job's `JobModel` gives seconds per base step at each size, so a policy that sizes
jobs by their step times sizes them by goodput; it changes only when the job enters a
new epoch (the engine then builds the next one).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from functools import cache

from scheduler.core.goodput import BatchLimits, GoodputModel, efficiency
from scheduler.sim.apps import EPOCHS, Application

Table = dict[int, dict[int, tuple[float, float]]]


def limits(app: Application) -> BatchLimits:
    """Every job of the application may run any validated batch size (the Pollux
    artifact's setting for adaptive jobs), per-GPU within what was measured."""
    return BatchLimits(
        app.base_batch,
        app.base_batch,
        app.max_batch,
        math.floor(app.max_local_batch),
        max(1, math.ceil(app.min_local_batch)),
    )


def noise_batch(app: Application, batch: float) -> int:
    """The validated batch size nearest `batch` (log scale): where the gradient noise
    of a job running at `batch` is read."""
    return min(app.validated_batches, key=lambda b: (abs(math.log(b / batch)), b))


@cache
def _chooser(app: Application, epoch: int, measured_at: int) -> GoodputModel:
    return GoodputModel(app.perf, app.grad_params(measured_at, epoch), limits(app))


@cache
def size_step(
    app: Application, epoch: int, measured_at: int, placement: tuple[int, ...]
) -> tuple[float, float, int] | None:
    """(seconds per base step, of them in synchronisation, global batch) on a placement
    of GPUs per node during `epoch`, the noise measured at batch `measured_at`; None
    when no allowed batch runs there."""
    workers, nodes = sum(placement), len(placement)
    choice = _chooser(app, epoch, measured_at).best_batch(workers, nodes)
    if choice is None:
        return None
    step, sync = app.step_time(placement, choice.batch)
    made = (
        choice.batch
        / app.base_batch
        * efficiency(app.grad_params(choice.batch, epoch), app.base_batch, choice.batch)
    )
    return step / made, min(sync, step) / made, choice.batch


def table(
    app: Application, epoch: int, measured_at: int, placements: Iterable[tuple[int, ...]]
) -> tuple[Table, dict[int, dict[int, int]]]:
    """Seconds per base step and batch by (workers, nodes), of the placements where
    some allowed batch runs."""
    steps: Table = {}
    batches: dict[int, dict[int, int]] = {}
    for placement in placements:
        found = size_step(app, epoch, measured_at, placement)
        if found is None:
            continue
        workers, nodes = sum(placement), len(placement)
        steps.setdefault(workers, {})[nodes] = found[:2]
        batches.setdefault(workers, {})[nodes] = found[2]
    return steps, batches


def epochs_ahead(app: Application, progress: float) -> Iterable[tuple[int, float]]:
    """(epoch, progress it still needs) from `progress` to the end."""
    done = progress
    for epoch in range(app.epoch_at(progress), EPOCHS[app.name]):
        end = min(app.epoch_progress(epoch), app.target_progress)
        if end > done:
            yield epoch, end - done
            done = end
