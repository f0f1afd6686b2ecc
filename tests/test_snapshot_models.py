"""The real cluster's job models: what `build_snapshot` knows of each job's speed, from
its recent iterations and its workload's SPB profile, on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, event, select
from sqlalchemy.orm import Session, sessionmaker

from jigsaw import spb
from jigsaw.jobspec import JobSpec, SPBConfig, TargetMetric
from jigsaw.spb import SPBProfile, StageProfile, config_key
from scheduler.core.snapshot import ClusterSnapshot
from scheduler.core.states import JobState
from scheduler.db import session_factory, transaction
from scheduler.dispatch import Launch, SimulatedDispatcher
from scheduler.loop import SchedulerService
from scheduler.models.jobs import submit
from scheduler.models.measured import RECENT_ITERATIONS, UNKNOWN_ITERATIONS
from scheduler.models.metrics import record
from scheduler.models.profiles import save_profile
from scheduler.models.snapshot import build_snapshot
from scheduler.models.users import Principal, get_or_create_user
from scheduler.orm import GPU, Allocation, Job, ModelProfile
from scheduler.policies import jigsaw
from tests.test_scheduler_loop import SETTINGS, T0, add_nodes

HALF = SPBConfig(full_fraction=0.5, partial_depth=0.5)
GIB = 1 << 30


@pytest.fixture
def factory(engine: Engine) -> sessionmaker[Session]:
    return session_factory(engine)


def spb_profile(compute: float = 1.0, price: float = 1.02) -> SPBProfile:
    """Four equal stages whose bottom two hold most parameters (SPB saves bytes)."""
    return SPBProfile(
        workload="digits-mlp",
        per_worker_batch=32,
        stages=tuple(
            StageProfile(
                forward_seconds=compute,
                backward_input_seconds=compute,
                backward_weight_seconds=compute,
                activation_bytes=1 << 20,
                parameter_bytes=(1 << 28) if stage < 2 else (1 << 20),
            )
            for stage in range(4)
        ),
        steps_ratio={config_key(c): price for c in jigsaw.CONFIGS},
    )


def add_job(factory: sessionmaker[Session], workers: int = 2, **fields: Any) -> int:
    fields.setdefault("max_iterations", 1000)
    spec = JobSpec(name=f"w{workers}", workload="digits-mlp", workers=workers, **fields)
    with transaction(factory) as session:
        user = get_or_create_user(session, "alice")
        return submit(session, spec, Principal("user", user.id, user.name, False)).id


def report(
    factory: sessionmaker[Session],
    job_id: int,
    iterations: range,
    step: float,
    comm: float,
    **extra: Any,
) -> None:
    """Rows as the agents report them, and the job's progress up to the last."""
    with transaction(factory) as session:
        record(
            session,
            (
                {"job_id": job_id, "iteration": i, "step_seconds": step, "comm_seconds": comm}
                | extra
                for i in iterations
            ),
        )
        job = session.get(Job, job_id)
        assert job is not None
        job.iterations_done = iterations.stop


def snapshot(factory: sessionmaker[Session]) -> ClusterSnapshot:
    with transaction(factory) as session:
        return build_snapshot(session, T0)


