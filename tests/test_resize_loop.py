"""A plan's Resize through the real loop and database (simulated dispatcher): the job
checkpoints at its boundary, is relaunched on the new gang with a `resized` event, and
resizes that cannot be done are refused; a shrink to some of a one-node gang's GPUs is
asked in place and its SHRUNK report frees the GPUs left, a growth onto free GPUs of its
node holds them from the ask; a resize a failed-over leader
forgot is requeued, not stranded."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, select, update
from sqlalchemy.orm import Session, sessionmaker

from jigsaw.jobspec import JobSpec
from scheduler.core.plan import Plan, Resize
from scheduler.core.rounds import RoundResult
from scheduler.core.snapshot import ClusterSnapshot
from scheduler.core.states import JobState, SuspendedBy
from scheduler.db import session_factory, transaction
from scheduler.dispatch import (
    Command,
    Launch,
    Report,
    RunOutcome,
    SimulatedDispatcher,
    Worker,
)
from scheduler.loop import SchedulerService
from scheduler.models.jobs import submit
from scheduler.models.users import Principal, get_or_create_user
from scheduler.orm import GPU, Allocation, IterationMetric, Job
from scheduler.policies import POLICIES, fifo
from scheduler.resize import in_place
from scheduler.settings import SchedulerSettings
from tests.test_scheduler_loop import SETTINGS, T0, add_nodes, events, held_gpus, state


@pytest.fixture
def factory(engine: Engine) -> sessionmaker[Session]:
    return session_factory(engine)


def _elastic_job(factory: sessionmaker[Session], workers: int = 2, **fields: dict[str, Any]) -> int:
    spec = JobSpec.model_validate(
        {
            "name": "e",
            "workload": "digits-mlp",
            "workers": workers,
            "max_iterations": 1000,
            "elastic": {"min_workers": 1, "max_workers": 2},
            **fields,
        }
    )
    with transaction(factory) as session:
        user = get_or_create_user(session, "alice")
        return submit(session, spec, Principal("user", user.id, user.name, False)).id


def _gpu_ids(factory: sessionmaker[Session]) -> list[int]:
    with factory() as session:
        return list(session.scalars(select(GPU.id).order_by(GPU.id)))


def _resizing(monkeypatch: pytest.MonkeyPatch) -> list[Resize]:
    """Installs policy "resizing": FIFO's placements and the resizes the returned list
    holds each round (the test fills it)."""
    wanted: list[Resize] = []

    def resizing(snapshot: ClusterSnapshot) -> Plan:
        return Plan(start=fifo.schedule(snapshot).start, resize=tuple(wanted))

    monkeypatch.setitem(POLICIES, "resizing", resizing)
    return wanted


def _started_on_node_a(
    factory: sessionmaker[Session],
    monkeypatch: pytest.MonkeyPatch,
    gpus: int,
    dispatcher: SimulatedDispatcher,
    settings: SchedulerSettings = SETTINGS,
    **fields: dict[str, Any],
) -> tuple[int, list[Resize], SchedulerService]:
    """A 2-worker elastic job (its spec's `fields` added) started on node "a" (of `gpus`
    GPUs) by a loop under policy "resizing": its id, the resizes the policy asks
    (`_resizing`) and the loop."""
    add_nodes(factory, {"a": gpus})
    job_id = _elastic_job(factory, **fields)
    wanted = _resizing(monkeypatch)
    loop = SchedulerService(factory, dispatcher, settings, policy_name="resizing")
    loop.run_round(T0)
    assert held_gpus(factory, job_id) == [("a", 0), ("a", 1)]
    return job_id, wanted, loop


def test_a_resize_checkpoints_relaunches_on_the_new_gang_and_records_its_cost(
    factory: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    dispatcher = SimulatedDispatcher(iterations_per_second=10)
    job_id, wanted, loop = _started_on_node_a(factory, monkeypatch, 2, dispatcher)
    first_gpu = _gpu_ids(factory)[0]

    wanted[:] = [Resize(job_id, (first_gpu, first_gpu)), Resize(job_id, (first_gpu,) * 3)]
    refused = loop.run_round(T0 + timedelta(seconds=1))
    assert refused.conflicts == 2  # a GPU twice; 3 workers is past max_workers
    wanted[:] = [Resize(job_id, (first_gpu,))]
    asked = loop.run_round(T0 + timedelta(seconds=2))
    assert [d.kind for d in asked.decisions] == ["resize"]
    assert dispatcher.commands[-1] == Command("suspend", job_id)
    # Still RUNNING on both GPUs until its processes have checkpointed and gone.
    assert state(factory, job_id) is JobState.RUNNING
    assert len(held_gpus(factory, job_id)) == 2

    # The boundary's report, and the new gang's first, as agents would send them.
    with transaction(factory) as session:
        session.add(IterationMetric(job_id=job_id, iteration=20, step_seconds=0.1,
                                    reported_at=T0 + timedelta(seconds=3)))  # fmt: skip
        session.add(IterationMetric(job_id=job_id, iteration=21, step_seconds=0.1,
                                    reported_at=T0 + timedelta(seconds=5.5)))  # fmt: skip
    wanted.clear()
    relaunched = loop.run_round(T0 + timedelta(seconds=3))
    assert relaunched.started == 1
    assert held_gpus(factory, job_id) == [("a", 0)]
    assert state(factory, job_id) is JobState.RUNNING
    assert dispatcher.commands[-1] == Command("launch", job_id)
    with factory() as session:
        boundary = session.get_one(Job, job_id).iterations_done
    assert boundary == 20  # 2 s at 10 iterations a second before the suspend

    # Both reports are in when it relaunches here: measured in the same round.
    [event] = events(factory, "resized")
    assert event.data == {
        "from_workers": 2,
        "to_workers": 1,
        "iteration": 20,
        "seconds": 2.5,
        "global_batch": None,
        "mechanism": "checkpoint-restart",
    }
    assert [d.kind for d in relaunched.decisions] == ["lease", "resized"]
    loop.run_round(T0 + timedelta(seconds=6))
    assert len(events(factory, "resized")) == 1  # once


class Shrinking(SimulatedDispatcher):
    """Takes in-place shrinks; the test reports them done, as an agent would."""

    def __init__(self) -> None:
        super().__init__(iterations_per_second=10)
        self.shrinks: list[Launch] = []
        self.pending: list[Report] = []

    def resize_in_place(self, launch: Launch) -> bool:
        self.shrinks.append(launch)
        return True

    def poll(self, now: datetime) -> list[Report]:
        reports, self.pending = [*super().poll(now), *self.pending], []
        return reports


def test_a_shrink_on_one_node_is_asked_in_place_and_its_report_frees_the_gpus_left(
    factory: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    dispatcher = Shrinking()
    job_id, wanted, loop = _started_on_node_a(factory, monkeypatch, 3, dispatcher)
    gpus = _gpu_ids(factory)
    wanted[:] = [Resize(job_id, (gpus[0],))]
    asked = loop.run_round(T0 + timedelta(seconds=2))
    [decision] = asked.decisions
    assert (decision.kind, decision.detail["mechanism"]) == ("resize", "in-place")
    [launch] = dispatcher.shrinks
    assert [(w.rank, w.gpu_index) for w in launch.workers] == [(0, 0)]
    assert (launch.attempt, launch.start_iteration) == (1, 20)
    assert Command("suspend", job_id) not in dispatcher.commands
    assert len(held_gpus(factory, job_id)) == 2  # until the agent says it shrank

    wanted.clear()
    dispatcher.pending.append(Report(job_id, 30, RunOutcome.SHRUNK, "shrank", node="a", ranks=(0,)))
    with transaction(factory) as session:
        for iteration, seconds in ((30, 4.0), (31, 4.5)):
            session.add(IterationMetric(job_id=job_id, iteration=iteration, step_seconds=0.1,
                                        reported_at=T0 + timedelta(seconds=seconds)))  # fmt: skip
    shrunk = loop.run_round(T0 + timedelta(seconds=5))
    assert state(factory, job_id) is JobState.RUNNING
    assert held_gpus(factory, job_id) == [("a", 0)]
    [event] = events(factory, "resized")
    assert event.data == {
        "from_workers": 2,
        "to_workers": 1,
        "iteration": 30,
        "seconds": 0.5,
        "global_batch": None,
        "mechanism": "in-place",
    }
    assert event.message == "resized from 2 to 1 GPU(s) at iteration 30 in 0.50 s (in place)"
    assert "resized" in [d.kind for d in shrunk.decisions]
    # A report of GPUs it does not hold changes nothing.
    dispatcher.pending.append(Report(job_id, 40, RunOutcome.SHRUNK, "shrank", node="a", ranks=(2,)))
    loop.run_round(T0 + timedelta(seconds=6))
    assert held_gpus(factory, job_id) == [("a", 0)]


def _grown_to_both_gpus(
    factory: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch, jobs: int
) -> tuple[Shrinking, list[int], RoundResult, SchedulerService, list[Resize]]:
    """`jobs` one-GPU elastic jobs placed on node "a" of 2 GPUs, then the first asked to
    grow onto both: the dispatcher, the jobs, the round's decisions, the loop and the
    resizes the policy asks."""
    dispatcher = Shrinking()
    add_nodes(factory, {"a": 2})
    ids = [_elastic_job(factory, workers=1) for _ in range(jobs)]
    wanted = _resizing(monkeypatch)
    loop = SchedulerService(factory, dispatcher, SETTINGS, policy_name="resizing")
    loop.run_round(T0)
    assert held_gpus(factory, ids[0]) == [("a", 0)]
    wanted[:] = [Resize(ids[0], tuple(_gpu_ids(factory)))]
    return dispatcher, ids, loop.run_round(T0 + timedelta(seconds=2)), loop, wanted


def test_a_growth_on_its_node_is_asked_in_place_holding_the_new_gpus_from_the_ask(
    factory: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    dispatcher, [job_id], asked, loop, wanted = _grown_to_both_gpus(factory, monkeypatch, 1)
    [decision] = asked.decisions
    assert (decision.kind, decision.detail["mechanism"]) == ("resize", "in-place")
    [launch] = dispatcher.shrinks
    assert [(w.rank, w.gpu_index) for w in launch.workers] == [(0, 0), (1, 1)]
    # Its new GPU is its own at once: no other job is placed there meanwhile.
    assert held_gpus(factory, job_id) == [("a", 0), ("a", 1)]
    with factory() as session:
        ranks = session.execute(
            select(Allocation.rank, Allocation.attempt)
            .where(Allocation.job_id == job_id, Allocation.released_at.is_(None))
            .order_by(Allocation.rank)
        ).all()
    assert [tuple(row) for row in ranks] == [(0, 1), (1, 1)]

    wanted.clear()
    dispatcher.pending.append(Report(job_id, 30, RunOutcome.SHRUNK, "grew", node="a", ranks=(0, 1)))
    with transaction(factory) as session:
        for iteration, seconds in ((30, 4.0), (31, 5.0)):
            session.add(IterationMetric(job_id=job_id, iteration=iteration, step_seconds=0.1,
                                        reported_at=T0 + timedelta(seconds=seconds)))  # fmt: skip
    loop.run_round(T0 + timedelta(seconds=5))
    assert held_gpus(factory, job_id) == [("a", 0), ("a", 1)]
    [event] = events(factory, "resized")
    assert (event.data["from_workers"], event.data["to_workers"]) == (1, 2)
    assert (event.data["mechanism"], event.data["seconds"]) == ("in-place", 1.0)


def test_a_growth_onto_a_gpu_another_job_holds_is_a_restart(
    factory: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    dispatcher, [job_id, other], asked, _, _ = _grown_to_both_gpus(factory, monkeypatch, 2)
    assert held_gpus(factory, other) == [("a", 1)]
    [decision] = asked.decisions
    assert decision.detail["mechanism"] == "checkpoint-restart"
    assert dispatcher.shrinks == [] and dispatcher.commands[-1] == Command("suspend", job_id)
    assert held_gpus(factory, job_id) == [("a", 0)]


def test_an_adaptive_jobs_rebatch_is_asked_in_place_once_until_the_new_batch_reports(
    factory: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    dispatcher = Shrinking()
    batch = {"min": 32, "max": 256, "adaptive": True}
    job_id, wanted, loop = _started_on_node_a(factory, monkeypatch, 2, dispatcher, batch=batch)
    gpus = _gpu_ids(factory)[:2]
    wanted[:] = [Resize(job_id, tuple(gpus), 128)]
    [decision] = loop.run_round(T0 + timedelta(seconds=2)).decisions
    assert (decision.kind, decision.detail["mechanism"]) == ("resize", "in-place")
    [launch] = dispatcher.shrinks
    assert [(w.rank, w.gpu_index) for w in launch.workers] == [(0, 0), (1, 1)]
    assert launch.global_batch == 128
    dispatcher.pending.append(
        Report(job_id, 30, RunOutcome.SHRUNK, "rebatched", node="a", ranks=(0, 1))
    )
    loop.run_round(T0 + timedelta(seconds=3))
    assert held_gpus(factory, job_id) == [("a", 0), ("a", 1)]
    # Asked again before the job reports past its boundary (it still reports the old
    # batch): not sent twice.
    loop.run_round(T0 + timedelta(seconds=4))
    assert len(dispatcher.shrinks) == 1
    with transaction(factory) as session:
        for iteration, seconds in ((30, 2.5), (31, 4.6)):
            session.add(IterationMetric(job_id=job_id, iteration=iteration, step_seconds=0.1,
                                        reported_at=T0 + timedelta(seconds=seconds)))  # fmt: skip
    wanted.clear()
    loop.run_round(T0 + timedelta(seconds=5))
    [event] = events(factory, "resized")
    assert event.data == {
        "from_workers": 2,
        "to_workers": 2,
        "iteration": 30,
        "seconds": pytest.approx(2.1),
        "global_batch": 128,
        "mechanism": "in-place",
    }


def test_with_in_place_off_a_shrink_is_a_restart(
    factory: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    dispatcher = Shrinking()
    settings = SETTINGS.model_copy(update={"resize_in_place": False})
    job_id, wanted, loop = _started_on_node_a(factory, monkeypatch, 2, dispatcher, settings)
    wanted[:] = [Resize(job_id, (_gpu_ids(factory)[0],))]
    [decision] = loop.run_round(T0 + timedelta(seconds=2)).decisions
    assert decision.detail["mechanism"] == "checkpoint-restart"
    assert dispatcher.shrinks == [] and dispatcher.commands[-1] == Command("suspend", job_id)


def _worker(rank: int, gpu_id: int, node: str = "a") -> Worker:
    return Worker(rank, gpu_id, 1 if node == "a" else 2, node, gpu_id % 10)


@pytest.mark.parametrize(
    ("gang", "gpu_ids", "smaller"),
    [
        # Rank 3's GPU kept with rank 0's: renumbered 1, the ranks' order kept.
        ((1, 2, 3, 4), (4, 1), ((0, 1), (1, 4))),
        ((1, 2, 3, 4), (2, 3), None),  # rank 0's GPU dropped
        ((1, 2), (1, 2, 5), None),  # a growth whose new GPU is not free
        ((1, 2), (1, 5), None),  # a move to another GPU
        ((1, 2), (2, 1), None),  # the same GPUs
    ],
)
def test_a_resize_is_in_place_only_as_a_shrink_to_some_gpus_keeping_rank_0s(
    gang: tuple[int, ...], gpu_ids: tuple[int, ...], smaller: tuple[tuple[int, int], ...] | None
) -> None:
    workers = tuple(_worker(rank, gpu) for rank, gpu in enumerate(gang))
    found = in_place(workers, Resize(7, gpu_ids))
    assert (None if found is None else tuple((w.rank, w.gpu_id) for w in found)) == smaller


def test_a_growth_onto_free_gpus_of_its_node_is_in_place_and_they_take_the_next_ranks() -> None:
    workers = (_worker(0, 1), _worker(1, 2))
    found = in_place(workers, Resize(7, (5, 1, 2)), (_worker(0, 5),))
    assert found is not None and [(w.rank, w.gpu_id) for w in found] == [(0, 1), (1, 2), (2, 5)]
    assert in_place(workers, Resize(7, (1, 15, 2)), (_worker(0, 15, "b"),)) is None
    assert in_place(workers, Resize(7, (1, 5)), (_worker(0, 5),)) is None  # and a GPU left


def test_a_rebatch_on_the_same_gpus_is_in_place_and_keeps_the_ranks() -> None:
    workers = tuple(_worker(rank, gpu) for rank, gpu in enumerate((1, 2, 3)))
    same = in_place(workers, Resize(7, (3, 1, 2), global_batch=256))
    assert same is not None and [(w.rank, w.gpu_id) for w in same] == [(0, 1), (1, 2), (2, 3)]
    assert in_place(workers, Resize(7, (1, 2, 3))) is None  # no new batch: nothing to do


def test_a_gang_over_two_nodes_is_resized_by_a_restart() -> None:
    workers = (_worker(0, 1, "a"), _worker(1, 2, "a"), _worker(2, 11, "b"))
    assert in_place(workers, Resize(7, (1, 2))) is None


def test_a_resize_forgotten_in_a_failover_is_requeued(factory: sessionmaker[Session]) -> None:
    add_nodes(factory, {"a": 2})
    job_id = _elastic_job(factory)
    dispatcher = SimulatedDispatcher(iterations_per_second=10)
    loop = SchedulerService(factory, dispatcher, SETTINGS)
    # What a resize the leader before a failover asked leaves: no pending resize here.
    with transaction(factory) as session:
        session.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(state=JobState.SUSPENDED, suspended_by=SuspendedBy.RESIZE)
        )
    loop.run_round(T0)
    assert state(factory, job_id) is JobState.RUNNING  # requeued, then placed by FIFO
    assert dispatcher.commands == [Command("launch", job_id)]
