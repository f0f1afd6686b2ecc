"""The live snapshot's model of an elastic or adaptive job: its step times at every size
it may run, fitted to the sizes it ran; its gradient noise picking an adaptive job's
batch; the measured cost of resizes; JigSaw shrinking a job to where it measured
faster. On SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker

from jigsaw.jobspec import BatchPolicy, ElasticRange, Hyperparameters
from scheduler.core.plan import Resize
from scheduler.core.states import JobState
from scheduler.db import session_factory, transaction
from scheduler.models.resizes import IN_PLACE, RESTART, record_resized
from scheduler.orm import GPU, Allocation, Job
from scheduler.policies import jigsaw
from tests.test_scheduler_loop import T0, add_nodes
from tests.test_snapshot_models import add_job, counted, report, snapshot

ELASTIC = ElasticRange(min_workers=1, max_workers=4)


@pytest.fixture
def factory(engine: Engine) -> sessionmaker[Session]:
    return session_factory(engine)


def elastic_job(factory: sessionmaker[Session], **fields: Any) -> int:
    fields.setdefault("hyperparameters", Hyperparameters(batch_size=64, learning_rate=0.1))
    return add_job(factory, workers=2, elastic=ELASTIC, **fields)


def ran(
    factory: sessionmaker[Session], job_id: int, iterations: range, workers: int, step: float
) -> None:
    report(factory, job_id, iterations, step=step, comm=step / 4, workers=workers, batch_size=64)


def resized(
    factory: sessionmaker[Session],
    job_id: int,
    seconds: float,
    mechanism: str = RESTART,
    to_workers: int = 1,
) -> None:
    details = {
        "from_workers": 2,
        "to_workers": to_workers,
        "iteration": 10,
        "seconds": seconds,
        "mechanism": mechanism,
    }
    with transaction(factory) as session:
        record_resized(session, job_id, details, actor="test", now=T0)


def test_an_elastic_job_has_every_size_measured_or_predicted(
    factory: sessionmaker[Session],
) -> None:
    add_nodes(factory, {"a": 4})
    job_id = elastic_job(factory)
    fixed = add_job(factory, workers=2)
    ran(factory, job_id, range(0, 20), workers=2, step=1.0)
    ran(factory, job_id, range(20, 40), workers=1, step=1.8)
    report(factory, fixed, range(0, 5), step=1.0, comm=0.25, workers=2, batch_size=64)
    # One iteration alone on 4; one beside another job and one under SPB say nothing
    # of the size's own speed.
    ran(factory, job_id, range(40, 41), workers=4, step=0.7)
    report(factory, job_id, range(41, 42), step=9.0, comm=0, workers=4, batch_size=64, co_runners=1)
    report(
        factory, job_id, range(42, 43), step=9.0, comm=0, workers=4, batch_size=64, spb_depth=0.5
    )

    views = {view.id: view for view in snapshot(factory).jobs}
    model = views[job_id].model
    assert model is not None
    assert model.sizes == (1, 2, 4)  # 3 does not split a batch of 64
    assert model.step_at(2, 1) == (pytest.approx(1.0), pytest.approx(0.25))
    assert model.step_at(1, 1)[0] == pytest.approx(1.8)
    assert model.step_at(4, 1)[0] == pytest.approx(0.7)
    assert views[job_id].sizes == (4, 2, 1)
    fixed_model = views[fixed].model
    assert fixed_model is not None and fixed_model.sizes == (2,)


def test_a_sizes_step_is_measured_without_its_warm_up(factory: sessionmaker[Session]) -> None:
    """A run's first iteration warms up (on an H200 75x a small job's steady step): a
    size run for one lease is charged its steady step, not a mean several times it."""
    add_nodes(factory, {"a": 4})
    job_id = elastic_job(factory)
    ran(factory, job_id, range(0, 1), workers=2, step=30.0)
    ran(factory, job_id, range(1, 20), workers=2, step=1.0)
    model = snapshot(factory).jobs[0].model
    assert model is not None
    assert model.step_at(2, 1)[0] == pytest.approx(1.0)


def test_a_size_never_run_is_predicted_from_those_that_ran(
    factory: sessionmaker[Session],
) -> None:
    add_nodes(factory, {"a": 4})
    job_id = elastic_job(factory)
    ran(factory, job_id, range(0, 20), workers=2, step=1.0)
    ran(factory, job_id, range(20, 40), workers=1, step=1.9)
    model = snapshot(factory).jobs[0].model
    assert model is not None and model.sizes == (1, 2, 4)
    # Compute halves again; synchronisation beyond two GPUs is not seen yet.
    assert 0.5 < model.step_at(4, 1)[0] < 1.0


def test_an_adaptive_job_runs_each_size_at_the_batch_its_noise_allows(
    factory: sessionmaker[Session],
) -> None:
    add_nodes(factory, {"a": 4})
    noisy = elastic_job(factory, batch=BatchPolicy(adaptive=True, min=32, max=1024))
    ran(factory, noisy, range(0, 20), workers=2, step=1.0)
    report(
        factory,
        noisy,
        range(20, 21),
        step=1.0,
        comm=0.25,
        workers=2,
        batch_size=64,
        grad_sqr=1.0,
        grad_var=500.0,
    )
    model = snapshot(factory).jobs[0].model
    assert model is not None and model.batches
    assert model.batch_at(4, 1) > 64  # much noise: a larger batch is as efficient
    # Not running: no gain of changing its batch where it is.
    assert model.batch_gain == 0.0


def test_an_adaptive_job_has_done_the_base_batch_steps_its_runtime_counted(
    factory: sessionmaker[Session],
) -> None:
    """What its `max_iterations` counts: the steps of its base batch its larger steps were
    worth (`Job.progress`), not its optimizer steps; a fixed batch's are its iterations."""
    add_nodes(factory, {"a": 2})
    adaptive = elastic_job(factory, batch=BatchPolicy(adaptive=True, min=32, max=1024))
    fixed = elastic_job(factory)
    for job_id in (adaptive, fixed):
        ran(factory, job_id, range(0, 40), workers=2, step=1.0)
    with transaction(factory) as session:
        session.get_one(Job, adaptive).progress = 130.7
    done = {job.id: job.iterations_done for job in snapshot(factory).jobs}
    assert done == {adaptive: 130, fixed: 40}