def test_models_from_recent_iterations_and_the_latest_profile(
    factory: sessionmaker[Session],
) -> None:
    add_nodes(factory, {"a": 4})
    with transaction(factory) as session:
        save_profile(session, spb_profile(compute=9.0), "T4")
        save_profile(session, spb_profile(compute=1.0), "H100")  # measured later: wins
    auto = add_job(factory, spb="auto")
    off = add_job(factory)
    fixed = add_job(factory, spb=HALF)
    target_only = add_job(
        factory,
        max_iterations=None,
        spb="auto",
        target_metric=TargetMetric(name="accuracy", value=0.9),
    )
    fresh = add_job(factory, spb="auto")
    # Old iterations (slower) fall outside the window of recent ones.
    report(factory, auto, range(0, 100), step=5.0, comm=4.0)
    report(
        factory,
        auto,
        range(100, 100 + RECENT_ITERATIONS),
        step=2.0,
        comm=1.5,
        peak_memory_bytes=3 * GIB,
    )
    for job_id in (off, fixed, target_only):
        report(factory, job_id, range(0, 10), step=1.0, comm=0.25)

    models = {job.id: job.model for job in snapshot(factory).jobs}
    assert models[fresh] is None  # nothing measured yet
    auto_model = models[auto]
    assert auto_model is not None
    assert auto_model.steps == {2: {1: (pytest.approx(2.0), pytest.approx(1.5))}}
    assert auto_model.memory_bytes == 3 * GIB
    assert auto_model.iterations_total == 1000
    assert auto_model.spb_profile == spb_profile(compute=1.0)
    for job_id in (off, fixed):
        model = models[job_id]
        assert model is not None and model.spb_profile is None
        assert model.memory_bytes == 80 * GIB  # unknown: fills its GPU
    target_model = models[target_only]
    assert target_model is not None and target_model.iterations_total == UNKNOWN_ITERATIONS


def test_a_job_under_spb_keeps_its_full_backprop_model(factory: sessionmaker[Session]) -> None:
    """Iterations under SPB convert back to full backprop through the profile: the model
    predicts, under that configuration, the speed that was measured."""
    add_nodes(factory, {"a": 2})
    with transaction(factory) as session:
        save_profile(session, spb_profile(), "H100")
    job_id = add_job(factory, spb="auto")
    with transaction(factory) as session:
        job = session.get(Job, job_id)
        assert job is not None
        job.state = JobState.RUNNING.value
        for rank, gpu in enumerate(session.scalars(select(GPU.id).order_by(GPU.index))):
            session.add(
                Allocation(
                    job_id=job_id, gpu_id=gpu, rank=rank, spb=spb.as_json(HALF), lease_iterations=50
                )
            )
    report(factory, job_id, range(0, 10), step=1.2, comm=0.4, spb_depth=1.0)

    model = next(job for job in snapshot(factory).jobs if job.id == job_id).model
    assert model is not None
    shape = model.shape(HALF, 2, 1)
    assert shape.step_seconds == pytest.approx(1.2)
    assert shape.sync_seconds == pytest.approx(0.4)
    assert model.alone_step_seconds > 1.2  # full backprop syncs more bytes


@contextmanager
def counted(engine: Engine) -> Iterator[list[str]]:
    statements: list[str] = []

    def count(*args: Any) -> None:
        statements.append(args[2])

    event.listen(engine, "before_cursor_execute", count)
    try:
        yield statements
    finally:
        event.remove(engine, "before_cursor_execute", count)


def test_the_snapshot_reads_the_same_number_of_queries_for_more_jobs(
    engine: Engine, factory: sessionmaker[Session]
) -> None:
    add_nodes(factory, {"a": 4})
    with transaction(factory) as session:
        save_profile(session, spb_profile(), "H100")

    def queries() -> int:
        with counted(engine) as statements:
            snapshot(factory)
        return len(statements)

    first = add_job(factory, spb="auto")
    report(factory, first, range(0, 5), step=1.0, comm=0.5)
    few = queries()
    for _ in range(4):
        job_id = add_job(factory, spb="auto")
        report(factory, job_id, range(0, 5), step=1.0, comm=0.5)
    assert queries() == few


def test_the_snapshot_says_when_the_newest_job_was_submitted_though_it_ended(
    factory: sessionmaker[Session],
) -> None:
    add_nodes(factory, {"a": 2})
    assert snapshot(factory).last_submitted_at is None  # nothing submitted yet
    older, newest = add_job(factory), add_job(factory)
    with transaction(factory) as session:
        for job_id, minutes in ((older, 90), (newest, 30)):
            job = session.get(Job, job_id)
            assert job is not None
            job.created_at = T0 - timedelta(minutes=minutes)
        ended = session.get(Job, newest)
        assert ended is not None
        ended.state = JobState.SUCCEEDED.value
    seen = snapshot(factory)
    # Only the older job is still active; the newest submission is the one that ended.
    assert [job.id for job in seen.jobs] == [older]
    assert seen.last_submitted_at == T0 - timedelta(minutes=30)


