"""How a global batch runs on a number of workers: micro-batches and accumulation.

Shared by the runtime (which runs the split) and the scheduler (which may resize a job
only to a size its batch splits on). A job's micro-batch never exceeds the per-worker
batch it asked for (`JobSpec.max_micro_batch`: what it knows fits in memory), so a job
shrunk from 4 workers x 8 to 2 workers runs 2 x 8 with 2 accumulation steps, and its
optimizer sees the same global batch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BatchSplit:
    """`global_batch` = `workers` x `accumulation` x `micro_batch`, exactly."""

    workers: int
    micro_batch: int
    accumulation: int  # micro-batches per worker per optimizer step, >= 1

    @property
    def global_batch(self) -> int:
        return self.workers * self.accumulation * self.micro_batch

    @property
    def per_worker(self) -> int:
        return self.accumulation * self.micro_batch


def split(global_batch: int, workers: int, max_micro_batch: int) -> BatchSplit:
    """The exact split of `global_batch` over `workers` with the fewest micro-batches of
    at most `max_micro_batch` samples; a ValueError when none is exact (another size
    would train with another batch, so another trajectory)."""
    _check_positive(global_batch=global_batch, workers=workers, max_micro_batch=max_micro_batch)
    if global_batch % workers:
        raise ValueError(
            f"a global batch of {global_batch} does not split evenly over {workers} workers"
        )
    per_worker = global_batch // workers
    accumulation = -(-per_worker // max_micro_batch)
    while per_worker % accumulation:
        accumulation += 1
    return BatchSplit(workers, per_worker // accumulation, accumulation)


def nearest_split(batch: int, workers: int, max_micro_batch: int) -> BatchSplit:
    """An adaptive batch on `workers`: as few micro-batches of at most `max_micro_batch`
    as hold `batch`, equal, so the batch run is `batch` rounded down to a multiple of
    their count (AdaptDL rounds the same way); a ValueError below one sample each. One
    worker runs at least two micro-batches where the batch has two samples: the batch's
    gradient noise is measured between gradients of the same step (pairing a lone
    gradient with the previous step's, as AdaptDL does, counts the update between them
    as noise: measured, a batch 20-30 times too large, which the next measurement at it
    undid)."""
    _check_positive(batch=batch, workers=workers, max_micro_batch=max_micro_batch)
    if batch < workers:
        raise ValueError(f"a batch of {batch} gives no sample to some of {workers} workers")
    if workers == 1 and batch >= 2:
        max_micro_batch = min(max_micro_batch, batch // 2)
    accumulation = -(-batch // (workers * max_micro_batch))
    micro_batch = max(1, batch // (workers * accumulation))
    return BatchSplit(workers, micro_batch, min(accumulation, batch // (workers * micro_batch)))


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if not (isinstance(value, int) and value >= 1):
            raise ValueError(f"{name} must be a positive integer, not {value!r}")
