"""Why a waiting job did not start this round, in words a user can act on.

Pure: from the round's snapshot, the plan that will be applied and the quota layer's
decision. The first reason that holds is given, most fundamental first: the cluster
can never hold the job; its queue has no room; not enough GPUs are free; jobs ahead
of it in the order (priority, then submission) wait too; the policy chose others. A
job the policy placed on GPUs that an ending job's processes still hold waits for them
to exit (the loop holds such starts back: `freeing_reason`).
"""

from __future__ import annotations

import heapq
import math
from datetime import datetime, timedelta
from typing import NamedTuple

from scheduler.core.plan import Plan
from scheduler.core.quota import QuotaDecision, Quotas, queue_of
from scheduler.core.snapshot import ClusterSnapshot, JobView
from scheduler.policies.srtf import remaining_seconds

UNPLACEABLE = "unplaceable"  # no capacity of the cluster can ever hold it
QUOTA = "quota"  # its queue has no room left
CAPACITY = "capacity"  # not enough GPUs free now
ORDER = "order"  # jobs ahead of it wait too
POLICY = "policy"  # the policy chose others
FREEING = "freeing"  # placed on GPUs an ending job's processes still hold


class Wait(NamedTuple):
    kind: str
    text: str


def freeing_reason(gpus: list[str]) -> Wait:
    """Why a job placed on `gpus` (`node:index`) was not launched this round."""
    return Wait(
        FREEING,
        f"placed on {', '.join(gpus)}, still held by the processes of a suspended or "
        "stopped job while they checkpoint and exit; starts once they are gone",
    )


def exiting_reason() -> Wait:
    """Why a job placed again was not launched while its earlier run's processes live."""
    return Wait(
        FREEING,
        "its earlier run's processes are still checkpointing and exiting; starts once "
        "they are gone",
    )


def unheard_reason(nodes: list[str]) -> Wait:
    """Why a job was not launched while agents that outlived the previous scheduler
    have not said what they run: it is placed on their nodes, or it ran before and
    its earlier run's processes may still be checkpointing there."""
    return Wait(
        FREEING,
        f"the agents of {', '.join(nodes)} have not yet told this scheduler what they run "
        "(it took over moments ago); starts once they have, or once they time out",
    )


def unplaceable_reason(workers: int, largest_gang: int) -> str | None:
    """Why a job of `workers` GPUs cannot be placed while the alive, schedulable nodes
    hold `largest_gang` GPUs in all; None when it could be."""
    if workers <= largest_gang:
        return None
    if largest_gang == 0:
        return f"needs {workers} GPU(s); no alive, schedulable node has any"
    return f"needs {workers} GPUs; the largest gang this cluster can form is {largest_gang}"


def explain(
    snapshot: ClusterSnapshot,
    plan: Plan,
    decision: QuotaDecision | None,
    quotas: Quotas,
    policy: str,
) -> dict[int, Wait]:
    """A reason for every waiting job the plan does not start."""
    schedulable = [node for node in snapshot.nodes if node.alive and node.schedulable]
    capacity = sum(len(node.gpus) for node in schedulable)
    per_node = max((len(node.gpus) for node in schedulable), default=0)
    jobs = {job.id: job for job in snapshot.jobs}
    started = {placement.job_id for placement in plan.start}
    free = (
        sum(len(node.free_gpus()) for node in snapshot.nodes)
        + sum(jobs[job_id].workers for job_id in plan.suspend if job_id in jobs)
        - sum(len(placement.gpu_ids) for placement in plan.start)
    )
    waiting = sorted(
        (job for job in snapshot.jobs if job.waiting and job.id not in started), key=_order
    )
    reasons: dict[int, Wait] = {}
    higher: dict[int, int] = {}  # waiting jobs seen so far, by priority
    for position, job in enumerate(waiting):
        ahead = sum(count for priority, count in higher.items() if priority > job.priority)
        if text := unplaceable_reason(job.workers, capacity):
            reasons[job.id] = Wait(UNPLACEABLE, text)
        elif text := _queue_full(job, decision, quotas):
            reasons[job.id] = Wait(QUOTA, text)
        elif text := _no_room(job, free, per_node):
            reasons[job.id] = Wait(CAPACITY, text)
        elif ahead or position:
            behind = f"{ahead} job(s) of higher priority" if ahead else f"{position} earlier job(s)"
            reasons[job.id] = Wait(ORDER, f"waiting behind {behind}")
        else:
            reasons[job.id] = Wait(POLICY, f"the {policy} policy runs other jobs first this round")
        higher[job.priority] = higher.get(job.priority, 0) + 1
    return reasons


