"""Which worker decomposes which factor, from costs measured on the running hardware.

Load model (per inverse update): a factor decomposed locally costs its inversion time on
every worker; a distributed factor costs its inversion time on its owner and its
broadcast time on every worker (each takes part in the broadcast). So a worker's load
is the same common part (local inversions + all broadcasts) plus what it owns.

Balanced placement (SPD-KFAC): a factor whose inversion is cheaper than its broadcast is
decomposed locally by everyone; the others go, largest first, to the least-loaded
worker, improved by a branch and bound (exact on small cases) that starts from the better
of that greedy and round-robin's owners of the same factors. Never worse than
round-robin: the common part shrinks (a local factor costs less than its broadcast) and
the owned part starts from round-robin's owners of a subset of its factors.
Round-robin (the earlier distributed K-FAC baseline): factor i goes to worker i mod P.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from worker_agent.runtime.kfac.exchange import CommModel
from worker_agent.runtime.kfac.precondition import Decomposition, Method, decompose

# Branch-and-bound nodes explored before the best placement found so far is taken.
_SEARCH_NODES = 20_000


@dataclass(frozen=True)
class Placement:
    """Per factor: the owning worker, or None for "every worker decomposes it"."""

    owners: tuple[int | None, ...]

    def loads(
        self, inversion: Sequence[float], broadcast: Sequence[float], workers: int
    ) -> list[float]:
        common = sum(
            inversion[i] if owner is None else broadcast[i] for i, owner in enumerate(self.owners)
        )
        loads = [common] * workers
        for i, owner in enumerate(self.owners):
            if owner is not None:
                loads[owner] += inversion[i]
        return loads

    def max_load(
        self, inversion: Sequence[float], broadcast: Sequence[float], workers: int
    ) -> float:
        return max(self.loads(inversion, broadcast, workers))


def round_robin(factors: int, workers: int) -> Placement:
    return Placement(tuple(i % workers for i in range(factors)))


def balanced(inversion: Sequence[float], broadcast: Sequence[float], workers: int) -> Placement:
    n = len(inversion)
    if workers == 1:
        return Placement((None,) * n)
    remote = sorted(
        (i for i in range(n) if inversion[i] >= broadcast[i]), key=lambda i: -inversion[i]
    )
    costs = [inversion[i] for i in remote]
    greedy = _longest_first(costs, workers)
    baseline = [i % workers for i in remote]  # round-robin's owners of the same factors
    start = min(greedy, baseline, key=lambda owners: _max_owned(owners, costs, workers))
    owners = _branch_and_bound(costs, workers, start)
    placed: list[int | None] = [None] * n
    for i, owner in zip(remote, owners, strict=True):
        placed[i] = owner
    return Placement(tuple(placed))


def _max_owned(owners: Sequence[int], costs: Sequence[float], workers: int) -> float:
    loads = [0.0] * workers
    for owner, cost in zip(owners, costs, strict=True):
        loads[owner] += cost
    return max(loads)


def _longest_first(costs: Sequence[float], workers: int) -> list[int]:
    loads = [0.0] * workers
    owners = []
    for cost in costs:
        owner = min(range(workers), key=lambda w: (loads[w], w))
        loads[owner] += cost
        owners.append(owner)
    return owners


def _branch_and_bound(costs: Sequence[float], workers: int, start: list[int]) -> list[int]:
    """The assignment of `costs` (sorted, largest first) minimising the largest load."""
    best = list(start)
    best_max = _max_owned(start, costs, workers)
    suffix = [0.0] * (len(costs) + 1)
    for i in range(len(costs) - 1, -1, -1):
        suffix[i] = suffix[i + 1] + costs[i]
    loads = [0.0] * workers
    owners = [0] * len(costs)
    nodes = 0

    def search(k: int) -> None:
        nonlocal best, best_max, nodes
        nodes += 1
        if nodes > _SEARCH_NODES:
            return
        if k == len(costs):
            if max(loads) < best_max:
                best, best_max = list(owners), max(loads)
            return
        # Nothing below this node can beat the even split of what is left.
        if max(max(loads), (sum(loads) + suffix[k]) / workers) >= best_max:
            return
        tried: set[float] = set()
        for w in sorted(range(workers), key=lambda w: loads[w]):
            # Workers with equal loads are interchangeable: one subtree covers them.
            if loads[w] in tried or loads[w] + costs[k] >= best_max:
                continue
            tried.add(loads[w])
            loads[w] += costs[k]
            owners[k] = w
            search(k + 1)
            loads[w] -= costs[k]

    search(0)
    return best


def measure_inversion_seconds(
    dims: Sequence[int],
    method: Method,
    group: ProcessGroup | None,
    device: torch.device,
    repeats: int = 3,
) -> dict[int, float]:
    """Median decomposition time of each distinct dimension, the slowest worker's."""
    distinct = sorted(set(dims))
    medians = []
    for dim in distinct:
        generator = torch.Generator().manual_seed(dim)
        sample = torch.randn(dim, dim, generator=generator).to(device)
        factor = sample @ sample.T / dim
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            decompose(factor, method, 1e-3)
            samples.append(time.perf_counter() - start)
        medians.append(sorted(samples)[len(samples) // 2])
    slowest = torch.tensor(medians, dtype=torch.float64, device=device)
    if dist.is_initialized() and dist.get_world_size(group) > 1:
        # Every worker must compute the same placement from the same numbers.
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)
    return dict(zip(distinct, slowest.tolist(), strict=True))


def broadcast_seconds(dims: Sequence[int], method: Method, model: CommModel) -> list[float]:
    return [model.seconds(Decomposition.elements(d, method)) for d in dims]
