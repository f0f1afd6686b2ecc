"""The FIFO gang policy as a pure function: snapshots in, plans out, no database."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from scheduler.plan import Placement
from scheduler.policies import POLICIES, get_policy
from scheduler.policies.fifo import schedule
from scheduler.policies.placement import FreePool
from scheduler.snapshot import ClusterSnapshot, GPUView, JobView, NodeView
from scheduler.states import JobState

T0 = datetime(2024, 1, 1, tzinfo=UTC)


def cluster(
    sizes: dict[str, int], *, held: dict[str, int] | None = None, dead: frozenset[str] = frozenset()
) -> tuple[NodeView, ...]:
    """Nodes named by `sizes` (GPU counts); the first `held[name]` GPUs of a node are busy.

    GPU ids are node number * 100 + index, so tests can read where a job landed.
    """
    held = held or {}
    nodes = []
    for number, (name, size) in enumerate(sizes.items(), start=1):
        gpus = tuple(
            GPUView(
                id=number * 100 + index,
                node_id=number,
                node_name=name,
                index=index,
                kind="H100",
                memory_bytes=80 << 30,
                holders=(999,) if index < held.get(name, 0) else (),
            )
            for index in range(size)
        )
        nodes.append(NodeView(id=number, name=name, alive=name not in dead, gpus=gpus))
    return tuple(nodes)


def job(job_id: int, workers: int, *, priority: int = 0, spb: Any = "off") -> JobView:
    return JobView(
        id=job_id,
        state=JobState.QUEUED,
        priority=priority,
        workers=workers,
        created_at=T0 + timedelta(seconds=job_id),
        spec={"workers": workers, "spb": spb},
    )


def snapshot(nodes: tuple[NodeView, ...], *jobs: JobView) -> ClusterSnapshot:
    return ClusterSnapshot(nodes=nodes, jobs=jobs, now=T0)


def placed(snap: ClusterSnapshot) -> dict[int, tuple[int, ...]]:
    plan = schedule(snap)
    assert plan.suspend == () and plan.stop == ()
    return {placement.job_id: placement.gpu_ids for placement in plan.start}


def test_free_pool_predicts_its_spread_and_takes_gpus_back_or_out() -> None:
    # Node a has 3 free GPUs, node b 1.
    nodes = cluster({"a": 3, "b": 1})
    pool = FreePool({node.id: node.gpus for node in nodes})
    assert (pool.span(3), pool.span(4), pool.span(5)) == (1, 2, None)
    taken = pool.take(3)
    assert taken is not None and {g.node_name for g in taken} == {"a"}
    assert (pool.total, pool.span(2), pool.span(2, plus=taken[:1])) == (1, None, 2)
    assert pool.span(3, plus=taken) == 1
    pool.give(taken)
    assert (pool.total, pool.span(3)) == (4, 1)
    pool.claim([taken[0], taken[0]])  # a GPU no longer free is not taken twice
    assert (pool.total, pool.span(3)) == (3, 2)
    again = pool.take(3)
    assert again is not None and taken[0] not in again


def test_jobs_are_placed_whole_in_fifo_order() -> None:
    result = placed(snapshot(cluster({"a": 4, "b": 4}), job(1, 2), job(2, 4), job(3, 2)))
    assert result == {1: (100, 101), 2: (200, 201, 202, 203), 3: (102, 103)}


def test_best_fit_picks_the_node_with_the_fewest_free_gpus_that_fits() -> None:
    nodes = cluster({"a": 8, "b": 4, "c": 2})
    assert placed(snapshot(nodes, job(1, 3))) == {1: (200, 201, 202)}
    assert placed(snapshot(nodes, job(1, 2))) == {1: (300, 301)}


def test_fragmented_cluster_uses_the_free_gpus_of_each_node() -> None:
    nodes = cluster({"a": 4, "b": 4}, held={"a": 3, "b": 2})
    assert placed(snapshot(nodes, job(1, 3))) == {1: (202, 203, 103)}


def test_job_larger_than_any_node_spans_the_fewest_nodes() -> None:
    nodes = cluster({"a": 4, "b": 3, "c": 1, "d": 2})
    # Largest node first, then the best fit for the rest: c (1 free) rather than b.
    assert placed(snapshot(nodes, job(1, 5))) == {1: (100, 101, 102, 103, 300)}
    # After a's 4, only b holds the remaining 3 on one node: two nodes, not three.
    assert placed(snapshot(nodes, job(1, 7))) == {1: (100, 101, 102, 103, 200, 201, 202)}


def test_job_larger_than_the_cluster_is_skipped_and_blocks_nobody() -> None:
    nodes = cluster({"a": 2, "b": 2})
    assert placed(snapshot(nodes, job(1, 5), job(2, 2))) == {2: (100, 101)}


def test_head_of_line_job_that_does_not_fit_now_blocks_later_jobs() -> None:
    nodes = cluster({"a": 4}, held={"a": 2})
    # Job 1 fits the cluster but not the 2 free GPUs: job 2 must not jump ahead of it.
    assert placed(snapshot(nodes, job(1, 3), job(2, 1))) == {}


def test_priority_runs_before_submission_order() -> None:
    nodes = cluster({"a": 2})
    result = placed(snapshot(nodes, job(1, 2), job(2, 2, priority=5)))
    assert result == {2: (100, 101)}


def test_dead_nodes_offer_no_capacity() -> None:
    nodes = cluster({"a": 4, "b": 2}, dead=frozenset({"a"}))
    assert placed(snapshot(nodes, job(1, 2))) == {1: (200, 201)}
    # Dead GPUs do not count as cluster size either: a 3-GPU job is skipped, not blocking.
    assert placed(snapshot(nodes, job(1, 3), job(2, 1))) == {2: (200,)}


def test_only_queued_jobs_are_placed() -> None:
    running = JobView(2, JobState.RUNNING, 0, 1, T0, {}, allocated_gpu_ids=(100,))
    assert placed(snapshot(cluster({"a": 2}, held={"a": 1}), running, job(3, 1))) == {3: (101,)}


def test_fixed_spb_config_passes_through() -> None:
    config = {"full_fraction": 0.5, "partial_depth": 0.25, "rotation_period": 0}
    plan = schedule(snapshot(cluster({"a": 2}), job(1, 1, spb=config), job(2, 1, spb="auto")))
    assert plan.start == (Placement(1, (100,), config), Placement(2, (101,), {}))


def test_plan_does_not_depend_on_input_order() -> None:
    nodes = cluster({"a": 4, "b": 2, "c": 3}, held={"c": 1})
    jobs = [job(1, 3), job(2, 2), job(3, 1, priority=1), job(4, 2)]
    plans = [
        schedule(ClusterSnapshot(nodes=node_order, jobs=tuple(job_order), now=T0))
        for job_order in itertools.permutations(jobs)
        for node_order in (nodes, tuple(reversed(nodes)))
    ]
    assert all(plan == plans[0] for plan in plans)
    assert [placement.job_id for placement in plans[0].start] == [3, 1, 2, 4]


def test_unknown_policy_names_the_known_ones() -> None:
    assert get_policy("fifo") is POLICIES["fifo"]
    with pytest.raises(ValueError, match="known policies are fifo"):
        get_policy("nope")