def test_a_running_adaptive_job_knows_the_gain_of_the_best_batch_over_its_own(
    factory: sessionmaker[Session],
) -> None:
    """Goodput at the batch it reported last, on the GPUs it holds, against the best
    there: much noise makes a batch of 32 a waste of the larger one's goodput; little
    noise, no gain worth the change."""
    add_nodes(factory, {"a": 2})
    job_id = elastic_job(factory, batch=BatchPolicy(adaptive=True, min=32, max=1024))
    with transaction(factory) as session:
        gpus = session.scalars(select(GPU.id).order_by(GPU.id)).all()
        session.add_all(
            Allocation(job_id=job_id, gpu_id=gpu, rank=rank, lease_iterations=100)
            for rank, gpu in enumerate(gpus)
        )
    for batch in (32, 64):  # step time grows slower than the batch: a fixed cost
        report(factory, job_id, range(batch, batch + 10), step=0.5 + batch / 128, comm=0.1,
               workers=2, batch_size=batch)  # fmt: skip
    gains = []
    for iteration, var in ((100, 500.0), (101, 0.01)):
        report(factory, job_id, range(iteration, iteration + 1), step=0.75, comm=0.1,
               workers=2, batch_size=32, grad_sqr=1.0, grad_var=var)  # fmt: skip
        model = snapshot(factory).jobs[0].model
        assert model is not None
        gains.append(model.batch_gain)
    noisy, quiet = gains
    assert noisy > 0.5 and quiet < 0.1


