"""Queues with GPU quotas around any policy: guarantees first, borrowing, fair share.

Every job belongs to a queue (its spec's `queue`). A queue is guaranteed `quota` GPUs
while it has work for them, may borrow up to `borrowing_limit` more of what other
queues leave idle, and shares what is left over with the other borrowers by `weight`.
One level of hierarchy: a queue with a `parent` shares its parent's allowance with its
siblings the same way the top-level queues share the cluster.

The layer is pure and wraps a policy instead of changing it (`with_quotas`): each
round it

  1. gives every queue its allowance: its guarantee (up to its demand), then a
     weighted water-fill of the rest up to guarantee plus borrowing limit;
  2. picks the victims that reclaim lent GPUs: when queues within their allowance
     wait for GPUs that borrowers hold, the fewest, lowest-priority borrowing jobs
     that free enough (never taking a queue below its guarantee) are suspended; they
     checkpoint at their next lease boundary and wait to be placed again;
  3. shows the inner policy the cluster without the victims and without the waiting
     jobs of queues that have no room left, and keeps of its plan only the starts
     that fit each queue's allowance; where it started more of a queue than fits, it
     is asked again with only the starts of that queue it chose first (which fit), so
     that the GPUs it meant for the others go to jobs that may have them.

With every job in one queue whose quota and borrowing cover the cluster, the snapshot
and plan pass through untouched (but for jobs the layer suspended earlier, shown as
queued): a cluster without queues schedules as before.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from scheduler.core.plan import Placement, Plan
from scheduler.core.snapshot import ClusterSnapshot, JobView
from scheduler.core.states import JobState

DEFAULT_QUEUE = "default"
# Rounds of asking the inner policy again without the starts a queue had no room for.
_RETRIES = 4


@dataclass(frozen=True)
class Queue:
    """A queue as the layer sees it. `quota` None: whatever the other queues' quotas
    leave of the cluster (the default queue's); `borrowing_limit` None: no limit."""

    name: str
    quota: int | None = None
    borrowing_limit: int | None = None
    weight: float = 1.0
    parent: str | None = None


def queue_of(job: JobView) -> str:
    return job.queue or DEFAULT_QUEUE


@dataclass(frozen=True)
class Usage:
    """One queue's state in a round, as the layer decided it."""

    name: str
    guarantee: int  # GPUs guaranteed now (a quota of None resolved against the cluster)
    cap: float  # guarantee plus borrowing limit (inf: no limit)
    allowance: int  # GPUs it may hold after this round
    held: int  # GPUs its jobs hold when the round starts


@dataclass(frozen=True)
class QuotaDecision:
    """The layer's verdict for a round: each queue's usage, and the borrowing jobs it
    suspends to give lent GPUs back."""

    usage: Mapping[str, Usage]
    victims: tuple[int, ...]
    planned: Mapping[str, int]  # GPUs each queue holds once the plan is applied


class Quotas:
    """The configured queues, resolved against a cluster each round."""

    def __init__(self, queues: Iterable[Queue]) -> None:
        self.queues = {queue.name: queue for queue in queues}
        self.queues.setdefault(DEFAULT_QUEUE, Queue(DEFAULT_QUEUE))

    def leaf(self, name: str) -> str:
        """The queue a job of queue `name` counts against (unknown names: default)."""
        return name if name in self.queues else DEFAULT_QUEUE

    def trivial(self, snapshot: ClusterSnapshot, capacity: int) -> bool:
        """Every job in one top-level queue that may use the whole cluster."""
        names = {self.leaf(queue_of(job)) for job in snapshot.jobs}
        if len(names) > 1:
            return False
        queue = self.queues[names.pop()] if names else self.queues[DEFAULT_QUEUE]
        if queue.parent is not None:
            return False
        guarantee = capacity if queue.quota is None else queue.quota
        return _cap(guarantee, queue.borrowing_limit) >= capacity

    def decide(self, snapshot: ClusterSnapshot) -> QuotaDecision:
        capacity = _capacity(snapshot)
        held: dict[str, int] = defaultdict(int)
        wanted: dict[str, int] = defaultdict(int)
        waiting: dict[str, list[JobView]] = defaultdict(list)
        for job in snapshot.jobs:
            name = self.leaf(queue_of(job))
            if job.holding:
                held[name] += job.workers
                wanted[name] += job.workers
            elif job.waiting and job.workers <= capacity:
                wanted[name] += job.workers
                waiting[name].append(job)
        usage, groups = self._allowances(capacity, held, wanted)
        free = sum(len(node.free_gpus()) for node in snapshot.nodes)
        # Each parent's allowance is a pool its teams share, the cluster the pool of all.
        pools = [*groups.values(), (free + sum(u.held for u in usage.values()), list(usage))]
        victims = _victims(snapshot, usage, waiting, self.leaf, pools)
        planned = {name: held.get(name, 0) for name in usage}
        for job in snapshot.jobs:
            if job.id in victims:
                planned[self.leaf(queue_of(job))] -= job.workers
        return QuotaDecision(usage, tuple(sorted(victims)), planned)

    def _allowances(
        self, capacity: int, held: Mapping[str, int], wanted: Mapping[str, int]
    ) -> tuple[dict[str, Usage], dict[str, tuple[int, list[str]]]]:
        """Each queue's usage, and each parent's allowance with the queues sharing it."""
        children: dict[str | None, list[Queue]] = defaultdict(list)
        for queue in self.queues.values():
            parent = queue.parent if queue.parent in self.queues else None
            children[parent].append(queue)

        def demand(queue: Queue) -> int:
            return wanted.get(queue.name, 0) + sum(demand(c) for c in children[queue.name])

        usage: dict[str, Usage] = {}
        groups: dict[str, tuple[int, list[str]]] = {}

        def fill(members: Sequence[Queue], room: int, own: str | None) -> None:
            named = sum(q.quota for q in members if q.quota is not None)
            guarantees = {
                q.name: q.quota if q.quota is not None else max(room - named, 0) for q in members
            }
            claims = [
                _Claim(
                    q.name,
                    demand(q),
                    guarantees[q.name],
                    _cap(guarantees[q.name], q.borrowing_limit),
                    q.weight,
                )
                for q in members
            ]
            if own is not None and wanted.get(own, 0):
                # A parent's own jobs share its allowance with its children, unguaranteed.
                claims.append(_Claim(own, wanted[own], 0, math.inf, self.queues[own].weight))
            for claim, share in zip(claims, _share(room, claims), strict=True):
                below = children[claim.name] if claim.name != own else []
                if below:
                    fill(below, share, claim.name)
                    groups[claim.name] = (share, [q.name for q in below] + [claim.name])
                if claim.name != own or not below:
                    usage.setdefault(
                        claim.name,
                        Usage(
                            claim.name, claim.guarantee, claim.cap, share, held.get(claim.name, 0)
                        ),
                    )

        fill(children[None], capacity, None)
        return usage, groups


def with_quotas(
    policy: Callable[[ClusterSnapshot], Plan], quotas: Quotas
) -> Callable[[ClusterSnapshot], Plan]:
    """The policy inside the quota layer, as a policy (the simulator's)."""

    def schedule(snapshot: ClusterSnapshot) -> Plan:
        return schedule_within(policy, quotas, snapshot)[0]

    return schedule


def schedule_within(
    policy: Callable[[ClusterSnapshot], Plan], quotas: Quotas, snapshot: ClusterSnapshot
) -> tuple[Plan, QuotaDecision | None]:
    """The inner policy's plan within the queues' allowances, and the layer's decision
    (None when it passed the round through)."""
    capacity = _capacity(snapshot)
    if quotas.trivial(snapshot, capacity):
        return policy(_preempted_as_queued(snapshot)), None
    decision = quotas.decide(snapshot)
    victims = set(decision.victims)
    hidden: set[int] = set()
    plan = Plan()
    for attempt in range(_RETRIES + 1):
        view = _inner_view(snapshot, quotas, decision, victims | hidden)
        plan = policy(view)
        kept, dropped = _fit(plan, snapshot, quotas, decision)
        if not dropped or attempt == _RETRIES:
            break
        # The queues it overfilled keep only the starts it chose first, which fit.
        full = {quotas.leaf(queue_of(job)) for job in snapshot.jobs if job.id in dropped}
        chosen = {placement.job_id for placement in kept}
        hidden |= {
            job.id
            for job in snapshot.jobs
            if job.waiting and job.id not in chosen and quotas.leaf(queue_of(job)) in full
        }
    planned = dict(decision.planned)
    jobs = {job.id: job for job in snapshot.jobs}
    for job_id in plan.suspend:
        planned[quotas.leaf(queue_of(jobs[job_id]))] -= jobs[job_id].workers
    for placement in kept:
        planned[quotas.leaf(queue_of(jobs[placement.job_id]))] += jobs[placement.job_id].workers
    final = replace(
        plan,
        start=kept,
        suspend=tuple(sorted({*plan.suspend, *victims})),
    )
    return final, replace(decision, planned=planned)


def _inner_view(
    snapshot: ClusterSnapshot, quotas: Quotas, decision: QuotaDecision, excluded: set[int]
) -> ClusterSnapshot:
    """The cluster as the inner policy may use it: the victims' GPUs free, the jobs of
    queues with no room left out, and jobs suspended to wait shown as queued."""
    room = {
        name: usage.allowance - decision.planned.get(name, 0)
        for name, usage in decision.usage.items()
    }
    jobs = []
    for job in snapshot.jobs:
        if job.id in excluded:
            continue
        if job.waiting:
            if job.workers > room.get(quotas.leaf(queue_of(job)), 0):
                continue
            job = _as_queued(job)
        jobs.append(job)
    if not decision.victims:
        return replace(snapshot, jobs=tuple(jobs))
    gone = set(decision.victims)
    nodes = tuple(
        replace(
            node,
            gpus=tuple(
                replace(gpu, holders=tuple(h for h in gpu.holders if h not in gone))
                for gpu in node.gpus
            ),
        )
        for node in snapshot.nodes
    )
    return replace(snapshot, nodes=nodes, jobs=tuple(jobs))


def _as_queued(job: JobView) -> JobView:
    """A job suspended to give GPUs back waits like a queued one (a policy that never
    preempts, such as FIFO, places only queued jobs)."""
    return replace(job, state=JobState.QUEUED) if job.state is JobState.SUSPENDED else job


def _preempted_as_queued(snapshot: ClusterSnapshot) -> ClusterSnapshot:
    """The snapshot itself unless the layer suspended some job that still waits."""
    if not any(job.waiting and job.state is JobState.SUSPENDED for job in snapshot.jobs):
        return snapshot
    return replace(
        snapshot, jobs=tuple(_as_queued(job) if job.waiting else job for job in snapshot.jobs)
    )


def _fit(
    plan: Plan, snapshot: ClusterSnapshot, quotas: Quotas, decision: QuotaDecision
) -> tuple[tuple[Placement, ...], set[int]]:
    """The plan's starts that fit their queue's allowance, in the plan's order, and the
    jobs of those that did not."""
    jobs = {job.id: job for job in snapshot.jobs}
    planned = dict(decision.planned)
    for job_id in plan.suspend:
        planned[quotas.leaf(queue_of(jobs[job_id]))] -= jobs[job_id].workers
    kept = []
    dropped: set[int] = set()
    for placement in plan.start:
        job = jobs[placement.job_id]
        name = quotas.leaf(queue_of(job))
        if planned.get(name, 0) + job.workers <= decision.usage[name].allowance:
            planned[name] = planned.get(name, 0) + job.workers
            kept.append(placement)
        else:
            dropped.add(job.id)
    return tuple(kept), dropped


@dataclass(frozen=True)
class _Claim:
    name: str
    demand: int
    guarantee: int
    cap: float
    weight: float


def _cap(guarantee: int, borrowing_limit: int | None) -> float:
    return math.inf if borrowing_limit is None else guarantee + borrowing_limit


def _capacity(snapshot: ClusterSnapshot) -> int:
    return sum(len(node.gpus) for node in snapshot.nodes if node.alive and node.schedulable)


def _share(room: int, claims: Sequence[_Claim]) -> list[int]:
    """Whole GPUs for each claim: its guarantee up to its demand first (scaled down by
    weight when the guarantees overcommit the room), then the rest by weighted
    water-filling up to min(demand, cap)."""
    base = _water_fill(room, [min(c.demand, c.guarantee) for c in claims], claims)
    rest = room - sum(base)
    extra = _water_fill(
        rest,
        [max(min(c.demand, c.cap) - b, 0) for c, b in zip(claims, base, strict=True)],
        claims,
    )
    return [b + e for b, e in zip(base, extra, strict=True)]


def _water_fill(room: int, limits: Sequence[float], claims: Sequence[_Claim]) -> list[int]:
    """Whole units up to each limit, the same level of units per weight for all that
    are not at their limit, remainders by largest fraction then order."""
    if sum(limits) <= room:
        return [int(limit) for limit in limits]
    weights = [max(c.weight, 1e-9) for c in claims]
    order = sorted(range(len(claims)), key=lambda i: limits[i] / weights[i])
    left, active = float(room), sum(weights)
    level = math.inf
    for i in order:
        if limits[i] / weights[i] > left / active:
            level = left / active  # the rest share what is left at one level
            break
        left -= limits[i]
        active -= weights[i]
    exact = [min(limits[i], weights[i] * level) for i in range(len(claims))]
    given = [int(math.floor(x + 1e-9)) for x in exact]
    spare = room - sum(given)
    for i in sorted(range(len(claims)), key=lambda i: (-(exact[i] - given[i]), i)):
        if spare <= 0:
            break
        if given[i] < limits[i]:
            given[i] += 1
            spare -= 1
    return given


def _victims(
    snapshot: ClusterSnapshot,
    usage: Mapping[str, Usage],
    waiting: Mapping[str, list[JobView]],
    leaf: Callable[[str], str],
    pools: Sequence[tuple[int, Sequence[str]]],
) -> set[int]:
    """The fewest, lowest-priority borrowing jobs to suspend so that the queues within
    their allowance can start what they wait for. `pools`: GPUs shared by queues (a
    parent's allowance by its teams, the cluster by all), each with its queues; in each,
    borrowers give back only what the others' waiting jobs need beyond what is free."""
    holding: dict[str, list[JobView]] = defaultdict(list)
    for job in snapshot.jobs:
        if job.holding:
            holding[leaf(queue_of(job))].append(job)
    need: dict[str, int] = {}
    for name, jobs in waiting.items():
        room, need[name] = usage[name].allowance - usage[name].held, 0
        for job in sorted(jobs, key=_order):
            if job.workers <= room:
                room -= job.workers
                need[name] += job.workers
    left = {name: u.held for name, u in usage.items()}
    chosen: dict[int, JobView] = {}
    for size, members in pools:
        names = [name for name in members if name in usage]
        deficit = sum(need.get(name, 0) for name in names) - (
            size - sum(left[name] for name in names)
        )
        over = sorted(
            (usage[name] for name in names if left[name] > usage[name].allowance),
            key=lambda u: (-(left[u.name] - u.allowance), u.name),
        )
        picked: list[JobView] = []
        for queue in over:
            # Lowest priority first; of equal priority the largest (fewest victims), then
            # the one that has held its GPUs least long (least work to redo).
            for job in sorted(holding[queue.name], key=_victim_order):
                if deficit <= 0 or left[queue.name] <= queue.allowance:
                    break
                if job.id in chosen or left[queue.name] - job.workers < queue.guarantee:
                    continue
                picked.append(job)
                left[queue.name] -= job.workers
                deficit -= job.workers
        # Keep anyone whose suspension the others already make unnecessary.
        for job in sorted(picked, key=_victim_order, reverse=True):
            if deficit + job.workers <= 0:
                picked.remove(job)
                left[leaf(queue_of(job))] += job.workers
                deficit += job.workers
        chosen.update((job.id, job) for job in picked)
    return set(chosen)


def _order(job: JobView) -> tuple[int, float, int]:
    return (-job.priority, job.created_at.timestamp(), job.id)


def _victim_order(job: JobView) -> tuple[int, int, float, int]:
    since = job.held_since.timestamp() if job.held_since is not None else 0.0
    return (job.priority, -job.workers, -since, -job.id)
