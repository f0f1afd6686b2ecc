"""An elastic job's speed at every size it may run, learned from the sizes it ran.

The live cluster measures a job only where it ran. A policy that resizes needs the
sizes it has not run too, so, as Pollux does, the measured steps (mean seconds per
optimizer step and of them synchronising, at each (workers, nodes, batch) the job ran)
fit Pollux's throughput model (`scheduler.core.goodput.fit_throughput`: compute linear
in the per-GPU micro-batch, synchronisation growing with the workers), which predicts
the rest. A size it ran keeps its measured time; a size it never ran is predicted,
optimistically about synchronisation not yet seen, so a policy tries it and learns.

A fixed global batch runs on w workers as `jigsaw.elastic.split` divides it (micro-batches
no larger than the per-worker batch the job asked for, the rest accumulated). A job that
adapts its batch runs, on each size, at the batch with the most goodput given its measured
gradient noise (`GoodputModel.best_batch`); its table is then in seconds per step of its
base batch's statistical progress, as the simulator's adaptive jobs are
(`scheduler.sim.adaptive`), and the batch chosen for each size is kept beside it. Its
length, its spec's `max_iterations`, counts the same steps (the runtime counts a step at
a larger batch as AdaScale's gain, and reports the sum as the job's progress), so its
time to go is the table's time per step times the steps left.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from jigsaw import elastic
from jigsaw.gradnoise import GradParams
from scheduler.core.goodput import BatchLimits, GoodputModel, StepSample, fit_throughput

Table = dict[int, dict[int, tuple[float, float]]]


@dataclass(frozen=True)
class SizedSteps:
    """Seconds per step and of them in synchronisation by (workers, nodes), the global
    batch of an adaptive job there (empty: a fixed batch), and how much more goodput the
    best batch of the size it holds makes than the batch it reported last (0: none, or
    not known)."""

    steps: Table
    batches: dict[int, dict[int, int]]
    batch_gain: float = 0.0


def sample(
    workers: int,
    nodes: int,
    batch: int,
    max_micro_batch: int,
    step: float,
    sync: float,
    *,
    adaptive: bool,
) -> StepSample | None:
    """A measured size as the throughput fit takes it: the global batch split as the
    runtime split it there (`jigsaw.elastic`: exactly for a kept batch, to the nearest
    for an adaptive one); None when it cannot be one (a batch that does not split, a
    time not measured)."""
    divide = elastic.nearest_split if adaptive else elastic.split
    try:
        split = divide(batch, workers, max_micro_batch)
        # The fit takes synchronisation as part of the step: never all of it.
        return StepSample(
            nodes, workers, split.micro_batch, step, min(sync, step * 0.999), split.accumulation - 1
        )
    except ValueError:
        return None


def fixed_batch(
    samples: Sequence[StepSample],
    sizes: Iterable[int],
    max_nodes: int,
    batch: int,
    max_micro_batch: int,
) -> SizedSteps:
    """Every size the job's global batch splits on, over 1 to `max_nodes` nodes:
    measured where it ran, predicted by the fitted model elsewhere."""
    perf = fit_throughput(samples)
    measured = {(s.workers, s.nodes): (s.step_seconds, s.sync_seconds) for s in samples}
    steps: Table = {}
    for workers in sorted(set(sizes)):
        try:
            split = elastic.split(batch, workers, max_micro_batch)
        except ValueError:
            continue  # another size would train with another batch
        for nodes in range(1, min(workers, max_nodes) + 1):
            steps.setdefault(workers, {})[nodes] = measured.get((workers, nodes)) or (
                perf.step_seconds(nodes, workers, split.micro_batch, split.accumulation - 1),
                perf.sync_seconds(nodes, workers, split.micro_batch),
            )
    return SizedSteps(steps, {})


def adaptive_batch(
    samples: Sequence[StepSample],
    sizes: Iterable[int],
    max_nodes: int,
    grad: GradParams,
    limits: BatchLimits,
    running: tuple[int, int, int] | None = None,
) -> SizedSteps:
    """Every size over 1 to `max_nodes` nodes at the batch with the most goodput there,
    in seconds per base-batch step of progress (a size no allowed batch runs on is
    left out); with `running` = (workers, nodes, batch) it runs at, the gain of the best
    batch there over its own."""
    model = GoodputModel(fit_throughput(samples), grad, limits)
    steps: Table = {}
    batches: dict[int, dict[int, int]] = {}
    for workers in sorted(set(sizes)):
        for nodes in range(1, min(workers, max_nodes) + 1):
            choice = model.best_batch(workers, nodes)
            if choice is None:
                continue
            step = model.perf.step_seconds(nodes, workers, choice.per_gpu, choice.accum_steps)
            sync = model.perf.sync_seconds(nodes, workers, choice.per_gpu)
            made = choice.batch / limits.base * model.efficiency(choice.batch)
            steps.setdefault(workers, {})[nodes] = (step / made, min(sync, step) / made)
            batches.setdefault(workers, {})[nodes] = choice.batch
    gain = 0.0
    if running is not None:
        best, current = model.best_batch(running[0], running[1]), model.goodput(*running)
        if best is not None and current > 0:
            gain = max(best.goodput / current - 1.0, 0.0)
    return SizedSteps(steps, batches, gain)
