"""Per-rank batches that resume at any batch, in an order independent of processes.

The order is DistributedSampler's: one permutation per epoch seeded by (seed, epoch),
of which rank r takes every world_size-th index starting at r. It depends on
(seed, epoch, rank) only, so resuming rank r anywhere continues rank r's stream.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler


@dataclass(frozen=True)
class DataPosition:
    epoch: int = 0
    batch: int = 0  # batches of `epoch` already consumed


class ShardedBatches:
    def __init__(
        self,
        dataset: Dataset[Any],
        *,
        rank: int,
        world_size: int,
        batch_size: int,
        seed: int,
        start: DataPosition,
    ) -> None:
        # drop_last everywhere: every rank takes the same number of equal-sized batches,
        # so no rank waits in an all-reduce its peers never join.
        self._sampler: DistributedSampler[Any] = DistributedSampler(
            dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed, drop_last=True
        )
        self._dataset = dataset
        self._batch_size = batch_size
        self.batches_per_epoch = len(self._sampler) // batch_size
        if self.batches_per_epoch == 0:
            raise ValueError(
                f"a rank's share of the data ({len(self._sampler)} samples) is smaller than "
                f"its batch ({batch_size}): lower batch_size or use more data"
            )
        self.position = start
        self._batches = self._epoch_batches()

    def next(self) -> Any:
        if self.position.batch >= self.batches_per_epoch:
            self.position = DataPosition(self.position.epoch + 1, 0)
            self._batches = self._epoch_batches()
        batch = next(self._batches)
        self.position = DataPosition(self.position.epoch, self.position.batch + 1)
        return batch

    def _epoch_batches(self) -> Iterator[Any]:
        self._sampler.set_epoch(self.position.epoch)
        indices = list(self._sampler)[self.position.batch * self._batch_size :]
        # A private generator: starting an iterator draws a seed for worker processes, and
        # drawing it from the global generator would shift the trial's random streams
        # differently in a resumed run.
        loader = DataLoader(
            self._dataset,
            batch_size=self._batch_size,
            sampler=indices,
            generator=torch.Generator(),
        )
        return iter(loader)


def to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, list | tuple):
        return type(batch)(to_device(item, device) for item in batch)
    if isinstance(batch, dict):
        return {key: to_device(value, device) for key, value in batch.items()}
    return batch