def test_jigsaw_on_the_cluster_gives_spb_only_to_auto_jobs(factory: sessionmaker[Session]) -> None:
    """Same measured speed and profile: the auto job is switched to SPB, the job whose
    spec says off is not, and the fixed one keeps its own configuration."""
    add_nodes(factory, {"a": 2, "b": 2, "c": 2})
    with transaction(factory) as session:
        save_profile(session, spb_profile(), "H100")
    quarter = SPBConfig(full_fraction=0.5, partial_depth=0.25)
    jobs = {
        "auto": add_job(factory, spb="auto"),
        "off": add_job(factory),
        "fixed": add_job(factory, spb=quarter),
    }
    for job_id in jobs.values():
        report(factory, job_id, range(0, 10), step=2.0, comm=1.5)

    plan = jigsaw.schedule(snapshot(factory))
    configs = {p.job_id: p.spb for p in plan.start}
    assert configs == {
        jobs["auto"]: spb.as_json(HALF),
        jobs["off"]: {},
        jobs["fixed"]: spb.as_json(quarter),
    }


def test_bad_measurements_leave_a_job_unpriced_not_the_round_broken(
    factory: sessionmaker[Session],
) -> None:
    add_nodes(factory, {"a": 4})
    with transaction(factory) as session:
        save_profile(session, spb_profile(), "H100")
        # A later row that does not parse is skipped: the earlier profile stands.
        session.add(ModelProfile(workload="digits-mlp", key="broken", data={"stages": 3}))
    unmeasured = add_job(factory, spb="auto")
    report(factory, unmeasured, range(0, 5), step=0.0, comm=0.0)
    measured = add_job(factory, spb="auto")
    report(factory, measured, range(0, 5), step=2.0, comm=1.5)

    models = {job.id: job.model for job in snapshot(factory).jobs}
    assert models[unmeasured] is None
    model = models[measured]
    assert model is not None and model.spb_profile == spb_profile()


def test_a_job_gets_a_priced_profile_of_its_device_and_batch_before_a_newer_one(
    factory: sessionmaker[Session],
) -> None:
    """A priced profile stored by `jigsaw profile --save` is not hidden by the unpriced
    ones new jobs measure later, and a profile of the GPU kind a job holds comes first."""
    add_nodes(factory, {"a": 1})
    priced = spb_profile(compute=1.0)
    with transaction(factory) as session:
        save_profile(session, priced, "H100")
        # Measured later by a new job at another batch: no price.
        unpriced = replace(spb_profile(compute=2.0), per_worker_batch=16, steps_ratio={})
        save_profile(session, unpriced, "H100")
        save_profile(session, spb_profile(compute=3.0), "T4")  # priced, newest, other GPU
    holding, waiting = add_job(factory, spb="auto"), add_job(factory, spb="auto")
    with transaction(factory) as session:
        gpu = session.scalars(select(GPU)).one()
        session.add(Allocation(job_id=holding, gpu_id=gpu.id, rank=0, lease_iterations=50))
    for job_id in (holding, waiting):
        report(factory, job_id, range(0, 5), step=2.0, comm=1.5)

    models = {job.id: job.model for job in snapshot(factory).jobs}
    assert models[holding] is not None and models[waiting] is not None
    assert models[holding].spb_profile == priced  # its GPU's kind, priced, its batch
    assert models[waiting].spb_profile == spb_profile(compute=3.0)  # priced, newest

    # A job measuring at the priced profile's very key keeps the price it cannot measure.
    with transaction(factory) as session:
        measured = replace(spb_profile(compute=4.0), steps_ratio={})
        save_profile(session, measured, "H100", 0.4, keep_price=True)
        stored = session.scalars(select(ModelProfile).where(ModelProfile.key == "H100/batch-32"))
        assert stored.one().data["utilization"] == 0.4
    held = {job.id: job.model for job in snapshot(factory).jobs}[holding]
    assert held is not None and held.spb_profile == spb_profile(compute=4.0)


