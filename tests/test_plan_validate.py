"""The plan validator the loop and the simulator share: snapshots and plans in, the
applicable plan and the refused items out."""

from __future__ import annotations

from datetime import UTC, datetime

from scheduler.core.jobmodel import JobModel
from scheduler.core.plan import Placement, Plan, Reconfigure
from scheduler.core.snapshot import ClusterSnapshot, GPUView, JobView, NodeView
from scheduler.core.states import JobState
from scheduler.core.validate import START, STOP, SUSPEND, validate

T0 = datetime(2024, 1, 1, tzinfo=UTC)
GIB = 1 << 30


def node(node_id: int, holders: dict[int, tuple[int, ...]], *, alive: bool = True) -> NodeView:
    """Two 16 GiB GPUs, ids node_id * 10 + index."""
    gpus = tuple(
        GPUView(
            node_id * 10 + i,
            node_id,
            f"n{node_id}",
            i,
            "V100",
            16 * GIB,
            holders.get(node_id * 10 + i, ()),
        )
        for i in range(2)
    )
    return NodeView(node_id, f"n{node_id}", alive, gpus)


def model(memory_gib: int) -> JobModel:
    return JobModel(
        iterations_total=100, workers=1, steps={1: {1: (1.0, 0.0)}}, memory_bytes=memory_gib * GIB
    )


def job(
    job_id: int,
    state: JobState,
    gpus: tuple[int, ...] = (),
    memory_gib: int | None = 4,
    preempted: bool = False,
) -> JobView:
    return JobView(
        id=job_id,
        state=state,
        priority=0,
        workers=1,
        created_at=T0,
        allocated_gpu_ids=gpus,
        preempted=preempted,
        model=None if memory_gib is None else model(memory_gib),
    )


def snapshot(*jobs: JobView, dead: bool = False) -> ClusterSnapshot:
    holders: dict[int, tuple[int, ...]] = {}
    for view in jobs:
        for gpu in view.allocated_gpu_ids:
            holders[gpu] = (*holders.get(gpu, ()), view.id)
    return ClusterSnapshot(
        nodes=(node(1, holders), node(2, holders, alive=not dead)), jobs=jobs, now=T0
    )


def test_a_valid_plan_passes_whole() -> None:
    snap = snapshot(job(1, JobState.RUNNING, (10,)), job(2, JobState.QUEUED))
    plan = Plan(start=(Placement(2, (10,)),), reconfigure=(Reconfigure(1, {}),))
    checked = validate(plan, snap)
    assert checked.plan == plan and checked.rejected == ()


def test_memory_over_commit_is_refused_but_a_job_alone_is_not() -> None:
    snap = snapshot(
        job(1, JobState.RUNNING, (10,), memory_gib=10),
        job(2, JobState.QUEUED, memory_gib=8),
        job(3, JobState.QUEUED, memory_gib=20),
    )
    plan = Plan(start=(Placement(2, (10,)), Placement(3, (11,))))
    checked = validate(plan, snap)
    assert checked.plan.start == (Placement(3, (11,)),)
    assert [(r.action, r.job_id) for r in checked.rejected] == [(START, 2)]


def test_memory_freed_by_a_suspension_of_the_same_plan_counts() -> None:
    snap = snapshot(
        job(1, JobState.RUNNING, (10,), memory_gib=10), job(2, JobState.QUEUED, memory_gib=8)
    )
    plan = Plan(start=(Placement(2, (10,)),), suspend=(1,))
    assert validate(plan, snap).plan == plan


def test_a_job_without_a_model_takes_a_whole_gpu() -> None:
    snap = snapshot(
        job(1, JobState.RUNNING, (10,), memory_gib=None), job(2, JobState.QUEUED, memory_gib=1)
    )
    checked = validate(Plan(start=(Placement(2, (10,)),)), snap)
    assert checked.plan.start == () and checked.rejected[0].reason.startswith("GPU 10")


def test_illegal_items_are_dropped_with_their_reasons() -> None:
    snap = snapshot(
        job(1, JobState.RUNNING, (10,)),
        job(2, JobState.QUEUED),
        job(3, JobState.SUCCEEDED),
        job(4, JobState.QUEUED),
        job(5, JobState.SUSPENDED),
        dead=True,
    )
    plan = Plan(
        start=(
            Placement(1, (11,)),  # suspended by this plan: it may move
            Placement(2, (20,)),  # on a dead node
            Placement(4, (11, 11)),  # repeated GPU
            Placement(5, (11,)),  # suspended by its user: waits for them
            Placement(99, (11,)),  # unknown
        ),
        suspend=(1, 2),  # 2 is not running
        stop=(3,),  # already ended
    )
    checked = validate(plan, snap)
    assert checked.plan == Plan(start=(Placement(1, (11,)),), suspend=(1,))
    assert [(r.action, r.job_id) for r in checked.rejected] == [
        (SUSPEND, 2),
        (STOP, 3),
        (START, 2),
        (START, 4),
        (START, 5),
        (START, 99),
    ]


def test_a_job_a_policy_suspended_may_be_placed_again() -> None:
    snap = snapshot(job(5, JobState.SUSPENDED, preempted=True))
    plan = Plan(start=(Placement(5, (11,)),))
    assert validate(plan, snap).plan == plan
