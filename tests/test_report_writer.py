"""The report writer's failure isolation and replay deduplication, on both databases.

The writer is fed directly (as the gRPC handlers do), so that the tests can hand it what
the scrubbing at the endpoint would have caught: a row the database refuses.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import Engine, func, select, update
from sqlalchemy.orm import Session, sessionmaker

from jigsaw.gpus import GpuSlot
from jigsaw.jobspec import JobSpec
from scheduler.agents.ingest import ReportWriter
from scheduler.db import session_factory, transaction
from scheduler.models.agents import register
from scheduler.models.jobs import submit
from scheduler.models.users import Principal, get_or_create_user
from scheduler.orm import Agent, IterationMetric, Job, JobLog, utcnow
from scheduler.telemetry import SchedulerTelemetry


@pytest.fixture
def factory(engine: Engine) -> sessionmaker[Session]:
    return session_factory(engine)


@pytest.fixture
def telemetry() -> SchedulerTelemetry:
    return SchedulerTelemetry(CollectorRegistry())


@pytest.fixture
def writer(factory: sessionmaker[Session], telemetry: SchedulerTelemetry) -> Iterator[ReportWriter]:
    # A long delay: everything a test queues at once lands in one batch.
    running = ReportWriter(factory, max_delay_seconds=1.0, telemetry=telemetry)
    running.start()
    yield running
    running.close()


def _job(factory: sessionmaker[Session]) -> int:
    spec = JobSpec(name="j", workload="digits-mlp", max_iterations=100)
    with transaction(factory) as session:
        user = get_or_create_user(session, "alice")
        return submit(session, spec, Principal("user", user.id, user.name, False)).id


def _agent(factory: sessionmaker[Session], name: str) -> int:
    """A registered agent whose last heartbeat is an hour old."""
    with transaction(factory) as session:
        agent_id = register(
            session, node_name=name, address="", gpus=[GpuSlot(0, "cpu", 0, True)], version="t"
        ).agent_id
        session.execute(
            update(Agent)
            .where(Agent.id == agent_id)
            .values(last_heartbeat_at=utcnow() - timedelta(hours=1))
        )
    return agent_id


def _row(iteration: int, **patch: Any) -> dict[str, Any]:
    return {"iteration": iteration, "step_seconds": 0.1, "loss": 1.0, **patch}


def _iterations(factory: sessionmaker[Session], job_id: int) -> list[int]:
    with factory() as session:
        return list(
            session.scalars(
                select(IterationMetric.iteration)
                .where(IterationMetric.job_id == job_id)
                .order_by(IterationMetric.iteration)
            )
        )


def _dropped(telemetry: SchedulerTelemetry) -> float:
    return telemetry.reports_dropped.labels("write_failed")._value.get()  # type: ignore[attr-defined]


def test_a_row_the_database_refuses_is_dropped_alone(
    factory: sessionmaker[Session], writer: ReportWriter, telemetry: SchedulerTelemetry, db_url: str
) -> None:
    """The bad row (a NOT NULL violation on both databases; on PostgreSQL also the NUL
    that took the cluster down) fails neither its own job's other reports, nor another
    job's, nor any agent's heartbeat."""
    bad_job, bystander = _job(factory), _job(factory)
    agents = [_agent(factory, "node-a"), _agent(factory, "node-b")]
    before = utcnow()
    for agent_id in agents:
        writer.heartbeat(agent_id)
    writer.metrics(bad_job, [_row(1), _row(2)])
    writer.log(bad_job, 0, "INFO", "fine")
    writer.log(bad_job, 0, "INFO", None)  # type: ignore[arg-type]
    if db_url.startswith("postgresql"):
        writer.log(bad_job, 0, "INFO", "a NUL \0 here")
        writer.metrics(bad_job, [_row(3, step_seconds=None)])
    writer.metrics(bystander, [_row(1), _row(2), _row(3)])
    writer.log(bystander, 0, "INFO", "bystander")
    writer.evaluation(bystander, {"accuracy": 0.5})
    assert writer.flush()

    assert _iterations(factory, bad_job) == [1, 2]
    assert _iterations(factory, bystander) == [1, 2, 3]
    with factory() as session:
        logs = session.execute(select(JobLog.job_id, JobLog.message).order_by(JobLog.id)).all()
        assert sorted(logs) == sorted([(bad_job, "fine"), (bystander, "bystander")])
        assert session.get_one(Job, bystander).metrics == {"accuracy": 0.5}
        assert session.get_one(Job, bystander).iterations_done == 3
        assert session.get_one(Job, bad_job).iterations_done == 2
        beats = session.scalars(select(Agent.last_heartbeat_at).where(Agent.id.in_(agents)))
        assert all(beat >= before for beat in beats)
    assert _dropped(telemetry) == (3 if db_url.startswith("postgresql") else 1)
    assert writer.rows_written == 5


def test_replayed_rows_are_kept_once_and_do_not_move_progress(
    factory: sessionmaker[Session], writer: ReportWriter
) -> None:
    job_id = _job(factory)
    writer.metrics(job_id, [_row(1), _row(2), _row(3)])
    assert writer.flush()
    # An agent restarted twice replays 2..5 twice (2 and 3 were stored before its kill).
    writer.metrics(job_id, [_row(i) for i in (2, 3, 4, 5)], replayed=True)
    writer.metrics(job_id, [_row(i) for i in (2, 3, 4, 5)], replayed=True)
    assert writer.flush()
    assert _iterations(factory, job_id) == [1, 2, 3, 4, 5]
    with factory() as session:
        assert session.get_one(Job, job_id).iterations_done == 3
        count = session.scalar(select(func.count()).select_from(IterationMetric))
        assert count == 5


def test_a_jobs_progress_moves_with_its_newest_iteration_and_never_back(
    factory: sessionmaker[Session], writer: ReportWriter
) -> None:
    """An adaptive job's records carry its progress in base-batch steps; an older
    runtime's carry none (its progress is the iteration); a job resumed from an older
    checkpoint re-reports lower iterations, which move neither."""
    adaptive, older = _job(factory), _job(factory)
    writer.metrics(adaptive, [_row(1, progress=1.5), _row(2, progress=3.25)])
    writer.metrics(older, [_row(1), _row(2), _row(3)])
    assert writer.flush()
    writer.metrics(adaptive, [_row(1, progress=1.5)])  # resumed at an older checkpoint
    assert writer.flush()
    with factory() as session:
        jobs = {job_id: session.get_one(Job, job_id) for job_id in (adaptive, older)}
        assert (jobs[adaptive].iterations_done, jobs[adaptive].progress) == (2, 3.25)
        assert (jobs[older].iterations_done, jobs[older].progress) == (3, 3.0)
        stored = session.scalars(
            select(IterationMetric.progress)
            .where(IterationMetric.job_id == adaptive)
            .order_by(IterationMetric.id)
        )
        assert list(stored) == [1.5, 3.25, 1.5]


def test_rows_are_stamped_when_they_came_not_when_their_batch_is_written(
    factory: sessionmaker[Session], writer: ReportWriter
) -> None:
    """A resize's cost is measured between two reports: in one batch of writes they
    keep the times they came at (here 0.2 s apart in a batch of 1 s)."""
    job_id = _job(factory)
    writer.metrics(job_id, [_row(1)])
    time.sleep(0.2)
    writer.metrics(job_id, [_row(2)])
    assert writer.flush()
    with factory() as session:
        first, second = session.scalars(
            select(IterationMetric.reported_at)
            .where(IterationMetric.job_id == job_id)
            .order_by(IterationMetric.iteration)
        )
    assert (second - first).total_seconds() >= 0.2
