"""The job state machine against a real database."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session, sessionmaker

from jigsaw.jobspec import JobSpec
from scheduler.core.states import ALLOWED, TERMINAL, IllegalTransition, JobState
from scheduler.db import make_engine, session_factory
from scheduler.migrate import upgrade
from scheduler.models.jobs import submit
from scheduler.models.states import transition
from scheduler.models.users import Principal, get_or_create_user
from scheduler.orm import Event, Job

SPEC = JobSpec(name="j", workload="digits-mlp", max_iterations=10)


@pytest.fixture(scope="module")
def factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[sessionmaker[Session]]:
    path: Path = tmp_path_factory.mktemp("states") / "states.db"
    engine: Engine = make_engine(f"sqlite:///{path}")
    upgrade(engine)
    yield session_factory(engine)
    engine.dispose()


def _new_job(session: Session) -> Job:
    user = get_or_create_user(session, "alice")
    return submit(session, SPEC, Principal("user", user.id, user.name, False))


def test_terminal_states_have_no_exit() -> None:
    for state in TERMINAL:
        assert ALLOWED[state] == frozenset()
    assert all(state in ALLOWED for state in JobState)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(targets=st.lists(st.sampled_from(list(JobState)), max_size=12))
def test_random_sequences_stay_legal_and_every_transition_is_an_event(
    factory: sessionmaker[Session], targets: list[JobState]
) -> None:
    with factory() as session, session.begin():
        job = _new_job(session)
        expected = JobState.QUEUED
        accepted = 0
        for target in targets:
            if target in ALLOWED[expected]:
                transition(session, job, target, actor="test")
                expected = target
                accepted += 1
            else:
                with pytest.raises(IllegalTransition):
                    transition(session, job, target, actor="test")
        stored = session.get(Job, job.id)
        assert stored is not None
        session.refresh(stored)
        assert stored.state == expected.value
        assert (stored.finished_at is not None) == (expected in TERMINAL)
        events = session.scalars(
            select(Event).where(Event.job_id == job.id).order_by(Event.id)
        ).all()
        # One event for the submission, one per accepted transition, forming a chain.
        assert len(events) == accepted + 1
        assert events[0].to_state == JobState.QUEUED.value
        for before, after in zip(events, events[1:], strict=False):
            assert after.from_state == before.to_state
            assert JobState(after.to_state) in ALLOWED[JobState(before.to_state)]


def test_stale_object_cannot_overwrite_newer_state(factory: sessionmaker[Session]) -> None:
    """Two sessions race: the second, holding a stale QUEUED row, must not win."""
    with factory() as session, session.begin():
        job_id = _new_job(session).id
    with factory() as first:
        stale = first.get(Job, job_id)
        assert stale is not None
        first.commit()  # end the read transaction, keep the (now stale) object
        with factory() as second, second.begin():
            fresh = second.get(Job, job_id)
            assert fresh is not None
            transition(second, fresh, JobState.CANCELLED, actor="api")
        with first.begin(), pytest.raises(IllegalTransition) as info:
            transition(first, stale, JobState.SCHEDULED, actor="scheduler")
        assert info.value.current is JobState.CANCELLED
    with factory() as session:
        assert session.scalar(select(Job.state).where(Job.id == job_id)) == "CANCELLED"
        count = session.scalar(select(func.count()).where(Event.job_id == job_id))
        assert count == 2


def test_a_resume_that_loses_a_race_to_a_relaunch_does_not_restart_the_job(
    factory: sessionmaker[Session],
) -> None:
    """A user resumes a job read as SUSPENDED that the scheduler has meanwhile put back
    to RUNNING: RUNNING -> QUEUED is an edge (the scheduler's requeue), but not one a
    resume may take, even on the compare-and-set's retry."""
    with factory() as session, session.begin():
        job = _new_job(session)
        for state in (JobState.SCHEDULED, JobState.RUNNING, JobState.SUSPENDED):
            transition(session, job, state, actor="test")
        job_id = job.id
    with factory() as api:
        stale = api.get_one(Job, job_id)
        api.commit()
        with factory() as scheduler, scheduler.begin():
            transition(scheduler, scheduler.get_one(Job, job_id), JobState.RUNNING, actor="s")
        with api.begin(), pytest.raises(IllegalTransition) as info:
            transition(api, stale, JobState.QUEUED, actor="alice", only_from={JobState.SUSPENDED})
        assert info.value.current is JobState.RUNNING
        assert "only from SUSPENDED" in str(info.value)
    with factory() as session:
        assert session.scalar(select(Job.state).where(Job.id == job_id)) == "RUNNING"
