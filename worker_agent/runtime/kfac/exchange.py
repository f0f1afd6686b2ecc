"""Averaging Kronecker factors across workers: pipelined, fused, contributor-aware.

Each factor is symmetric, so only its upper triangle travels. A message is gathered from
every worker (`all_gather_single`) and summed here in rank order over the factor's
contributors. A ring all-reduce would move half the bytes at 4 workers, but its
summation order depends on where an element sits in the message, so fusing factors
would change their values in the last bit; the rank-ordered sum makes fused and unfused
exchange bit-identical, and lets a factor be averaged over a subset of the workers (the
contributors of a stage under structured partial backprop) with one collective that
every worker joins.

Pipelined: a message starts as soon as its last factor exists (from the hooks, during
the pass). Naive: every message starts after backward. Fusion follows a plan computed
from profiled factor ready times and a measured communication model (`fusion_plan`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

# A factor's identity: (layer index, "A" or "G").
FactorKey = tuple[int, str]


@dataclass(frozen=True)
class CommModel:
    """Seconds for one message of `elements` float32 values: alpha + beta * elements."""

    alpha: float
    beta: float

    def seconds(self, elements: int) -> float:
        return self.alpha + self.beta * elements

    @staticmethod
    def fit(elements: Sequence[int], seconds: Sequence[float]) -> CommModel:
        """Least squares, clamped at zero (a negative startup or slope is noise)."""
        x = torch.tensor(elements, dtype=torch.float64)
        y = torch.tensor(seconds, dtype=torch.float64)
        design = torch.stack([torch.ones_like(x), x], dim=1)
        alpha, beta = torch.linalg.lstsq(design, y.unsqueeze(1)).solution.squeeze(1).tolist()
        return CommModel(max(alpha, 0.0), max(beta, 0.0))


def measure_comm_model(
    group: ProcessGroup | None,
    collective: Callable[[torch.Tensor, ProcessGroup | None], None],
    device: torch.device,
    sizes: Sequence[int] = (64, 4096, 65536),
    repeats: int = 5,
) -> CommModel:
    """Fit `CommModel` to timed runs of `collective(tensor_of_size, group)` on this cluster.

    Collective: every worker times the same sizes; the slowest worker's median counts.
    """
    medians = []
    for size in sizes:
        tensor = torch.zeros(size, device=device)
        collective(tensor, group)  # warm-up: connection setup is not a per-message cost
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            collective(tensor, group)
            samples.append(time.perf_counter() - start)
        medians.append(sorted(samples)[len(samples) // 2])
    slowest = torch.tensor(medians, dtype=torch.float64, device=device)  # NCCL: on the GPU
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)
    return CommModel.fit(list(sizes), slowest.tolist())


def gather_collective(tensor: torch.Tensor, group: ProcessGroup | None) -> None:
    size = dist.get_world_size(group)
    out = tensor.new_empty(size * tensor.numel())
    dist.all_gather_single(out, tensor, group=group)


def broadcast_collective(tensor: torch.Tensor, group: ProcessGroup | None) -> None:
    dist.broadcast(tensor, src=dist.get_global_rank(group, 0) if group else 0, group=group)


def fusion_plan(
    ready: Sequence[float], elements: Sequence[int], model: CommModel
) -> list[list[int]]:
    """Consecutive factors (in production order) grouped into messages.

    Walk the factors keeping a message open: the open message could start at
    `start = max(its last factor's ready time, when the channel frees up)`. The next
    factor joins it when it becomes ready less than alpha after that start (it would
    wait for the channel anyway, or waiting for it costs less than the startup a
    separate message would); otherwise the open message is sent and occupies the
    channel for alpha + beta * its elements.
    """
    if not ready:
        return []
    # Hooks may run slightly out of the expected order; a message cannot start before
    # any factor it follows.
    ready_by = list(ready)
    for i in range(1, len(ready_by)):
        ready_by[i] = max(ready_by[i], ready_by[i - 1])
    groups: list[list[int]] = []
    current = [0]
    channel_free = 0.0
    for i in range(1, len(ready_by)):
        start = max(ready_by[current[-1]], channel_free)
        if ready_by[i] - start < model.alpha:
            current.append(i)
            continue
        channel_free = start + model.seconds(sum(elements[j] for j in current))
        groups.append(current)
        current = [i]
    groups.append(current)
    return groups


def triangle_size(dim: int) -> int:
    return dim * (dim + 1) // 2


def upper_triangle(factor: torch.Tensor) -> torch.Tensor:
    rows, cols = torch.triu_indices(*factor.shape, device=factor.device)
    return factor[rows, cols]


def from_upper_triangle(values: torch.Tensor, dim: int) -> torch.Tensor:
    rows, cols = torch.triu_indices(dim, dim, device=values.device)
    matrix = values.new_zeros(dim, dim)
    matrix[rows, cols] = values
    matrix[cols, rows] = values
    return matrix


class FactorExchange:
    """One factor-update step's exchange: `begin`, `submit` each factor, `finish`."""

    def __init__(
        self,
        keys: Sequence[FactorKey],
        dims: Sequence[int],
        *,
        group: ProcessGroup | None,
        contributors: Sequence[frozenset[int]],
        pipelined: bool,
    ) -> None:
        self.keys = list(keys)
        self.dims = list(dims)
        self.contributors = list(contributors)
        self.pipelined = pipelined
        self._group = group
        self._world_size = dist.get_world_size(group) if dist.is_initialized() else 1
        self._index = {key: i for i, key in enumerate(self.keys)}
        self.groups: list[list[int]] = [[i] for i in range(len(self.keys))]
        self.ready_seconds = [0.0] * len(self.keys)
        self.begin()

    @property
    def elements(self) -> list[int]:
        return [triangle_size(d) for d in self.dims]

    def set_plan(self, groups: list[list[int]]) -> None:
        flat = [i for group in groups for i in group]
        if flat != list(range(len(self.keys))):
            raise ValueError("a fusion plan must cover every factor once, in order")
        self.groups = groups

    def begin(self) -> None:
        self._triangles: list[torch.Tensor | None] = [None] * len(self.keys)
        self._launched: list[tuple[torch.Tensor, dist.Work | None]] = []
        self._started = time.perf_counter()

    def submit(self, key: FactorKey, factor: torch.Tensor) -> None:
        i = self._index[key]
        self._triangles[i] = upper_triangle(factor)
        self.ready_seconds[i] = time.perf_counter() - self._started
        if self.pipelined:
            self._launch(ready_only=True)

    def finish(self) -> dict[FactorKey, torch.Tensor]:
        """Every factor averaged over its contributors; blocks until all messages arrive."""
        self._launch(ready_only=False)
        averaged: dict[FactorKey, torch.Tensor] = {}
        for group, (gathered, work) in zip(self.groups, self._launched, strict=True):
            if work is not None:
                work.wait()
            rows = gathered.reshape(self._world_size, -1)
            offset = 0
            for i in group:
                size = triangle_size(self.dims[i])
                total = self._sum_contributors(rows[:, offset : offset + size], i)
                averaged[self.keys[i]] = from_upper_triangle(total, self.dims[i])
                offset += size
        return averaged

    def _sum_contributors(self, rows: torch.Tensor, i: int) -> torch.Tensor:
        ranks = sorted(self.contributors[i])
        if not ranks:
            raise RuntimeError(f"factor {self.keys[i]} has no contributing worker")
        # Rank order, one addition at a time: the value cannot depend on the message.
        total = rows[ranks[0]].clone()
        for rank in ranks[1:]:
            total += rows[rank]
        return total / len(ranks)

    def _launch(self, *, ready_only: bool) -> None:
        # Messages start strictly in plan order, so every worker issues the same
        # collectives in the same order whatever order its hooks ran in.
        while len(self._launched) < len(self.groups):
            group = self.groups[len(self._launched)]
            parts = [self._triangles[i] for i in group]
            if ready_only and any(part is None for part in parts):
                return
            message = torch.cat(
                [
                    part if part is not None else self._zeros(i)
                    for i, part in zip(group, parts, strict=True)
                ]
            )
            self._launched.append(self._start(message))

    def _zeros(self, i: int) -> torch.Tensor:
        # A factor this worker did not produce (a stage it does not backpropagate): it
        # still takes part in the collective; its rows are not summed.
        if dist.is_initialized() and dist.get_rank(self._group) in self.contributors[i]:
            raise RuntimeError(f"factor {self.keys[i]} was not computed by a contributor")
        reference = next(t for t in self._triangles if t is not None)
        return reference.new_zeros(triangle_size(self.dims[i]))

    def _start(self, message: torch.Tensor) -> tuple[torch.Tensor, dist.Work | None]:
        if self._world_size == 1:
            return message, None
        gathered = message.new_empty(self._world_size * message.numel())
        work = dist.all_gather_single(gathered, message, group=self._group, async_op=True)
        return gathered, work
