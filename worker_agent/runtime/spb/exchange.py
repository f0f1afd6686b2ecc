"""Per-stage gradient exchange: each stage's gradient is the mean over its contributors.

Under SPB, stage s is trained by the ranks C_s whose depth reaches it (the sets nest:
lower stages have fewer contributors). After backward, the stages with the same
contributor set form one bucket, flattened into one buffer. A bucket every rank trained
is all-reduced over the world, as DDP would. Otherwise its contributors all-reduce it
among themselves (a process group of C_s) and the lowest contributor broadcasts the mean
to the others (a group of that rank and the non-contributors): together 2(c-1) + (N-c)
gradients on the wire instead of a ring all-reduce's 2(N-1) (`jigsaw.spb.
exchange_bytes`). Every rank ends with the same gradient in every parameter's `.grad`,
so every replica takes the same optimizer step. The world bucket also carries the
boundary agreement when one is offered (`boundary`).

Process groups are created the first time a rank set is needed. Every rank derives the
same depths from the same configuration and iteration, so all ranks meet the same sets
in the same order, as `new_group` requires. Buffers (BatchNorm statistics) follow rank
0's, broadcast after the step, as DDP's `broadcast_buffers` does before each forward.

Bytes are counted as the wire bytes this rank sends under the standard algorithms: a
ring all-reduce of n bytes over k ranks sends 2(k-1)/k n per rank, and a broadcast
delivers n to each receiver (counted at the receiver). Summed over ranks this is the
cost model of `jigsaw.spb`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from jigsaw.spb import contributors
from worker_agent.runtime.boundary import BoundarySync
from worker_agent.runtime.spb.stages import Stages
from worker_agent.runtime.timing import ring_allreduce_bytes


@dataclass
class _Bucket:
    ranks: frozenset[int]  # the contributors of its stages
    params: list[nn.Parameter]
    buffer: torch.Tensor | None = None
    reduce: dist.Work | None = None
    deliver: dist.Work | None = None
    carries: bool = False  # the boundary agreement rides at the end of `buffer`


class StageExchange:
    def __init__(
        self,
        stages: Stages,
        model: nn.Module,
        rank: int,
        world_size: int,
        agreement: BoundarySync | None = None,
    ) -> None:
        self._stages = stages
        self._rank = rank
        self._world = world_size
        self._agreement = agreement
        self._groups: dict[frozenset[int], dist.ProcessGroup | None] = {
            frozenset(range(world_size)): None  # None: the default (world) group
        }
        # Flattened per dtype: BatchNorm holds float statistics and an integer counter.
        self._buffers: dict[torch.dtype, list[torch.Tensor]] = {}
        for buffer in model.buffers():
            self._buffers.setdefault(buffer.dtype, []).append(buffer)
        self.bytes_sent = 0

    def synchronize(self, depths: tuple[int, ...]) -> int:
        """Average every stage's gradient over its contributors, on every rank.

        Collective; `depths` must be the same on every rank. Returns this rank's wire
        bytes.
        """
        sent = 0
        buckets = self._buckets(depths)
        for bucket in buckets:
            if self._rank in bucket.ranks:
                grads = [
                    p.grad if p.grad is not None else torch.zeros_like(p) for p in bucket.params
                ]
                rider = self._board(bucket)
                bucket.buffer = _flatten_dense_tensors(
                    grads + [rider] if rider is not None else grads
                )
                if len(bucket.ranks) > 1:
                    bucket.reduce = dist.all_reduce(
                        bucket.buffer, group=self._group(bucket.ranks), async_op=True
                    )
                    gradients = _nbytes(bucket.buffer) - (
                        _nbytes(rider) if rider is not None else 0
                    )
                    sent += ring_allreduce_bytes(gradients, len(bucket.ranks))
            else:
                numel = sum(p.numel() for p in bucket.params)
                bucket.buffer = torch.empty(
                    numel, dtype=bucket.params[0].dtype, device=bucket.params[0].device
                )
        for bucket in buckets:
            assert bucket.buffer is not None
            if bucket.reduce is not None:
                bucket.reduce.wait()
                if bucket.carries:
                    assert self._agreement is not None
                    bucket.buffer = self._agreement.alight(bucket.buffer)
            if self._rank in bucket.ranks:
                bucket.buffer /= len(bucket.ranks)  # the mean, before it is passed on
            receivers = frozenset(range(self._world)) - bucket.ranks
            source = min(bucket.ranks)
            if receivers and (self._rank in receivers or self._rank == source):
                bucket.deliver = dist.broadcast(
                    bucket.buffer,
                    src=source,
                    group=self._group(receivers | {source}),
                    async_op=True,
                )
                if self._rank in receivers:
                    sent += _nbytes(bucket.buffer)
        for bucket in buckets:
            assert bucket.buffer is not None
            if bucket.deliver is not None:
                bucket.deliver.wait()
            for param, grad in zip(
                bucket.params,
                _unflatten_dense_tensors(bucket.buffer, bucket.params),
                strict=True,
            ):
                param.grad = grad
        self.bytes_sent = sent
        return sent

    def _board(self, bucket: _Bucket) -> torch.Tensor | None:
        """The agreement, to ride in this bucket if it is the world's."""
        if self._agreement is None or len(bucket.ranks) < max(self._world, 2):
            return None
        rider = self._agreement.board(bucket.params[0].dtype)
        bucket.carries = rider is not None
        return rider

    def broadcast_buffers(self) -> None:
        """Collective: every rank takes rank 0's buffers (BatchNorm running statistics)."""
        if self._world == 1:
            return
        for buffers in self._buffers.values():
            flat = _flatten_dense_tensors([b.detach() for b in buffers])
            dist.broadcast(flat, src=0)
            for buffer, value in zip(buffers, _unflatten_dense_tensors(flat, buffers), strict=True):
                buffer.copy_(value)

    def _buckets(self, depths: tuple[int, ...]) -> list[_Bucket]:
        # In stage order, top first: the order every rank issues its collectives in.
        by_ranks: dict[frozenset[int], _Bucket] = {}
        stage_ranks = contributors(depths, len(self._stages))
        for stage in reversed(range(len(self._stages))):
            params = self._stages.parameters[stage]
            if params:
                ranks = stage_ranks[stage]
                by_ranks.setdefault(ranks, _Bucket(ranks, [])).params.extend(params)
        buckets = list(by_ranks.values())
        # Every rank creates the groups of every bucket, members or not, in one order.
        for bucket in buckets:
            self._group(bucket.ranks)
            receivers = frozenset(range(self._world)) - bucket.ranks
            if receivers:
                self._group(receivers | {min(bucket.ranks)})
        return buckets

    def _group(self, ranks: frozenset[int]) -> dist.ProcessGroup | None:
        if ranks not in self._groups:
            self._groups[ranks] = dist.new_group(sorted(ranks))
        return self._groups[ranks]


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()