def test_a_job_s_utilization_is_what_its_full_backprop_iterations_reported(
    factory: sessionmaker[Session],
) -> None:
    """The interference model's input on the cluster: none reported (or only a value
    outside [0, 1]) leaves it unknown, and JigSaw then never packs the job."""
    add_nodes(factory, {"a": 4})
    measured, silent, absurd = (add_job(factory, workers=1) for _ in range(3))
    report(factory, measured, range(0, 5), step=1.0, comm=0.0, utilization=0.3)
    report(factory, measured, range(5, 10), step=1.0, comm=0.0, utilization=0.5)
    report(factory, silent, range(0, 10), step=1.0, comm=0.0)
    report(factory, absurd, range(0, 10), step=1.0, comm=0.0, utilization=40.0)
    models = {job.id: job.model for job in snapshot(factory).jobs}
    assert models[measured] is not None and models[measured].utilization == pytest.approx(0.4)
    assert models[silent] is not None and models[silent].utilization is None
    assert models[absurd] is not None and models[absurd].utilization is None


def test_a_job_s_slowdown_beside_co_runners_is_measured_against_its_steps_alone(
    factory: sessionmaker[Session],
) -> None:
    """Recent iterations with another job on its GPU over its iterations alone, at the
    same backprop; none without both, or once its co-runners left its recent
    iterations."""
    add_nodes(factory, {"a": 8})
    host, alone, shared, modes, unreported, left = (add_job(factory, workers=1) for _ in range(6))
    report(factory, host, range(0, 100), step=1.0, comm=0.0, co_runners=0)
    report(factory, host, range(100, 130), step=1.5, comm=0.0, co_runners=1)
    report(factory, alone, range(0, 50), step=1.0, comm=0.0, co_runners=0)
    report(factory, shared, range(0, 50), step=1.5, comm=0.0, co_runners=2)
    report(factory, modes, range(0, 50), step=1.0, comm=0.0, co_runners=0)
    report(factory, modes, range(50, 80), step=1.6, comm=0.0, co_runners=1, spb_depth=0.5)
    report(factory, unreported, range(0, 50), step=1.0, comm=0.0)
    report(factory, unreported, range(50, 80), step=1.5, comm=0.0, co_runners=1)
    report(factory, left, range(0, 20), step=2.0, comm=0.0, co_runners=1)
    report(factory, left, range(20, 60), step=1.0, comm=0.0, co_runners=0)
    slowdowns = {job.id: job.colocated_slowdown for job in snapshot(factory).jobs}
    assert slowdowns[host] == pytest.approx(1.5)
    assert slowdowns[alone] is None and slowdowns[shared] is None
    assert slowdowns[modes] is None  # SPB's steps are not full backprop's
    assert slowdowns[unreported] is None and slowdowns[left] is None


def test_a_job_that_has_not_run_is_modelled_from_its_profile_on_the_cluster_s_gpus(
    factory: sessionmaker[Session],
) -> None:
    """A profile at the job's per-worker batch, measured on a kind of GPU the cluster has
    with utilization and peak memory, models a job before it reports: JigSaw packs two
    such jobs on one GPU in the first round. Any figure missing, nothing is assumed."""
    add_nodes(factory, {"a": 1})
    profile = replace(spb_profile(compute=0.01), steps_ratio={})
    with transaction(factory) as session:
        save_profile(session, profile, "H100", 0.3, peak_memory_bytes=2 * GIB)
        # At another batch: measured on another GPU only, and without utilization.
        other = replace(profile, per_worker_batch=64)
        save_profile(session, other, "T4", 0.3, peak_memory_bytes=GIB)
        save_profile(session, other, "H100", None, peak_memory_bytes=GIB)

    def one_worker(batch: int) -> int:
        return add_job(factory, workers=1, hyperparameters={"batch_size": batch})

    first, second, unprofiled = one_worker(32), one_worker(32), one_worker(64)

    jobs = {job.id: job for job in snapshot(factory).jobs}
    assert jobs[unprofiled].model is None
    model = jobs[first].model
    assert model is not None and model.utilization == 0.3
    # 4 stages forward and backward; the first needs no gradient of its input (data).
    assert model.steps == {1: {1: (pytest.approx(0.11), 0.0)}}
    assert model.memory_bytes == 4 * GIB  # twice the profile's peak
    plan = jigsaw.schedule(snapshot(factory))
    placed = {p.job_id: p.gpu_ids for p in plan.start}
    assert placed.keys() == {first, second} and placed[first] == placed[second]

    # What the job reports replaces the profile's figures; the time its iterations took
    # beyond the profile's passes (optimizer, data, reports) is added to the others'.
    report(factory, first, range(0, 5), step=0.5, comm=0.0, utilization=0.6)
    models = {job.id: job.model for job in snapshot(factory).jobs}
    reported, waiting = models[first], models[second]
    assert reported is not None and reported.utilization == pytest.approx(0.6)
    assert reported.steps == {1: {1: (pytest.approx(0.5), 0.0)}}
    assert waiting is not None and waiting.steps == {1: {1: (pytest.approx(0.5), 0.0)}}