def test_a_job_s_resize_cost_is_its_own_else_the_cluster_s(
    factory: sessionmaker[Session],
) -> None:
    add_nodes(factory, {"a": 4})
    first, second = elastic_job(factory), elastic_job(factory)
    fixed = add_job(factory, workers=1)
    assert {view.resize_seconds for view in snapshot(factory).jobs} == {None}
    resized(factory, first, 10.0)
    resized(factory, first, 20.0)
    costs = {view.id: view.resize_seconds for view in snapshot(factory).jobs}
    assert costs == {first: 15.0, second: 15.0, fixed: None}
    resized(factory, second, 6.0)
    costs = {view.id: view.resize_seconds for view in snapshot(factory).jobs}
    assert costs == {first: 15.0, second: 6.0, fixed: None}
    # A move restarts the job: what in-place shrinks cost says nothing of it.
    resized(factory, second, 0.5, IN_PLACE)
    resized(factory, second, 0.5, IN_PLACE)
    third = elastic_job(factory)
    costs = {view.id: view.resize_seconds for view in snapshot(factory).jobs}
    assert costs == {first: 15.0, second: 6.0, third: 12.0, fixed: None}


def test_a_growth_in_place_costs_what_such_growths_measured(
    factory: sessionmaker[Session],
) -> None:
    add_nodes(factory, {"a": 4})
    first, second = elastic_job(factory), elastic_job(factory)
    resized(factory, first, 0.5, IN_PLACE)  # a shrink in place: not a growth
    resized(factory, first, 30.0, RESTART, to_workers=4)  # a growth by a restart
    assert {view.grow_seconds for view in snapshot(factory).jobs} == {None}
    resized(factory, first, 3.0, IN_PLACE, to_workers=4)
    resized(factory, second, 1.0, IN_PLACE, to_workers=3)
    costs = {view.id: (view.grow_seconds, view.resize_seconds) for view in snapshot(factory).jobs}
    assert costs == {first: (3.0, 30.0), second: (1.0, 30.0)}


def test_elastic_jobs_cost_the_snapshot_the_same_queries_however_many(
    engine: Engine, factory: sessionmaker[Session]
) -> None:
    add_nodes(factory, {"a": 4})

    def queries() -> int:
        with counted(engine) as statements:
            snapshot(factory)
        return len(statements)

    job_id = elastic_job(factory, batch=BatchPolicy(adaptive=True, min=32, max=256))
    ran(factory, job_id, range(0, 5), workers=2, step=1.0)
    few = queries()
    for _ in range(3):
        job_id = elastic_job(factory)
        ran(factory, job_id, range(0, 5), workers=2, step=1.0)
        resized(factory, job_id, 5.0)
    assert queries() == few


def test_a_job_measured_slower_on_its_gpus_than_on_fewer_is_shrunk_to_rank_0s(
    factory: sessionmaker[Session],
) -> None:
    """Fitted to what it measured, a job that ran slower on 2 GPUs than on 1 (its
    synchronisation outweighs what the second GPU computes) goes back to one: rank 0's,
    which the cluster then does in place."""
    add_nodes(factory, {"a": 4})
    job_id = elastic_job(factory, max_iterations=100_000)
    with transaction(factory) as session:
        gpus = session.scalars(select(GPU.id).order_by(GPU.id)).all()
        held = (gpus[2], gpus[1])  # rank 0 on the node's third GPU
        session.add_all(
            Allocation(job_id=job_id, gpu_id=gpu, rank=rank, lease_iterations=100)
            for rank, gpu in enumerate(held)
        )
        job = session.get(Job, job_id)
        assert job is not None
        job.state = JobState.RUNNING.value
    ran(factory, job_id, range(0, 20), workers=1, step=0.5)
    ran(factory, job_id, range(20, 40), workers=2, step=1.0)
    plan = jigsaw.schedule(snapshot(factory))
    assert plan.resize == (Resize(job_id, (held[0],)),)
    assert (plan.start, plan.suspend) == ((), ())
