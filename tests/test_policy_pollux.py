"""Pollux's objective as a pure policy: snapshots in, plans out; and in the simulator."""

from __future__ import annotations

import itertools
import random
from datetime import timedelta
from pathlib import Path

import pytest

from scheduler.core import shares
from scheduler.core.jobmodel import JobModel
from scheduler.core.snapshot import JobView
from scheduler.core.states import JobState
from scheduler.policies import get_policy, pollux
from scheduler.sim.engine import ClusterShape, SimOptions, Simulator
from scheduler.sim.metrics import summarize
from scheduler.sim.trace import load_workloads
from tests.test_policy_baselines import T0, nodes, snap

POLLUX = Path(__file__).resolve().parents[2] / "shared/traces/pollux"


def model(steps: dict[int, float]) -> JobModel:
    """Seconds per step by size, all on one node's worth of GPUs."""
    return JobModel(
        iterations_total=1000,
        workers=min(steps),
        steps={w: {-(-w // 4): (t, 0.0)} for w, t in steps.items()},
    )


NEAR_LINEAR = {1: 1.0, 2: 0.52, 4: 0.27}


def job(
    job_id: int,
    steps: dict[int, float],
    *,
    gpus: tuple[int, ...] = (),
    age: float = 3600.0,
    restarts: int = 0,
) -> JobView:
    return JobView(
        id=job_id,
        state=JobState.RUNNING if gpus else JobState.QUEUED,
        priority=0,
        workers=min(steps),
        created_at=T0 + timedelta(hours=1, seconds=-age),
        allocated_gpu_ids=gpus,
        restarts=restarts,
        model=model(steps),
    )


def test_registered_by_name() -> None:
    assert get_policy("pollux") is pollux.schedule


def test_the_allocation_is_the_optimum_of_every_choice() -> None:
    rng = random.Random(7)
    for _ in range(200):
        jobs = rng.randint(1, 4)
        capacity = rng.randint(0, 6)
        scores = [
            {0: 1000.0} | {w: rng.uniform(0.5, 20.0) for w in rng.sample(range(1, 5), 2)}
            for _ in range(jobs)
        ]
        counts = shares.allocate(scores, capacity)
        best = min(
            sum(s[w] for s, w in zip(scores, choice, strict=True))
            for choice in itertools.product(*(list(s) for s in scores))
            if sum(choice) <= capacity
        )
        assert sum(counts) <= capacity
        assert sum(s[w] for s, w in zip(scores, counts, strict=True)) == pytest.approx(best)


def test_every_job_runs_while_there_are_gpus_for_it() -> None:
    """Four jobs that scale almost linearly on four GPUs: one GPU each, not one job on
    all four (the power mean at p = -1 scores a job without GPUs as almost nothing)."""
    plan = pollux.schedule(snap(nodes(1, 4), *(job(i, NEAR_LINEAR) for i in (1, 2, 3, 4))))
    assert sorted(len(p.gpu_ids) for p in plan.start) == [1, 1, 1, 1]


def test_a_lone_job_takes_the_size_of_its_best_goodput() -> None:
    faster = pollux.schedule(snap(nodes(1, 4), job(1, NEAR_LINEAR)))
    assert [len(p.gpu_ids) for p in faster.start] == [4]
    slower_on_four = pollux.schedule(snap(nodes(1, 4), job(1, {1: 1.0, 2: 0.52, 4: 0.6})))
    assert [len(p.gpu_ids) for p in slower_on_four.start] == [2]


def test_a_job_that_restarted_often_for_its_age_stays_where_it_is() -> None:
    """The artifact's penalty: a move scores (age - 30 s x restarts) / (age + 30 s) of
    the speedup. Old and seldom moved, a job grows into the free GPUs; two restarts in
    its first minute and it keeps its two."""
    cluster = nodes(1, 4, holders={100: 1, 101: 1})
    grown = pollux.schedule(snap(cluster, job(1, NEAR_LINEAR, gpus=(100, 101))))
    assert grown.suspend == (1,) and [len(p.gpu_ids) for p in grown.start] == [4]
    young = job(1, NEAR_LINEAR, gpus=(100, 101), age=60.0, restarts=2)
    assert pollux.schedule(snap(cluster, young)).start == ()
    assert pollux.schedule(snap(cluster, young)).suspend == ()


def test_a_job_shrunk_for_a_newcomer_moves_and_the_rest_stay() -> None:
    cluster = nodes(2, 4, holders={100: 1, 101: 1, 102: 1, 103: 1, 200: 2, 201: 2})
    running = job(1, NEAR_LINEAR, gpus=(100, 101, 102, 103))
    kept = job(2, {2: 0.5}, gpus=(200, 201))
    plan = pollux.schedule(snap(cluster, running, kept, job(3, NEAR_LINEAR), job(4, NEAR_LINEAR)))
    placed = {p.job_id: p.gpu_ids for p in plan.start}
    assert plan.suspend == (1,) and 2 not in placed
    # Every GPU is held by one job: 1 on fewer GPUs than its four, 3 and 4 on the rest.
    held = [gpu for gpus in placed.values() for gpu in gpus]
    assert sorted(held) == sorted({100, 101, 102, 103, 202, 203}) and len(placed[1]) < 4


def test_the_simulator_runs_the_pollux_workloads_to_the_end_with_adaptive_batches() -> None:
    workload = load_workloads(POLLUX / "workloads")[2]
    result = Simulator(
        workload.jobs,
        ClusterShape.parse("16x4"),
        get_policy("pollux"),
        options=SimOptions(adaptive_batch=True),
    ).run()
    metrics = summarize(result)
    assert result.conflicts == 0
    assert metrics["jobs"] == len(workload.jobs) and metrics["rejected"] == 0
