"""The preemptive policies in the real round loop, on real databases: a preempted job is
suspended with a checkpoint, waits as `preempted`, and resumes where it stopped."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from scheduler.core.plan import Plan
from scheduler.core.snapshot import ClusterSnapshot
from scheduler.core.states import JobState
from scheduler.db import session_factory, transaction
from scheduler.dispatch import Command, SimulatedDispatcher
from scheduler.loop import SchedulerService
from scheduler.models.snapshot import build_snapshot
from scheduler.policies import get_policy
from scheduler.sim.engine import EPOCH, ClusterShape, SimOptions, Simulator
from scheduler.sim.trace import load_workload
from tests.test_scheduler_loop import SETTINGS, T0, add_job, add_nodes, held_gpus, state


@pytest.fixture
def factory(engine: Engine) -> sessionmaker[Session]:
    return session_factory(engine)


@pytest.mark.parametrize("policy", ["srtf", "jigsaw"])
def test_a_shorter_job_preempts_and_the_preempted_one_resumes(
    factory: sessionmaker[Session], policy: str
) -> None:
    add_nodes(factory, {"a": 2})
    dispatcher = SimulatedDispatcher(iterations_per_second=10)
    loop = SchedulerService(factory, dispatcher, SETTINGS, policy)
    long = add_job(factory, 2, max_iterations=1000)
    loop.run_round(T0)
    assert state(factory, long) is JobState.RUNNING

    short = add_job(factory, 2, max_iterations=20)
    loop.run_round(T0 + timedelta(seconds=5))
    assert state(factory, long) is JobState.SUSPENDED
    assert held_gpus(factory, short) == [("a", 0), ("a", 1)]
    assert Command("suspend", long) in dispatcher.commands
    with transaction(factory) as session:
        snapshot = build_snapshot(session, T0 + timedelta(seconds=6))
    waiting = next(job for job in snapshot.jobs if job.id == long)
    # Preempted by the policy (not paused by a user): waiting to be placed again, with
    # 2 GPUs x 5 s of service attained.
    assert waiting.preempted and waiting.waiting
    assert waiting.attained_gpu_seconds == pytest.approx(10.0)
    assert waiting.iterations_done == 50
    assert waiting.restarts == 0  # launched once so far

    loop.run_round(T0 + timedelta(seconds=8))  # the short job ends (20 iterations)
    assert state(factory, short) is JobState.SUCCEEDED
    assert state(factory, long) is JobState.RUNNING
    assert dispatcher.commands[-1] == Command("launch", long)
    with transaction(factory) as session:
        snapshot = build_snapshot(session, T0 + timedelta(seconds=9))
    assert next(job for job in snapshot.jobs if job.id == long).restarts == 1


def test_pollux_shares_the_gpus_among_the_jobs_in_the_real_loop(
    factory: sessionmaker[Session],
) -> None:
    """Two 1-GPU jobs and a 2-GPU one on two GPUs, a minute after they were submitted:
    the first two each get one (a job without GPUs scores almost nothing); when the
    first ends, the wide one waits for the second rather than displace it (starting it
    would score its speedup at (60 s - 0) / (60 s + 30 s), keeping the second scores
    the second's whole)."""
    add_nodes(factory, {"a": 2})
    dispatcher = SimulatedDispatcher(iterations_per_second=10)
    loop = SchedulerService(factory, dispatcher, SETTINGS, "pollux")
    first, second = add_job(factory, 1, max_iterations=20), add_job(factory, 1, max_iterations=80)
    wide = add_job(factory, 2, max_iterations=20)
    start = datetime.now(UTC) + timedelta(minutes=1)
    result = loop.run_round(start)
    assert (result.started, result.conflicts) == (2, 0)
    assert [state(factory, job) for job in (first, second, wide)] == [
        JobState.RUNNING,
        JobState.RUNNING,
        JobState.QUEUED,
    ]
    placed: list[tuple[int, JobState, JobState]] = []  # when the wide one started
    for offset in range(1, 10):  # the first ends at 2 s, the second at 8 s
        loop.run_round(start + timedelta(seconds=offset))
        if not placed and held_gpus(factory, wide):
            placed.append((offset, state(factory, first), state(factory, second)))
    assert placed == [(8, JobState.SUCCEEDED, JobState.SUCCEEDED)]


def test_the_simulator_decides_what_the_real_loop_decides(
    factory: sessionmaker[Session], tmp_path: Path
) -> None:
    """The same jobs through the real loop (database, simulated dispatcher) and through
    the simulator: the same jobs start and are suspended at the same times."""
    # a: 2 GPUs x 30 iterations; b, c: 1 GPU x 10; d arrives at 2 s, 1 GPU x 5. Every job
    # trains 10 iterations per second; rounds every second.
    specs = [("a", 0, 2, 30), ("b", 0, 1, 10), ("c", 0, 1, 10), ("d", 2, 1, 5)]

    add_nodes(factory, {"n": 2})
    dispatcher = SimulatedDispatcher(iterations_per_second=10)
    loop = SchedulerService(factory, dispatcher, SETTINGS, "srtf")
    real: dict[int, tuple[list[int], list[int]]] = {}
    for second in range(6):
        for _, submit_at, workers, iterations in specs:
            if submit_at == second:
                add_job(factory, workers, max_iterations=iterations)
        result = loop.run_round(T0 + timedelta(seconds=second))
        started = sorted(d.job_id for d in result.decisions if d.kind == "lease" and d.job_id)
        suspended = sorted(d.job_id for d in result.decisions if d.kind == "suspend" and d.job_id)
        if started or suspended:
            real[second] = (started, suspended)

    rows = "".join(f"{n},{t},{w},{i},0.1\n" for n, t, w, i in specs)
    path = tmp_path / "jobs.csv"
    path.write_text("name,submit_seconds,workers,iterations,step_seconds\n" + rows)
    simulated: dict[int, tuple[list[int], list[int]]] = {}
    srtf = get_policy("srtf")

    def recording(snapshot: ClusterSnapshot) -> Plan:
        plan = srtf(snapshot)
        if plan.start or plan.suspend:
            second = round((snapshot.now - EPOCH).total_seconds())
            simulated[second] = (sorted(p.job_id for p in plan.start), sorted(plan.suspend))
        return plan

    options = SimOptions(round_seconds=1.0, restart_seconds=0.0)
    Simulator(load_workload(path).jobs, ClusterShape.parse("1x2"), recording, options=options).run()

    # b and c first (shortest), then a; d preempts a at 2 s, a resumes at 3 s.
    assert real == {0: ([2, 3], []), 1: ([1], []), 2: ([4], [1]), 3: ([1], [])}
    assert simulated == real
