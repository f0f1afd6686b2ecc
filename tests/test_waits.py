"""Why a waiting job waits and when it would start, as pure functions of a round."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from scheduler.core.jobmodel import JobModel
from scheduler.core.plan import Plan
from scheduler.core.quota import Quotas
from scheduler.core.snapshot import ClusterSnapshot, GPUView, JobView, NodeView
from scheduler.core.states import JobState
from scheduler.core.waits import estimated_starts, explain
from scheduler.policies import fifo

NOW = datetime(2030, 1, 1, tzinfo=UTC)


def node(holders: dict[int, int]) -> NodeView:
    return NodeView(
        1,
        "n1",
        True,
        tuple(
            GPUView(i, 1, "n1", i, "H100", 80 << 30, (holders[i],) if i in holders else ())
            for i in range(4)
        ),
    )


def job(job_id: int, workers: int, iterations: int | None, **fields: object) -> JobView:
    model = (
        None
        if iterations is None
        else JobModel(iterations_total=iterations, workers=workers, steps={workers: {1: (1.0, 0)}})
    )
    view = JobView(
        id=job_id,
        state=JobState.QUEUED,
        priority=0,
        workers=workers,
        created_at=NOW - timedelta(minutes=10 - job_id),
        model=model,
    )
    return replace(view, **fields)  # type: ignore[arg-type]


def test_fifo_estimates_each_start_from_the_ends_of_the_jobs_ahead() -> None:
    running = job(
        1, 3, 400, state=JobState.RUNNING, allocated_gpu_ids=(0, 1, 2), iterations_done=100
    )
    waiting = [job(2, 2, 50), job(3, 4, 10), job(4, 1, None), job(5, 1, 10)]
    snapshot = ClusterSnapshot((node({0: 1, 1: 1, 2: 1}),), (running, *waiting), NOW)
    plan = fifo.schedule(snapshot)
    assert plan == Plan()  # the head needs 2 GPUs, 1 is free: FIFO blocks behind it
    starts = estimated_starts(snapshot, plan, None, "fifo")
    assert starts == {
        2: NOW + timedelta(seconds=300),  # when job 1's 300 iterations left are done
        3: NOW + timedelta(seconds=350),  # when job 2 ends too, all 4 GPUs are free
        4: NOW + timedelta(seconds=360),  # job 4's end is unknown: nothing after it
    }
    reasons = explain(snapshot, plan, None, Quotas([]), "fifo")
    assert reasons[2].text == "needs 2 GPUs on 1 node(s); largest free gang is 1"
    assert reasons[5].text == "waiting behind 3 earlier job(s)"


def test_no_estimate_where_the_policy_cannot_tell() -> None:
    running = job(1, 4, 100, state=JobState.RUNNING, allocated_gpu_ids=(0, 1, 2, 3))
    snapshot = ClusterSnapshot((node({0: 1, 1: 1, 2: 1, 3: 1}),), (running, job(2, 1, 5)), NOW)
    assert estimated_starts(snapshot, Plan(), None, "srtf") == {}  # it may preempt
    unknown = replace(running, model=None)
    assert (
        estimated_starts(replace(snapshot, jobs=(unknown, job(2, 1, 5))), Plan(), None, "fifo")
        == {}
    )
