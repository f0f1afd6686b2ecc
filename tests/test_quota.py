"""The quota layer as a pure function around every policy: guarantees, borrowing,
weighted fair share, reclaiming lent GPUs from the fewest lowest-priority borrowers."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from scheduler.core.plan import Plan
from scheduler.core.quota import Queue, Quotas, schedule_within
from scheduler.core.snapshot import ClusterSnapshot, GPUView, JobView, NodeView
from scheduler.core.states import JobState
from scheduler.policies import POLICIES, Policy

T0 = datetime(2024, 1, 1, tzinfo=UTC)
TEAMS = Quotas([Queue("a", quota=2, borrowing_limit=2), Queue("b", quota=2, borrowing_limit=2)])


def cluster(nodes: int, size: int) -> tuple[NodeView, ...]:
    return tuple(
        NodeView(
            id=n,
            name=f"n{n}",
            alive=True,
            gpus=tuple(GPUView(n * 100 + i, n, f"n{n}", i, "H100", 80 << 30) for i in range(size)),
        )
        for n in range(1, nodes + 1)
    )


def job(
    job_id: int, queue: str, workers: int = 1, *, priority: int = 0, created: float | None = None
) -> JobView:
    return JobView(
        id=job_id,
        state=JobState.QUEUED,
        priority=priority,
        workers=workers,
        created_at=T0 + timedelta(seconds=job_id if created is None else created),
        queue=queue,
    )


class Cluster:
    """Jobs and GPUs in memory; plans applied as the loop applies them."""

    def __init__(self, nodes: tuple[NodeView, ...], jobs: list[JobView]) -> None:
        self.nodes = nodes
        self.jobs = {j.id: j for j in jobs}
        self.now = T0 + timedelta(hours=1)

    def snapshot(self) -> ClusterSnapshot:
        holders: dict[int, list[int]] = {}
        for j in self.jobs.values():
            for gpu in j.allocated_gpu_ids:
                holders.setdefault(gpu, []).append(j.id)
        nodes = tuple(
            replace(n, gpus=tuple(replace(g, holders=tuple(holders.get(g.id, ()))) for g in n.gpus))
            for n in self.nodes
        )
        return ClusterSnapshot(nodes=nodes, jobs=tuple(self.jobs.values()), now=self.now)

    def round(self, policy: Policy, quotas: Quotas) -> Plan:
        plan, _ = schedule_within(policy, quotas, self.snapshot())
        for job_id in plan.suspend:
            self.jobs[job_id] = replace(
                self.jobs[job_id],
                state=JobState.SUSPENDED,
                preempted=True,
                allocated_gpu_ids=(),
                held_since=None,
            )
        taken = {g for j in self.jobs.values() for g in j.allocated_gpu_ids}
        for placement in plan.start:
            assert not taken & set(placement.gpu_ids), "a start on a GPU still held"
            taken |= set(placement.gpu_ids)
            self.jobs[placement.job_id] = replace(
                self.jobs[placement.job_id],
                state=JobState.RUNNING,
                preempted=False,
                allocated_gpu_ids=placement.gpu_ids,
                held_since=self.now,
            )
        self.now += timedelta(minutes=1)
        return plan

    def held(self, queue: str) -> int:
        return sum(j.workers for j in self.jobs.values() if j.holding and j.queue == queue)

    def add(self, *jobs: JobView) -> None:
        for j in jobs:
            self.jobs[j.id] = replace(j, created_at=self.now)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_a_borrower_gives_lent_gpus_back_within_one_round(name: str) -> None:
    world = Cluster(cluster(1, 4), [job(i, "a") for i in range(1, 5)])
    world.round(POLICIES[name], TEAMS)
    assert world.held("a") == 4  # B is idle: A borrows its two GPUs

    world.add(job(5, "b"), job(6, "b"))
    plan = world.round(POLICIES[name], TEAMS)
    assert len(plan.suspend) == 2 and all(world.jobs[j].queue == "a" for j in plan.suspend)
    assert (world.held("a"), world.held("b")) == (2, 2)
    # The suspended borrowers wait to be placed again, not for a user.
    assert all(world.jobs[j].preempted for j in plan.suspend)

    for j in (5, 6):
        world.jobs[j] = replace(world.jobs[j], state=JobState.SUCCEEDED, allocated_gpu_ids=())
    world.round(POLICIES[name], TEAMS)
    assert world.held("a") == 4  # B finished: A's suspended jobs resume on its GPUs


def test_victims_are_the_fewest_lowest_priority_borrowers() -> None:
    quotas = Quotas([Queue("a", quota=4, borrowing_limit=4), Queue("b", quota=4)])
    world = Cluster(
        cluster(1, 8),
        [
            job(1, "a", 2, priority=5),
            job(2, "a", 4, priority=0),
            job(3, "a", 1, priority=0),
            job(4, "a", 1, priority=5),
        ],
    )
    world.round(POLICIES["fifo"], quotas)
    assert world.held("a") == 8
    world.add(job(9, "b", 4))
    plan = world.round(POLICIES["fifo"], quotas)
    assert plan.suspend == (2,)  # one job of the lowest priority frees all four
    assert world.held("b") == 4


def test_a_queue_never_borrows_past_its_limit_and_the_rest_stays_idle() -> None:
    quotas = Quotas([Queue("a", quota=1, borrowing_limit=1), Queue("b", quota=3)])
    world = Cluster(cluster(1, 4), [job(i, "a") for i in range(1, 5)])
    for _ in range(3):
        world.round(POLICIES["srtf"], quotas)
        assert world.held("a") == 2


def test_over_their_guarantees_queues_share_by_weight() -> None:
    quotas = Quotas(
        [
            Queue("a", quota=0, weight=3),
            Queue("b", quota=0, weight=1),
            Queue("default", quota=0),
        ]
    )
    world = Cluster(
        cluster(2, 4), [job(i, "a") for i in range(1, 9)] + [job(i, "b") for i in range(9, 17)]
    )
    world.round(POLICIES["fifo"], quotas)
    assert (world.held("a"), world.held("b")) == (6, 2)


def test_a_team_under_an_organisation_shares_its_parents_allowance() -> None:
    quotas = Quotas(
        [
            Queue("org", quota=4, borrowing_limit=0),
            Queue("t1", quota=1, parent="org"),
            Queue("t2", quota=3, parent="org"),
            Queue("default", quota=4),
        ]
    )
    world = Cluster(cluster(1, 8), [job(i, "t1") for i in range(1, 9)])
    world.round(POLICIES["fifo"], quotas)
    assert world.held("t1") == 4  # its sibling's idle GPUs, never past the organisation's
    world.add(*(job(i, "t2") for i in range(20, 23)))
    world.round(POLICIES["fifo"], quotas)
    assert (world.held("t1"), world.held("t2")) == (1, 3)


def test_one_queue_covering_the_cluster_passes_the_round_through() -> None:
    snapshot = Cluster(cluster(2, 4), [job(i, "default", 3) for i in range(1, 5)]).snapshot()
    for name, policy in POLICIES.items():
        plan, decision = schedule_within(policy, Quotas([]), snapshot)
        assert decision is None and plan == policy(snapshot), name


@settings(max_examples=60, deadline=None)
@given(
    policy=st.sampled_from(sorted(POLICIES)),
    guarantees=st.lists(st.integers(0, 4), min_size=2, max_size=3),
    limits=st.lists(st.one_of(st.none(), st.integers(0, 4)), min_size=3, max_size=3),
    arrivals=st.lists(st.tuples(st.integers(0, 2), st.integers(1, 6)), max_size=30),
)
def test_guarantees_hold_whenever_a_queue_has_demand(
    policy: str,
    guarantees: list[int],
    limits: list[int | None],
    arrivals: list[tuple[int, int]],
) -> None:
    """Random submissions of one-GPU jobs over rounds: once a round has passed since a
    queue's demand appeared, it holds at least min(guarantee, demand), and no queue ever
    holds more than its guarantee plus borrowing limit."""
    size = 8
    assume(sum(guarantees) <= size)
    names = [f"q{i}" for i in range(len(guarantees))]
    quotas = Quotas(
        [
            Queue(n, quota=g, borrowing_limit=limits[i])
            for i, (n, g) in enumerate(zip(names, guarantees, strict=True))
        ]
    )
    world = Cluster(cluster(2, size // 2), [])
    next_id = 1
    by_round: dict[int, list[tuple[int, int]]] = {}
    for queue, count in arrivals:
        by_round.setdefault(next_id % 5, []).append((queue % len(names), count))
        next_id += 1
    next_id = 1
    for tick in range(8):
        for queue, count in by_round.get(tick, []):
            for _ in range(count):
                world.add(job(next_id, names[queue]))
                next_id += 1
        demand_before = {
            n: sum(1 for j in world.jobs.values() if j.queue == n and not j.state.terminal)
            for n in names
        }
        world.round(POLICIES[policy], quotas)
        for i, n in enumerate(names):
            cap = guarantees[i] + limits[i] if limits[i] is not None else size
            assert world.held(n) <= cap
            assert world.held(n) >= min(guarantees[i], demand_before[n]), (n, tick)
        # Some jobs finish each round, so demand changes over time.
        for j in list(world.jobs.values()):
            if j.holding and (j.id + tick) % 3 == 0:
                world.jobs[j.id] = replace(j, state=JobState.SUCCEEDED, allocated_gpu_ids=())
