"""Same code, real cluster: the snapshots the real round loop hands JigSaw, replayed
through the simulator's policy call, give the plans the loop got.

The loop runs in this process on a real database (SQLite and PostgreSQL) with the
simulated dispatcher; the test reports each running job's iterations the way agents
do (`scheduler.models.metrics.record`, the agent service's write), at the speed of its
current SPB configuration, so the snapshots carry measured job models and JigSaw
switches the `auto` jobs' SPB configuration at lease boundaries; an elastic job's at
the size it holds, so its model has every size (fitted) and JigSaw resizes it.
"""

from __future__ import annotations

import pickle
from collections import Counter
from datetime import timedelta

import pytest
from sqlalchemy import Engine, select, update
from sqlalchemy.orm import Session, sessionmaker

from jigsaw.jobspec import BatchPolicy, ElasticRange, Hyperparameters, SPBConfig
from scheduler.core.interference import Sharing
from scheduler.core.plan import Plan
from scheduler.core.snapshot import ClusterSnapshot
from scheduler.core.states import JobState
from scheduler.db import session_factory, transaction
from scheduler.dispatch import SimulatedDispatcher
from scheduler.loop import SchedulerService
from scheduler.models.metrics import record
from scheduler.models.profiles import save_profile
from scheduler.orm import Allocation, Event, Job
from scheduler.policies import POLICIES, get_policy, jigsaw, policy_params
from scheduler.policies.jigsaw import JigsawParams
from scheduler.settings import SchedulerSettings
from tests.test_scheduler_loop import T0, add_nodes
from tests.test_snapshot_models import add_job, spb_profile

GIB = 1 << 30


@pytest.fixture
def factory(engine: Engine) -> sessionmaker[Session]:
    return session_factory(engine)


def report_running(factory: sessionmaker[Session]) -> None:
    """Five iterations up to each running job's progress, as its agent reports them, at
    the size it holds: full backprop spends most of its step synchronising; SPB
    synchronises less; an elastic job computes its batch's share on each GPU."""
    with transaction(factory) as session:
        holds = session.execute(
            select(Allocation.job_id, Allocation.spb).where(Allocation.released_at.is_(None))
        ).all()
        held = dict(holds)
        workers = Counter(job_id for job_id, _ in holds)
        elastic = {
            job_id
            for job_id, spec in session.execute(select(Job.id, Job.spec))
            if spec.get("elastic")
        }
        done = dict(
            session.execute(
                select(Job.id, Job.iterations_done).where(Job.state == JobState.RUNNING.value)
            ).all()
        )
        rows = []
        for job_id, iterations in done.items():
            spb = held.get(job_id) or {}
            step, comm, depth = (1.2, 0.4, 1.0) if spb else (2.0, 1.5, None)
            if job_id in elastic:
                step, comm = 0.1 + 4.0 / workers[job_id], 0.1
            rows += [
                {
                    "job_id": job_id,
                    "iteration": i,
                    "step_seconds": step,
                    "comm_seconds": comm,
                    "peak_memory_bytes": 4 * GIB,
                    "spb_depth": depth,
                    "workers": workers[job_id],
                    "batch_size": 64,
                }
                for i in range(max(iterations - 5, 0), iterations)
            ]
        record(session, rows)


