"""SRTF, Tiresias and Gandiva time slicing as pure functions: snapshots in, plans out."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from scheduler.core.jobmodel import JobModel
from scheduler.core.plan import Placement, Plan
from scheduler.core.snapshot import ClusterSnapshot, GPUView, JobView, NodeView
from scheduler.core.states import JobState
from scheduler.policies import gandiva, get_policy, srtf, tiresias

T0 = datetime(2024, 1, 1, tzinfo=UTC)


def nodes(
    count: int, size: int, holders: dict[int, int] | None = None, memory: int = 32 << 30
) -> tuple[NodeView, ...]:
    """`count` nodes of `size` GPUs of `memory` bytes; GPU id = node * 100 + index;
    `holders` maps GPU ids to the job holding it."""
    holders = holders or {}
    return tuple(
        NodeView(
            id=n,
            name=f"n{n}",
            alive=True,
            gpus=tuple(
                GPUView(
                    id=n * 100 + i,
                    node_id=n,
                    node_name=f"n{n}",
                    index=i,
                    kind="V100",
                    memory_bytes=memory,
                    holders=(holders[n * 100 + i],) if n * 100 + i in holders else (),
                )
                for i in range(size)
            ),
        )
        for n in range(1, count + 1)
    )


def job(
    job_id: int,
    workers: int,
    *,
    state: JobState = JobState.QUEUED,
    gpus: tuple[int, ...] = (),
    attained: float = 0.0,
    held_for: float | None = None,
    iterations: int | None = None,
    step: float = 1.0,
    priority: int = 0,
) -> JobView:
    return JobView(
        id=job_id,
        state=state,
        priority=priority,
        workers=workers,
        created_at=T0 + timedelta(seconds=job_id),
        allocated_gpu_ids=gpus,
        attained_gpu_seconds=attained,
        held_since=None if held_for is None else T0 + timedelta(hours=1, seconds=-held_for),
        model=None
        if iterations is None
        else JobModel(
            iterations_total=iterations, workers=workers, steps={workers: {1: (step, 0.0)}}
        ),
    )


def snap(cluster: tuple[NodeView, ...], *jobs: JobView) -> ClusterSnapshot:
    return ClusterSnapshot(nodes=cluster, jobs=jobs, now=T0 + timedelta(hours=1))


def test_registered_by_name() -> None:
    assert get_policy("srtf") is srtf.schedule
    assert get_policy("tiresias") is tiresias.schedule
    assert get_policy("gandiva") is gandiva.schedule


def test_srtf_preempts_a_longer_running_job_for_a_shorter_arrival() -> None:
    long = job(1, 2, state=JobState.RUNNING, gpus=(100, 101), iterations=10_000)
    short = job(2, 2, iterations=100)
    plan = srtf.schedule(snap(nodes(1, 2, {100: 1, 101: 1}), long, short))
    assert plan == Plan(start=(Placement(2, (100, 101)),), suspend=(1,))


def test_srtf_orders_by_time_not_iterations_when_speeds_are_known() -> None:
    # 1,000 iterations of 0.1 s finish before 500 iterations of 1 s.
    fast = job(1, 1, iterations=1000, step=0.1)
    slow = job(2, 1, iterations=500, step=1.0)
    plan = srtf.schedule(snap(nodes(1, 1), slow, fast))
    assert [p.job_id for p in plan.start] == [1]
    assert plan.suspend == ()


def test_srtf_backfills_around_a_job_that_does_not_fit() -> None:
    # The shortest job needs 4 GPUs and only 3 are there: the next ones still run.
    plan = srtf.schedule(
        snap(
            nodes(1, 3),
            job(1, 4, iterations=10),
            job(2, 2, iterations=20),
            job(3, 1, iterations=30),
        )
    )
    assert sorted(p.job_id for p in plan.start) == [2, 3]


def test_srtf_never_places_a_job_larger_than_the_cluster() -> None:
    plan = srtf.schedule(snap(nodes(2, 4), job(1, 9, iterations=1), job(2, 8, iterations=5)))
    assert [p.job_id for p in plan.start] == [2]


def test_tiresias_queues_by_attained_gpu_time_then_arrival() -> None:
    hours = 3600.0
    # Job 1 arrived first but crossed the 16 GPU-hour threshold: the new arrival (queue
    # 0) preempts it; job 3, also below the threshold but later than 2, waits.
    veteran = job(1, 4, state=JobState.RUNNING, gpus=(100, 101, 102, 103), attained=17 * hours)
    newcomer = job(2, 4)
    later = job(3, 4)
    plan = tiresias.schedule(
        snap(nodes(1, 4, dict.fromkeys((100, 101, 102, 103), 1)), veteran, newcomer, later)
    )
    assert plan == Plan(start=(Placement(2, (100, 101, 102, 103)),), suspend=(1,))
    assert tiresias.queue_of(veteran, tiresias.QUEUE_THRESHOLDS_GPU_SECONDS) == 1
    assert tiresias.queue_of(newcomer, tiresias.QUEUE_THRESHOLDS_GPU_SECONDS) == 0


def test_tiresias_does_not_preempt_within_a_queue() -> None:
    # Both below the threshold: the earlier arrival keeps running however much more
    # service it has had (discretized LAS, not plain LAS).
    running = job(1, 2, state=JobState.RUNNING, gpus=(100, 101), attained=10 * 3600.0)
    waiting = job(2, 2)
    plan = tiresias.schedule(snap(nodes(1, 2, {100: 1, 101: 1}), running, waiting))
    assert plan == Plan()


def test_tiresias_resumes_a_preempted_job_but_not_one_a_user_suspended() -> None:
    preempted = JobView(
        id=1,
        state=JobState.SUSPENDED,
        priority=0,
        workers=1,
        created_at=T0,
        preempted=True,
    )
    user_paused = JobView(id=2, state=JobState.SUSPENDED, priority=0, workers=1, created_at=T0)
    plan = tiresias.schedule(snap(nodes(1, 2), preempted, user_paused))
    assert [p.job_id for p in plan.start] == [1]


def test_priority_goes_before_every_queue() -> None:
    low = job(1, 1, state=JobState.RUNNING, gpus=(100,))
    high = job(2, 1, priority=5, attained=100 * 3600.0)
    plan = tiresias.schedule(snap(nodes(1, 1, {100: 1}), low, high))
    assert plan == Plan(start=(Placement(2, (100,)),), suspend=(1,))


def test_gandiva_keeps_a_job_within_its_quantum_then_rotates() -> None:
    cluster = nodes(1, 1, {100: 1})
    fresh = job(1, 1, state=JobState.RUNNING, gpus=(100,), held_for=60, attained=60)
    waiting = job(2, 1)
    assert gandiva.schedule(snap(cluster, fresh, waiting)) == Plan()
    expired = job(1, 1, state=JobState.RUNNING, gpus=(100,), held_for=700, attained=700)
    plan = gandiva.schedule(snap(cluster, expired, waiting))
    assert plan == Plan(start=(Placement(2, (100,)),), suspend=(1,))


def test_gandiva_gives_the_turn_to_the_job_that_had_least_time() -> None:
    cluster = nodes(1, 2)
    a = job(1, 2, attained=2000.0)  # 1,000 s per GPU
    b = job(2, 1, attained=1500.0)  # 1,500 s per GPU
    c = job(3, 1, attained=1200.0)
    plan = gandiva.schedule(snap(cluster, a, b, c))
    assert [p.job_id for p in plan.start] == [1]


def test_preemptive_placement_keeps_running_jobs_where_they_are() -> None:
    # Job 1 keeps GPUs 100-101; job 2 goes to the other node whole, not split.
    running = job(1, 2, state=JobState.RUNNING, gpus=(100, 101))
    plan = tiresias.schedule(snap(nodes(2, 4, {100: 1, 101: 1}), running, job(2, 4)))
    assert plan == Plan(start=(Placement(2, (200, 201, 202, 203)),))
