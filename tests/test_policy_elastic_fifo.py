"""The FIFO policy that resizes elastic jobs, as a pure function: snapshots in, plans out."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from jigsaw.jobspec import JobSpec
from scheduler.core.plan import Placement, Resize
from scheduler.core.snapshot import ClusterSnapshot, GPUView, JobView, NodeView
from scheduler.core.states import JobState
from scheduler.policies import get_policy
from scheduler.policies.elastic_fifo import schedule, sizes
from tests.test_policy_fifo import T0, job


def _spec(workers: int, low: int, high: int, batch: int = 64) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "e",
            "workload": "digits-mlp",
            "workers": workers,
            "max_iterations": 10,
            "hyperparameters": {"batch_size": batch},
            "elastic": {"min_workers": low, "max_workers": high},
        }
    )


def _elastic(job_id: int, workers: int, low: int, high: int, **fields: Any) -> JobView:
    return replace(job(job_id, workers), sizes=_spec(workers, low, high).worker_counts(), **fields)


def _node(size: int, holders: dict[int, int]) -> NodeView:
    """One node of `size` GPUs (ids 100, 101, ...); `holders` maps GPU index -> job."""
    gpus = tuple(
        GPUView(
            id=100 + index,
            node_id=1,
            node_name="n",
            index=index,
            kind="H100",
            memory_bytes=80 << 30,
            holders=(holders[index],) if index in holders else (),
        )
        for index in range(size)
    )
    return NodeView(id=1, name="n", alive=True, gpus=gpus)


def _running(view: JobView, gpu_ids: tuple[int, ...]) -> JobView:
    return replace(view, state=JobState.RUNNING, allocated_gpu_ids=gpu_ids)


def test_it_is_registered_and_sizes_only_where_the_batch_splits_exactly() -> None:
    assert get_policy("fifo-elastic") is schedule
    assert sizes(_elastic(1, 4, 1, 8)) == [8, 4, 2, 1]  # 64 over 3, 5, 6, 7: no
    assert sizes(job(2, 3)) == [3]  # not elastic


def test_a_waiting_job_shrinks_the_newest_elastic_job_to_what_it_needs() -> None:
    old = _running(_elastic(1, 2, 1, 2), (100, 101))
    new = _running(_elastic(2, 2, 1, 2), (102, 103))
    waiting = job(3, 1)
    node = _node(4, {0: 1, 1: 1, 2: 2, 3: 2})
    plan = schedule(ClusterSnapshot(nodes=(node,), jobs=(old, new, waiting), now=T0))
    assert plan.start == ()
    assert plan.resize == (Resize(2, (102,)),)


def test_an_elastic_job_starts_narrower_when_that_is_what_is_free() -> None:
    node = _node(4, {0: 9, 1: 9, 2: 9})
    plan = schedule(ClusterSnapshot(nodes=(node,), jobs=(_elastic(1, 4, 1, 4),), now=T0))
    assert plan.start == (Placement(1, (103,)),)


def test_idle_gpus_grow_running_elastic_jobs_only_while_nothing_waits() -> None:
    running = _running(_elastic(1, 1, 1, 4), (100,))
    node = _node(4, {0: 1})
    plan = schedule(ClusterSnapshot(nodes=(node,), jobs=(running,), now=T0))
    assert plan.resize == (Resize(1, (100, 101, 102, 103)),)
    # A job that cannot start (it needs more than is free) keeps the GPUs idle for it.
    blocked = job(2, 4)
    plan = schedule(ClusterSnapshot(nodes=(node,), jobs=(running, blocked), now=T0))
    assert plan.resize == ()
