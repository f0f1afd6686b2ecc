"""What the policies share to choose and place jobs: the jobs that compete for GPUs,
a job's remaining time, its own SPB setting, and the pool of free GPUs that gangs are
taken from on as few nodes as possible."""

from __future__ import annotations

import heapq
import math
from collections import Counter, defaultdict
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from jigsaw import spb
from scheduler.core.snapshot import ClusterSnapshot, GPUView, JobView


def candidates(snapshot: ClusterSnapshot) -> list[JobView]:
    """Jobs holding GPUs or waiting for them."""
    return [job for job in snapshot.jobs if job.holding or job.waiting]


def remaining_seconds(job: JobView) -> float:
    """The job's iterations left times its step time when the scheduler has a model of
    its speed (`JobView.model`), else its iterations left alone; a job with neither
    (only a target metric) is longest."""
    if job.model is not None:
        left = max(job.model.iterations_total - job.iterations_done, 0)
        return left * job.model.alone_step_seconds
    if job.max_iterations is None:
        return math.inf
    return float(max(job.max_iterations - job.iterations_done, 0))


class FreePool:
    """Free GPUs by node, taken a gang at a time on as few nodes as possible.

    While no single node can hold what is left of a gang, take the node with the most
    free GPUs; then finish on the node with the fewest free GPUs that still fits (best
    fit), which keeps large holes open for large jobs. This uses the fewest nodes
    possible. Ties go to the first node by name, so plans are deterministic. Nodes are
    kept in one heap per free count, so a placement costs about the GPUs per node plus
    a heap operation, not a scan of the cluster.
    """

    def __init__(self, free: Mapping[int, Sequence[GPUView]]) -> None:
        self._gpus = {node: list(gpus) for node, gpus in free.items() if gpus}
        self.total = sum(len(gpus) for gpus in self._gpus.values())
        self._heaps: dict[int, list[tuple[str, int]]] = defaultdict(list)
        self._counts = Counter(len(gpus) for gpus in self._gpus.values())  # nodes by free GPUs
        for gpus in self._gpus.values():
            self._heaps[len(gpus)].append(_node_key(gpus))
        for heap in self._heaps.values():
            heapq.heapify(heap)

    def span(self, workers: int, plus: Sequence[GPUView] = ()) -> int | None:
        """How many nodes `take(workers)` would spread the gang over were `plus` free
        too (None: it would fail), without taking anything: the same choices on the
        free counts alone, so it costs the GPUs per node, not the nodes."""
        if self.total + len(plus) < workers:
            return None
        counts = Counter(self._counts)
        for node, extra in Counter(gpu.node_id for gpu in plus).items():
            had = len(self._gpus.get(node, ()))
            if had:
                counts[had] -= 1
            counts[had + extra] += 1
        nodes = 0
        while workers > 0:
            nodes += 1
            fits = [c for c, n in counts.items() if n and c >= workers]
            count = min(fits) if fits else max(c for c, n in counts.items() if n)
            counts[count] -= 1
            if count > workers:
                counts[count - workers] += 1
            workers -= min(count, workers)
        return nodes

    def give(self, gpus: Sequence[GPUView]) -> None:
        """Put GPUs back (a job leaving the plan being built)."""
        for gpu in gpus:
            self._reset(gpu.node_id, [*self._gpus.get(gpu.node_id, []), gpu])
            self.total += 1

    def fits_around(self, workers: int, held: Sequence[GPUView]) -> bool:
        """Whether `take_around(workers, held)` would take `workers` GPUs once `held`
        (not free now) were given back."""
        nodes = {gpu.node_id for gpu in held}
        return len(nodes) == 1 and len(self._gpus.get(nodes.pop(), ())) + len(held) >= workers

    def take_around(
        self, workers: int, kept: Sequence[GPUView], avoid: Collection[int] = ()
    ) -> list[GPUView] | None:
        """`workers` GPUs of the one node of `kept` (free, in their order first, then the
        node's others by index, those in `avoid` last): a gang grown or shrunk where it
        runs, which the cluster does in place; None and take nothing when they are on
        several nodes or too few."""
        nodes = {gpu.node_id for gpu in kept}
        free = self._gpus.get(next(iter(nodes)), []) if len(nodes) == 1 else []
        ids = {gpu.id for gpu in kept}
        if len(free) < workers or not ids <= {gpu.id for gpu in free}:
            return None
        others = sorted((gpu for gpu in free if gpu.id not in ids), key=lambda g: g.id in avoid)
        taken = list(kept) + others[: workers - len(kept)]
        self._reset(free[0].node_id, [gpu for gpu in free if gpu not in taken])
        self.total -= len(taken)
        return taken

    def claim(self, gpus: Sequence[GPUView]) -> None:
        """Take these GPUs out where they are free (a job kept where it runs)."""
        for gpu in gpus:
            free = self._gpus.get(gpu.node_id, [])
            rest = [g for g in free if g.id != gpu.id]
            if len(rest) < len(free):
                self._reset(gpu.node_id, rest)
                self.total -= 1

    def _reset(self, node: int, gpus: list[GPUView]) -> None:
        """Node `node` now has `gpus` free (stale heap entries are dropped lazily)."""
        had = len(self._gpus.get(node, ()))
        if had:
            self._counts[had] -= 1
        if gpus:
            gpus.sort(key=lambda g: g.index)
            self._gpus[node] = gpus
            self._counts[len(gpus)] += 1
            heapq.heappush(self._heaps[len(gpus)], _node_key(gpus))
        else:
            self._gpus.pop(node, None)

    def _first(self, count: int) -> int | None:
        """The first node (by name) with exactly `count` free GPUs."""
        heap = self._heaps.get(count)
        while heap:
            _, node = heap[0]
            if len(self._gpus.get(node, ())) == count:
                return node
            heapq.heappop(heap)  # stale: that node's count changed since
        return None

    def take(self, workers: int) -> list[GPUView] | None:
        """`workers` GPUs, or None and take nothing."""
        if self.total < workers:
            return None
        chosen: list[GPUView] = []
        counts = sorted((c for c, heap in self._heaps.items() if heap), reverse=True)
        while len(chosen) < workers:
            needed = workers - len(chosen)
            node = None
            for count in sorted(c for c in counts if c >= needed):
                node = self._first(count)
                if node is not None:
                    break
            if node is None:
                node = next(n for c in counts if (n := self._first(c)) is not None)
            gpus = self._gpus[node]
            taken, rest = gpus[:needed], gpus[needed:]
            chosen.extend(taken)
            self.total -= len(taken)
            self._counts[len(gpus)] -= 1
            if rest:
                self._gpus[node] = rest
                self._counts[len(rest)] += 1
                heapq.heappush(self._heaps[len(rest)], _node_key(rest))
                if len(rest) not in counts:
                    counts = sorted({*counts, len(rest)}, reverse=True)
            else:
                del self._gpus[node]
        return chosen


def pool_beside(snapshot: ClusterSnapshot, held: set[int]) -> FreePool:
    """The GPUs of the schedulable nodes but `held` (the kept jobs'), as a pool: what a
    policy that decides every job's GPUs afresh places the others on."""
    gpus = snapshot.gpus_by_id()
    free: dict[int, list[GPUView]] = {}
    for node in snapshot.nodes:
        if node.alive and node.schedulable:
            open_gpus = [gpus[g.id] for g in node.gpus if g.id not in held]
            if open_gpus:
                free[node.id] = open_gpus
    return FreePool(free)


def _node_key(gpus: Sequence[GPUView]) -> tuple[str, int]:
    return (gpus[0].node_name, gpus[0].node_id)


def spb_of(job: JobView) -> dict[str, Any]:
    # A fixed SPB configuration passes through; "auto" awaits the SPB planner, "off" is {}.
    return spb.as_json(spb.resolve(job.spb_setting))
