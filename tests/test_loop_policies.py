"""The preemptive policies in the real round loop, on real databases: a preempted job is
suspended with a checkpoint, waits as `preempted`, and resumes where it stopped."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from scheduler.db import session_factory, transaction
from scheduler.dispatch import Command, SimulatedDispatcher
from scheduler.loop import SchedulerService
from scheduler.snapshot import build_snapshot
from scheduler.states import JobState
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

    loop.run_round(T0 + timedelta(seconds=8))  # the short job ends (20 iterations)
    assert state(factory, short) is JobState.SUCCEEDED
    assert state(factory, long) is JobState.RUNNING
    assert dispatcher.commands[-1] == Command("launch", long)