@dataclass
class _Recording(SimulatedDispatcher):
    launched: list[Launch] = field(default_factory=list)

    def launch(self, launch: Launch) -> bool:
        self.launched.append(launch)
        return super().launch(launch)


def test_a_profiled_job_is_launched_capped_by_its_profile_not_the_whole_gpu(
    factory: sessionmaker[Session],
) -> None:
    """The agent sums its jobs' caps against the GPU's memory: a job launched before it
    reports must be capped by what its profile predicts, or nothing could join it."""
    add_nodes(factory, {"a": 2})
    with transaction(factory) as session:
        save_profile(session, spb_profile(compute=0.01), "H100", 0.3, peak_memory_bytes=2 * GIB)
    profiled = add_job(factory, workers=1, hyperparameters={"batch_size": 32})
    unprofiled = add_job(factory, workers=1, hyperparameters={"batch_size": 64})
    dispatcher = _Recording(iterations_per_second=10)
    loop = SchedulerService(factory, dispatcher, SETTINGS, policy_name="jigsaw")
    loop.run_round(T0)
    caps = {launch.job_id: launch.memory_bytes for launch in dispatcher.launched}
    # None: the dispatcher caps the job by its reports, the whole GPU without any.
    assert caps == {profiled: 4 * GIB, unprofiled: None}


def test_a_run_s_slowest_iteration_and_a_profiled_job_s_first_reports_do_not_decide(
    factory: sessionmaker[Session],
) -> None:
    """A run's first iteration compiles and warms caches (30-70x a small job's step on
    an H200): the slowest recent iteration is left out of a job's step, and a profiled
    job keeps its profile's figures until it has reported three iterations, its
    utilization until it reports one."""
    add_nodes(factory, {"a": 1})
    profile = replace(spb_profile(compute=0.01), steps_ratio={})
    with transaction(factory) as session:
        save_profile(session, profile, "H100", 0.3, peak_memory_bytes=2 * GIB)
    profiled = add_job(factory, workers=1, hyperparameters={"batch_size": 32})
    unprofiled = add_job(factory, workers=1, hyperparameters={"batch_size": 64})
    report(factory, profiled, range(0, 2), step=0.5, comm=0.0)
    report(factory, unprofiled, range(0, 4), step=0.2, comm=0.0)
    report(factory, unprofiled, range(4, 5), step=9.0, comm=0.0)

    models = {job.id: job.model for job in snapshot(factory).jobs}
    early, other = models[profiled], models[unprofiled]
    assert early is not None and early.steps == {1: {1: (pytest.approx(0.11), 0.0)}}
    assert early.utilization == 0.3
    assert other is not None and other.steps == {1: {1: (pytest.approx(0.2), 0.0)}}

    report(factory, profiled, range(2, 4), step=0.5, comm=0.0)
    own = {job.id: job.model for job in snapshot(factory).jobs}[profiled]
    assert own is not None and own.steps == {1: {1: (pytest.approx(0.5), 0.0)}}
    assert own.utilization == 0.3  # none reported: still the profile's