def _queue_full(job: JobView, decision: QuotaDecision | None, quotas: Quotas) -> str | None:
    if decision is None:
        return None
    name = quotas.leaf(queue_of(job))
    usage = decision.usage.get(name)
    if usage is None:
        return None
    planned = decision.planned.get(name, 0)
    if planned + job.workers <= usage.allowance:
        return None
    if planned + job.workers > usage.cap:
        limit = usage.cap - usage.guarantee
        borrowing = f" and borrowing limit of {int(limit)}" if limit > 0 else ""
        return f"queue {name} is at its quota of {usage.guarantee} GPUs{borrowing}"
    if planned >= usage.guarantee and usage.allowance <= usage.guarantee:
        return f"queue {name} is at its quota of {usage.guarantee} GPUs; no idle GPU to borrow"
    if planned >= usage.guarantee:
        return (
            f"queue {name} holds {planned} GPUs: its quota of {usage.guarantee} and its fair "
            "share of the idle ones"
        )
    return (
        f"queue {name} may use {usage.allowance} GPUs now; other queues' guarantees hold the rest"
    )


def _no_room(job: JobView, free: int, per_node: int) -> str | None:
    if job.workers <= free:
        return None
    nodes = math.ceil(job.workers / per_node) if per_node else 0
    return f"needs {job.workers} GPUs on {nodes} node(s); largest free gang is {max(free, 0)}"


def _order(job: JobView) -> tuple[int, float, int]:
    return (-job.priority, job.created_at.timestamp(), job.id)


def estimated_starts(
    snapshot: ClusterSnapshot, plan: Plan, decision: QuotaDecision | None, policy: str
) -> dict[int, datetime]:
    """When each waiting job would start, where the policy can tell: FIFO (which starts
    jobs in its order and never preempts) with no queue holding jobs back, every job
    holding GPUs after the plan and every job ahead with a speed model. Jobs ahead are
    assumed to run to their end at their measured speed, none to arrive ahead, and any
    free GPUs to form a gang (node topology is ignored)."""
    if policy != "fifo" or decision is not None:
        return {}
    jobs = {job.id: job for job in snapshot.jobs}
    ended = {*plan.suspend, *plan.stop}
    started = {placement.job_id for placement in plan.start}
    holding = [
        job for job in snapshot.jobs if (job.holding and job.id not in ended) or job.id in started
    ]
    if any(job.model is None for job in holding):
        return {}
    capacity = sum(len(n.gpus) for n in snapshot.nodes if n.alive and n.schedulable)
    free = capacity - sum(job.workers for job in holding)
    ends = [(remaining_seconds(job), job.workers) for job in holding]
    heapq.heapify(ends)
    clock = 0.0
    starts: dict[int, datetime] = {}
    for job in sorted(jobs.values(), key=_order):
        if not job.waiting or job.id in started or job.workers > capacity:
            continue
        while free < job.workers and ends:
            clock, workers = heapq.heappop(ends)
            free += workers
        if free < job.workers:
            break
        starts[job.id] = snapshot.now + timedelta(seconds=clock)
        if job.model is None:
            break  # its end, and so the starts behind it, cannot be told
        free -= job.workers
        heapq.heappush(ends, (clock + remaining_seconds(job), job.workers))
    return starts