def test_replayed_snapshots_give_the_plans_of_the_real_loop(
    factory: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    add_nodes(factory, {"a": 2, "b": 2})
    with transaction(factory) as session:
        save_profile(session, spb_profile(), "H100")
    # Two jobs left to the scheduler, one with SPB off, one with a fixed configuration;
    # six GPUs asked for on four, so some wait and are placed as others end.
    quarter = SPBConfig(full_fraction=0.5, partial_depth=0.25)
    add_job(factory, max_iterations=60, spb="auto")
    add_job(factory, max_iterations=30, spb="auto")
    add_job(factory, max_iterations=20)
    add_job(factory, max_iterations=40, spb=quarter)

    loop, recorded = _recording_loop(factory, monkeypatch)
    for second in range(24):
        loop.run_round(T0 + timedelta(seconds=second))
        report_running(factory)
    with transaction(factory) as session:
        states = set(session.scalars(select(Job.state)))
    assert states == {JobState.SUCCEEDED.value}

    monkeypatch.undo()  # the replay asks for the policy as the simulator does
    replay = get_policy("jigsaw", policy_params("jigsaw", sharing=Sharing.TIME_SLICING))
    snapshots = [pickle.loads(frozen) for frozen, _ in recorded]
    assert [replay(snapshot) for snapshot in snapshots] == [plan for _, plan in recorded]

    # The plans exercise what only a job model enables: measured models, and an SPB
    # configuration chosen for an `auto` job, at its start or by reconfiguring it.
    assert any(job.model is not None for snapshot in snapshots for job in snapshot.jobs)
    chosen = [
        change.spb
        for _, plan in recorded
        for change in (*plan.reconfigure, *plan.start)
        if change.spb and change.spb != quarter.model_dump(mode="json")
    ]
    assert chosen


def test_replayed_snapshots_give_the_resizes_of_the_real_loop(
    factory: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    add_nodes(factory, {"a": 4})
    # An elastic job alone grows into the idle GPUs once its model predicts it faster
    # there; a short job arriving later takes two of them back (it shrinks).
    elastic = add_job(
        factory,
        max_iterations=100_000,
        hyperparameters=Hyperparameters(batch_size=64, learning_rate=0.1),
        elastic=ElasticRange(min_workers=1, max_workers=4),
    )
    loop, recorded = _recording_loop(factory, monkeypatch)
    for second in range(16):
        now = T0 + timedelta(seconds=second)
        if second == 8:
            # Submitted now, as the loop's clock reads (else submissions would have
            # stopped long ago, and JigSaw would pace the elastic job at its width).
            newcomer = add_job(factory, max_iterations=20)
            with transaction(factory) as session:
                session.execute(update(Job).where(Job.id == newcomer).values(created_at=now))
        loop.run_round(now)
        report_running(factory)

    monkeypatch.undo()
    replay = get_policy("jigsaw", policy_params("jigsaw", sharing=Sharing.TIME_SLICING))
    snapshots = [pickle.loads(frozen) for frozen, _ in recorded]
    assert [replay(snapshot) for snapshot in snapshots] == [plan for _, plan in recorded]

    # It grew to 4 and shrank to 2, both by a Resize, never by a suspension.
    sizes = [len(r.gpu_ids) for _, plan in recorded for r in plan.resize if r.job_id == elastic]
    assert 4 in sizes and 2 in sizes
    assert all(elastic not in plan.suspend for _, plan in recorded)
    with transaction(factory) as session:
        resized = session.scalars(
            select(Event.data).where(Event.job_id == elastic, Event.kind == "resized")
        ).all()
    assert [(d["from_workers"], d["to_workers"]) for d in resized][:2] == [(2, 4), (4, 2)]
    # The costs measured reached the snapshots the policy saw.
    assert any(job.resize_seconds is not None for s in snapshots for job in s.jobs)


def _recording_loop(
    factory: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch
) -> tuple[SchedulerService, list[tuple[bytes, Plan]]]:
    """The real loop running JigSaw, each snapshot it decided on recorded with its plan."""
    recorded: list[tuple[bytes, Plan]] = []

    def recording(snapshot: ClusterSnapshot, params: JigsawParams) -> Plan:
        # Pickled before the policy runs: the replay starts from the data alone, with
        # none of what the policy memoises on the models.
        frozen = pickle.dumps(snapshot)
        plan = jigsaw.schedule(snapshot, params)
        recorded.append((frozen, plan))
        return plan

    monkeypatch.setitem(POLICIES, "jigsaw", recording)
    monkeypatch.setenv("JIGSAW_SCHEDULER_POLICY", "jigsaw")
    settings = SchedulerSettings(
        round_seconds=0.01, lease_iterations=10, agent_timeout_seconds=3600
    )
    loop = SchedulerService(factory, SimulatedDispatcher(iterations_per_second=5), settings)
    return loop, recorded


def test_replayed_snapshots_give_the_fluid_sizes_of_the_real_loop(
    factory: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two adaptive elastic jobs of 1 GPU on 4, one a little shorter: once their models
    are measured, the fluid sum (light load) gives them 2 GPUs each by resizes where
    growth in order gives the shorter one 3."""
    add_nodes(factory, {"a": 4})
    ids = [
        add_job(
            factory,
            workers=1,
            max_iterations=iterations,
            elastic=ElasticRange(min_workers=1, max_workers=4),
            batch=BatchPolicy.model_validate({"max": 384, "adaptive": True}),
            hyperparameters=Hyperparameters(batch_size=48, learning_rate=0.1),
        )
        for iterations in (30_000, 40_000)
    ]
    with transaction(factory) as session:
        # Submitted as the loop's clock reads, so that JigSaw does not pace them.
        session.execute(update(Job).values(created_at=T0))
    loop, recorded = _recording_loop(factory, monkeypatch)
    for second in range(10):
        loop.run_round(T0 + timedelta(seconds=second))
        report_adaptive(factory, recorded)

    monkeypatch.undo()
    replay = get_policy("jigsaw", policy_params("jigsaw", sharing=Sharing.TIME_SLICING))
    snapshots = [pickle.loads(frozen) for frozen, _ in recorded]
    assert [replay(snapshot) for snapshot in snapshots] == [plan for _, plan in recorded]

    with transaction(factory) as session:
        held = Counter(
            session.scalars(select(Allocation.job_id).where(Allocation.released_at.is_(None)))
        )
    assert held == dict.fromkeys(ids, 2)
    # The round that spread them: both on one GPU with measured models, each grown to 2
    # around the GPU it held (in place on a real agent), not 3 and 1 as growth in order
    # would have them.
    spread = next(i for i, (_, plan) in enumerate(recorded) if plan.resize)
    before = {job.id: job for job in snapshots[spread].jobs}
    assert all(job.model is not None and job.model.batches for job in before.values())
    resize = recorded[spread][1].resize
    assert {r.job_id: len(r.gpu_ids) for r in resize} == dict.fromkeys(ids, 2)
    assert all(set(before[r.job_id].allocated_gpu_ids) < set(r.gpu_ids) for r in resize)
    without = get_policy(
        "jigsaw", policy_params("jigsaw", sharing=Sharing.TIME_SLICING, fluid_load=0)
    )
    resize = without(snapshots[spread]).resize
    assert {r.job_id: len(r.gpu_ids) for r in resize} == {ids[0]: 3, ids[1]: 1}


def report_adaptive(factory: sessionmaker[Session], recorded: list[tuple[bytes, Plan]]) -> None:
    """Five iterations up to each running job's progress at the size it holds and the
    batch its newest placement or resize gave it, with the gradient noise of a job whose
    best batch grows with its GPUs: a sample's compute takes 2 ms, synchronising 50 ms."""
    batch: dict[int, int] = {}
    for _, plan in recorded:
        for change in (*plan.start, *plan.resize):
            batch[change.job_id] = change.global_batch or 48
    with transaction(factory) as session:
        workers = Counter(
            session.scalars(select(Allocation.job_id).where(Allocation.released_at.is_(None)))
        )
        done = dict(
            session.execute(
                select(Job.id, Job.iterations_done).where(Job.state == JobState.RUNNING.value)
            ).all()
        )
        rows = [
            {
                "job_id": job_id,
                "iteration": i,
                "step_seconds": 0.05 + 0.002 * batch[job_id] / workers[job_id],
                "comm_seconds": 0.05,
                "workers": workers[job_id],
                "batch_size": batch[job_id],
                "grad_sqr": 1.0,
                "grad_var": 200.0,
            }
            for job_id, iterations in done.items()
            for i in range(max(iterations - 5, 0), iterations)
        ]
        record(session, rows)
