"""The scheduler round loop and leader lock against real databases (SQLite and PostgreSQL).

The `engine` fixture (tests/conftest.py) gives a freshly migrated database per test on
each backend; PostgreSQL runs are marked `postgres` and skip when the server is absent.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine, select, update
from sqlalchemy.orm import Session, sessionmaker

from jigsaw.jobspec import JobSpec
from scheduler.core.plan import Placement, Plan, Reconfigure
from scheduler.core.snapshot import ClusterSnapshot
from scheduler.core.states import JobState
from scheduler.db import session_factory, transaction
from scheduler.dispatch import Command, Launch, Report, RunOutcome, SimulatedDispatcher
from scheduler.leader import LeaderLock, LeaderUnavailable
from scheduler.loop import SchedulerService
from scheduler.models.agents import LOWERED_CAP_HEADROOM, allowance
from scheduler.models.jobs import cancel, resume, submit, suspend
from scheduler.models.metrics import record
from scheduler.models.snapshot import build_snapshot
from scheduler.models.states import transition
from scheduler.models.users import Principal, get_or_create_user
from scheduler.orm import GPU, Agent, Allocation, Event, IterationMetric, Job, Node
from scheduler.policies import POLICIES, fifo
from scheduler.settings import SchedulerSettings

T0 = datetime(2030, 1, 1, tzinfo=UTC)
SETTINGS = SchedulerSettings(
    policy="fifo", round_seconds=0.01, lease_iterations=50, agent_timeout_seconds=30
)


@pytest.fixture
def factory(engine: Engine) -> sessionmaker[Session]:
    return session_factory(engine)


def add_nodes(factory: sessionmaker[Session], sizes: dict[str, int]) -> None:
    """Nodes with `sizes[name]` GPUs each and an agent that heartbeated at T0."""
    with transaction(factory) as session:
        for name, size in sizes.items():
            node = Node(name=name, address=f"{name}:7000")
            session.add(node)
            session.flush()
            session.add_all(
                GPU(node_id=node.id, index=i, kind="H100", memory_bytes=80 << 30)
                for i in range(size)
            )
            session.add(Agent(node_id=node.id, version="test", last_heartbeat_at=T0))


def add_job(
    factory: sessionmaker[Session], workers: int, max_iterations: int = 100, max_retries: int = 0
) -> int:
    spec = JobSpec(
        name=f"w{workers}",
        workload="digits-mlp",
        workers=workers,
        max_iterations=max_iterations,
        max_retries=max_retries,
    )
    with transaction(factory) as session:
        user = get_or_create_user(session, "alice")
        return submit(session, spec, Principal("user", user.id, user.name, False)).id


def state(factory: sessionmaker[Session], job_id: int) -> JobState:
    with factory() as session:
        job = session.get(Job, job_id)
        assert job is not None
        return JobState(job.state)


def held_gpus(factory: sessionmaker[Session], job_id: int) -> list[tuple[str, int]]:
    """(node name, GPU index) of the job's active allocations, by rank."""
    with factory() as session:
        rows = session.execute(
            select(Node.name, GPU.index)
            .join(GPU, GPU.node_id == Node.id)
            .join(Allocation, Allocation.gpu_id == GPU.id)
            .where(Allocation.job_id == job_id, Allocation.released_at.is_(None))
            .order_by(Allocation.rank)
        )
        return [(name, index) for name, index in rows]


def events(factory: sessionmaker[Session], kind: str) -> list[Event]:
    with factory() as session:
        return list(session.scalars(select(Event).where(Event.kind == kind).order_by(Event.id)))


def service(
    factory: sessionmaker[Session], dispatcher: SimulatedDispatcher | None = None
) -> tuple[SchedulerService, SimulatedDispatcher]:
    dispatcher = dispatcher or SimulatedDispatcher(iterations_per_second=10)
    return SchedulerService(factory, dispatcher, SETTINGS), dispatcher


def test_round_places_queued_jobs_fifo_as_gangs(factory: sessionmaker[Session]) -> None:
    add_nodes(factory, {"a": 4, "b": 2})
    first, blocked, small = add_job(factory, 3), add_job(factory, 4), add_job(factory, 1)
    loop, dispatcher = service(factory)

    result = loop.run_round(T0)

    assert result.started == 1 and result.conflicts == 0 and result.seconds > 0
    # Best fit: b's 2 GPUs are too few, so all 3 ranks land on a.
    assert held_gpus(factory, first) == [("a", 0), ("a", 1), ("a", 2)]
    assert state(factory, first) is JobState.RUNNING
    # 3 GPUs remain free for the 4-GPU job: it waits, and the 1-GPU job waits behind it.
    assert state(factory, blocked) is JobState.QUEUED and state(factory, small) is JobState.QUEUED
    assert dispatcher.commands == [Command("launch", first)]
    with factory() as session:
        allocations = session.scalars(select(Allocation).order_by(Allocation.rank)).all()
    assert [(a.rank, a.lease_iterations, a.spb) for a in allocations] == [
        (0, 50, {}),
        (1, 50, {}),
        (2, 50, {}),
    ]
    [decision] = events(factory, "decision")
    assert decision.job_id == first
    assert decision.data["gpu_ids"] == [a.gpu_id for a in allocations]
    assert decision.data["nodes"] == ["a", "a", "a"]
    transitions = [(e.from_state, e.to_state) for e in events(factory, "transition")]
    assert ("QUEUED", "SCHEDULED") in transitions and ("SCHEDULED", "RUNNING") in transitions


def test_simulated_jobs_run_to_success_and_free_their_gpus(
    factory: sessionmaker[Session],
) -> None:
    add_nodes(factory, {"a": 2})
    first, second = add_job(factory, 2, max_iterations=25), add_job(factory, 2, max_iterations=5)
    loop, _ = service(factory)

    loop.run_round(T0)
    loop.run_round(T0 + timedelta(seconds=1))
    with factory() as session:
        job = session.get(Job, first)
        assert job is not None and job.iterations_done == 10
    assert state(factory, second) is JobState.QUEUED

    # The round that ingests the end of the first job gives its GPUs to the second.
    result = loop.run_round(T0 + timedelta(seconds=3))
    assert result.finished == 1 and result.started == 1
    assert state(factory, first) is JobState.SUCCEEDED
    assert held_gpus(factory, first) == []
    assert held_gpus(factory, second) == [("a", 0), ("a", 1)]

    loop.run_round(T0 + timedelta(seconds=4))
    assert state(factory, second) is JobState.SUCCEEDED
    with factory() as session:
        assert (
            session.scalars(select(Allocation).where(Allocation.released_at.is_(None))).all() == []
        )
        job = session.get(Job, second)
        assert job is not None and job.iterations_done == 5 and job.finished_at is not None


def test_cancelled_job_is_released_and_stopped(factory: sessionmaker[Session]) -> None:
    add_nodes(factory, {"a": 2})
    job_id = add_job(factory, 2)
    loop, dispatcher = service(factory)
    loop.run_round(T0)

    with transaction(factory) as session:
        job = session.get(Job, job_id)
        assert job is not None
        cancel(session, job, Principal("user", job.owner_id, "alice", False))
    result = loop.run_round(T0 + timedelta(seconds=1))

    assert result.released == 1
    assert held_gpus(factory, job_id) == []
    assert dispatcher.commands[-1] == Command("stop", job_id)
    assert job_id not in dispatcher.active()
    assert state(factory, job_id) is JobState.CANCELLED


def test_a_new_leader_times_silent_agents_from_its_first_round(
    factory: sessionmaker[Session],
) -> None:
    # Heartbeats sent while no scheduler led (a restart, a failover) reached nobody.
    add_nodes(factory, {"a": 2})
    job_id = add_job(factory, 2, max_iterations=1_000_000)
    first, dispatcher = service(factory)
    first.run_round(T0)
    successor, _ = service(factory, dispatcher)
    timeout = timedelta(seconds=SETTINGS.agent_timeout_seconds)
    back = T0 + 10 * timeout

    assert successor.run_round(back).agents_lost == 0
    assert successor.run_round(back + timeout - timedelta(seconds=1)).agents_lost == 0
    assert held_gpus(factory, job_id) == [("a", 0), ("a", 1)]
    assert successor.run_round(back + timeout).agents_lost == 1
    assert held_gpus(factory, job_id) == []


def test_dead_agent_requeues_its_job_onto_another_node(factory: sessionmaker[Session]) -> None:
    add_nodes(factory, {"a": 2, "b": 2})
    job_id = add_job(factory, 2, max_iterations=10_000)  # still running when a dies
    loop, dispatcher = service(factory)
    loop.run_round(T0)
    assert held_gpus(factory, job_id) == [("a", 0), ("a", 1)]

    later = T0 + timedelta(seconds=SETTINGS.agent_timeout_seconds + 5)
    with transaction(factory) as session:
        session.execute(
            update(Agent)
            .where(Agent.node_id == select(Node.id).where(Node.name == "b").scalar_subquery())
            .values(last_heartbeat_at=later)
        )
    result = loop.run_round(later)

    assert (result.agents_lost, result.requeued, result.started) == (1, 1, 1)
    assert held_gpus(factory, job_id) == [("b", 0), ("b", 1)]
    assert state(factory, job_id) is JobState.RUNNING
    assert dispatcher.commands[-2:] == [Command("stop", job_id), Command("launch", job_id)]
    [lost] = events(factory, "agent_lost")
    with factory() as session:
        rows = session.execute(select(Node.name, Node.id, Agent.alive).join(Agent)).all()
    assert {name: alive for name, _, alive in rows} == {"a": False, "b": True}
    assert lost.data["node_id"] == next(node_id for name, node_id, _ in rows if name == "a")
    transitions = [(e.from_state, e.to_state) for e in events(factory, "transition")]
    assert ("RUNNING", "QUEUED") in transitions


class CancelledDuringLaunch(SimulatedDispatcher):
    """The API cancels the job between its placement and its launch acknowledgement."""

    factory: sessionmaker[Session] | None = None

    def launch(self, launch: Launch) -> bool:
        assert self.factory is not None
        with transaction(self.factory) as session:
            job = session.get(Job, launch.job_id)
            assert job is not None
            cancel(session, job, Principal("user", job.owner_id, "alice", False))
        return super().launch(launch)


def test_race_with_the_api_is_logged_not_raised(
    factory: sessionmaker[Session], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="scheduler.loop")
    add_nodes(factory, {"a": 1})
    job_id = add_job(factory, 1)
    dispatcher = CancelledDuringLaunch(iterations_per_second=1)
    dispatcher.factory = factory
    loop, _ = service(factory, dispatcher)

    result = loop.run_round(T0)
    assert (result.started, result.conflicts) == (0, 1)
    assert "skipping job" in caplog.text
    assert state(factory, job_id) is JobState.CANCELLED

    # The next round notices the cancelled job still holds its GPU and frees it.
    assert loop.run_round(T0 + timedelta(seconds=1)).released == 1
    assert held_gpus(factory, job_id) == []


class RefusingTwice(SimulatedDispatcher):
    """Refuses the first two launches (a node not connected yet), then takes them."""

    refused: int = 0
    attempts: list[int] = []

    def launch(self, launch: Launch) -> bool:
        self.attempts = [*self.attempts, launch.attempt]
        if self.refused < 2:
            self.refused += 1
            return False
        return super().launch(launch)


def test_every_launch_that_reached_an_agent_has_an_attempt_of_its_own(
    factory: sessionmaker[Session],
) -> None:
    add_nodes(factory, {"a": 1})
    job_id = add_job(factory, 1)
    dispatcher = RefusingTwice(iterations_per_second=1)
    loop, _ = service(factory, dispatcher)
    for second in range(3):
        loop.run_round(T0 + timedelta(seconds=second))
    # Refused launches sent nothing: their attempt goes to the next placement.
    assert dispatcher.attempts == [1, 1, 1]
    with transaction(factory) as session:
        job = session.get_one(Job, job_id)
        assert (job.state, job.attempts) == (JobState.RUNNING, 1)
        transition(session, job, JobState.QUEUED, actor="test", message="processes gone")
        session.execute(update(Allocation).values(released_at=T0))
    loop.run_round(T0 + timedelta(seconds=3))
    assert dispatcher.attempts[-1] == 2
    with factory() as session:
        held = session.scalars(
            select(Allocation.attempt).where(Allocation.released_at.is_(None))
        ).all()
    assert held == [2]


class FailingOnce(SimulatedDispatcher):
    failures: int = 0

    def poll(self, now: datetime) -> list[Report]:
        if not self.failures:
            self.failures += 1
            raise RuntimeError("agent connection reset")
        return super().poll(now)


def test_run_forever_survives_a_failed_round(factory: sessionmaker[Session]) -> None:
    add_nodes(factory, {"a": 1})
    job_id = add_job(factory, 1)
    # Rounds 0.1 s apart: back to back (a loaded machine's rounds outlast 0.01 s), they
    # would keep SQLite's one pooled connection from this test's reads for its 30 s.
    settings = SETTINGS.model_copy(update={"round_seconds": 0.1})
    loop = SchedulerService(factory, FailingOnce(iterations_per_second=1), settings)
    # Heartbeats at T0 would expire against the wall clock: keep the agent fresh.
    with transaction(factory) as session:
        session.execute(
            update(Agent).values(last_heartbeat_at=datetime.now(UTC) + timedelta(days=1))
        )
    stop = threading.Event()
    thread = threading.Thread(target=loop.run_forever, args=(stop,))
    thread.start()
    try:
        for _ in range(500):
            if state(factory, job_id) is JobState.RUNNING:
                break
            stop.wait(0.01)
    finally:
        stop.set()
        thread.join(timeout=10)
    assert state(factory, job_id) is JobState.RUNNING


def test_only_one_leader_per_database(engine: Engine, tmp_path: Path) -> None:
    first, second = LeaderLock(engine, tmp_path), LeaderLock(engine, tmp_path)
    with first:
        assert first.held
        assert not second.acquire(blocking=False)
        with pytest.raises(LeaderUnavailable, match="another scheduler"), second:
            pass
    assert not first.held
    assert second.acquire(blocking=False)
    assert not first.acquire(blocking=False)
    second.release()
    assert first.acquire(blocking=True)
    first.release()


class Crashing(SimulatedDispatcher):
    """Every run crashes at its first poll, with a traceback's worth of message."""

    def poll(self, now: datetime) -> list[Report]:
        reports = [
            Report(job_id, 3, RunOutcome.FAILED, "Traceback ...\n" + "x" * 5000 + "\nBoom: at 3")
            for job_id in self.active()
        ]
        self._runs.clear()
        return reports


def test_a_crash_is_retried_up_to_max_retries_then_fails(factory: sessionmaker[Session]) -> None:
    add_nodes(factory, {"a": 1})
    job_id = add_job(factory, 1, max_retries=1)
    loop, dispatcher = service(factory, Crashing(iterations_per_second=1))

    loop.run_round(T0)  # launch
    loop.run_round(T0)  # crash -> retried: queued and relaunched in the same round
    with factory() as session:
        job = session.get_one(Job, job_id)
        assert (job.state, job.failures, job.attempts) == (JobState.RUNNING, 1, 2)
    [retry] = [e for e in events(factory, "transition") if e.to_state == "QUEUED"][-1:]
    assert "retry 1 of 1" in retry.message and retry.message.endswith("Boom: at 3")
    loop.run_round(T0)  # crash again -> FAILED
    with factory() as session:
        job = session.get_one(Job, job_id)
        assert (job.state, job.failures) == (JobState.FAILED, 1)
        assert job.message.endswith("Boom: at 3") and len(job.message) < 4100
    assert held_gpus(factory, job_id) == []
    assert [c.kind for c in dispatcher.commands] == ["launch", "stop", "launch", "stop"]


class Unstorable(SimulatedDispatcher):
    """Every run ends at its first poll; the first job's exit carries what PostgreSQL
    cannot store (NUL in text, infinity in JSON): a dispatcher that did not scrub."""

    def poll(self, now: datetime) -> list[Report]:
        reports = [
            Report(job_id, 3, RunOutcome.SUCCEEDED, "done \0", {"mse": float("inf")})
            if job_id == min(self.active())
            else Report(job_id, 3, RunOutcome.SUCCEEDED, "done", {"mse": 0.25})
            for job_id in self.active()
        ]
        self._runs.clear()
        return reports


def test_an_exit_is_recorded_even_when_what_it_carries_cannot_be(
    factory: sessionmaker[Session], db_url: str
) -> None:
    """An exit lost to a failed write left its job RUNNING without processes, requeued
    and relaunched forever; nor may it take the other exits of the round with it."""
    add_nodes(factory, {"a": 2})
    unstorable, fine = add_job(factory, 1), add_job(factory, 1)
    loop, dispatcher = service(factory, Unstorable(iterations_per_second=1))
    loop.run_round(T0)  # launch both
    loop.run_round(T0)  # both end
    with factory() as session:
        bad, good = session.get_one(Job, unstorable), session.get_one(Job, fine)
        assert (bad.state, good.state) == (JobState.SUCCEEDED, JobState.SUCCEEDED)
        assert (bad.iterations_done, good.metrics) == (3, {"mse": 0.25})
        if db_url.startswith("postgresql"):
            assert bad.metrics == {} and "unstorable" in bad.message
    assert [c.kind for c in dispatcher.commands].count("launch") == 2


class Reconnected(SimulatedDispatcher):
    """Agents of `nodes` are connected and report exactly `runs` (job -> nodes)."""

    nodes: frozenset[str] = frozenset()
    runs: dict[int, frozenset[str]] | None = None

    def active(self) -> dict[int, frozenset[str]]:
        return super().active() if self.runs is None else dict(self.runs)

    def connected(self) -> frozenset[str]:
        return self.nodes


def test_a_running_job_whose_agent_lost_its_processes_is_requeued(
    factory: sessionmaker[Session],
) -> None:
    add_nodes(factory, {"a": 1})
    job_id = add_job(factory, 1, max_iterations=10_000)
    dispatcher = Reconnected(iterations_per_second=1)
    loop, _ = service(factory, dispatcher)
    loop.run_round(T0)
    assert state(factory, job_id) is JobState.RUNNING

    # The agent on `a` restarted: connected again, but running nothing.
    dispatcher.nodes, dispatcher.runs = frozenset({"a"}), {}
    result = loop.run_round(T0)
    assert result.requeued == 1
    transitions = [(e.from_state, e.to_state, e.message) for e in events(factory, "transition")]
    assert ("RUNNING", "QUEUED", "its processes are gone (agent restarted)") in transitions
    # Requeued, then placed again on the freed GPU in the same round.
    assert state(factory, job_id) is JobState.RUNNING
    assert dispatcher.commands[-1] == Command("launch", job_id)


def test_stray_processes_are_stopped_where_the_job_is_not_allocated(
    factory: sessionmaker[Session],
) -> None:
    add_nodes(factory, {"a": 1, "b": 1})
    job_id = add_job(factory, 1, max_iterations=10_000)
    dispatcher = Reconnected(iterations_per_second=1)
    loop, _ = service(factory, dispatcher)
    loop.run_round(T0)
    [(node, _)] = held_gpus(factory, job_id)
    other = "b" if node == "a" else "a"

    # The other node's agent comes back still running an old copy of the job.
    dispatcher.runs = {job_id: frozenset({node, other})}
    stopped: list[tuple[int, str | None]] = []
    dispatcher.stop = lambda job, where=None: stopped.append((job, where))  # type: ignore[method-assign]
    loop.run_round(T0)
    assert stopped == [(job_id, other)]
    assert state(factory, job_id) is JobState.RUNNING


def test_a_job_suspended_through_the_api_is_checkpointed_and_freed(
    factory: sessionmaker[Session],
) -> None:
    add_nodes(factory, {"a": 1})
    job_id = add_job(factory, 1, max_iterations=10_000)
    loop, dispatcher = service(factory)
    loop.run_round(T0)
    with transaction(factory) as session:
        job = session.get_one(Job, job_id)
        suspend(session, job, Principal("user", job.owner_id, "alice", False))

    result = loop.run_round(T0 + timedelta(seconds=1))
    assert result.released == 1
    assert dispatcher.commands[-1] == Command("suspend", job_id)
    assert held_gpus(factory, job_id) == []
    assert state(factory, job_id) is JobState.SUSPENDED

    with transaction(factory) as session:
        job = session.get_one(Job, job_id)
        resume(session, job, Principal("user", job.owner_id, "alice", False))
    loop.run_round(T0 + timedelta(seconds=2))
    assert state(factory, job_id) is JobState.RUNNING
    assert dispatcher.commands[-1] == Command("launch", job_id)


def test_a_policy_reconfigures_a_running_job_once_per_change(
    factory: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    half = {"full_fraction": 0.5, "partial_depth": 0.5, "rotation_period": 0}
    seen: list[ClusterSnapshot] = []

    def partial(snapshot: ClusterSnapshot) -> Plan:
        """Starts like FIFO; then wants every running job at `half`, and a queued one."""
        seen.append(snapshot)
        plan = fifo.schedule(snapshot)
        changes = [Reconfigure(job.id, half) for job in snapshot.jobs]
        return Plan(start=plan.start, reconfigure=tuple(changes))

    monkeypatch.setitem(POLICIES, "partial", partial)
    add_nodes(factory, {"a": 2})
    running, queued = add_job(factory, 2), add_job(factory, 2)
    dispatcher = SimulatedDispatcher(iterations_per_second=1)
    loop = SchedulerService(factory, dispatcher, SETTINGS, policy_name="partial")

    first = loop.run_round(T0)  # places `running`; reconfiguring both is premature
    assert (first.started, first.reconfigured, first.conflicts) == (1, 0, 2)
    second = loop.run_round(T0 + timedelta(seconds=5))
    assert (second.reconfigured, second.conflicts) == (1, 1)  # `queued` is not running
    [decision] = second.decisions  # what the dashboard's scheduler view shows
    assert (decision.kind, decision.job_id) == ("reconfigure", running)
    assert decision.detail["spb"] == half
    third = loop.run_round(T0 + timedelta(seconds=10))
    assert third.reconfigured == 0  # already so: nothing to send

    assert dispatcher.commands == [Command("launch", running), Command("reconfigure", running)]
    with factory() as session:
        holds = session.scalars(select(Allocation).where(Allocation.job_id == running)).all()
    assert [(a.spb, a.config_version) for a in holds] == [(half, 1), (half, 1)]
    [event] = events(factory, "reconfigure")
    assert event.job_id == running and event.data["config_version"] == 1
    assert event.data["spb"] == half and event.data["iteration"] == 5
    assert [job.spb for job in seen[-1].jobs if job.id == running] == [half]
    assert state(factory, queued) is JobState.QUEUED


def test_a_job_no_capacity_can_hold_says_why_until_it_can_be_placed(
    factory: sessionmaker[Session],
) -> None:
    add_nodes(factory, {"a": 4})
    big, small = add_job(factory, 8), add_job(factory, 2)
    loop, _ = service(factory)

    for _ in range(3):
        loop.run_round(T0)
    reason = "needs 8 GPUs; the largest gang this cluster can form is 4"
    with factory() as session:
        assert session.get_one(Job, big).pending_reason == reason
        assert session.get_one(Job, small).pending_reason is None
    assert state(factory, small) is JobState.RUNNING  # the big job blocks nobody
    # One event when the reason appeared, not one per round.
    assert [(e.job_id, e.message) for e in events(factory, "pending")] == [(big, reason)]

    add_nodes(factory, {"b": 4})
    loop.run_round(T0)
    with factory() as session:
        # It could be placed now, once the 2-GPU job gives two of a's back.
        assert session.get_one(Job, big).pending_reason == (
            "needs 8 GPUs on 2 node(s); largest free gang is 6"
        )
    assert state(factory, big) is JobState.QUEUED
    with transaction(factory) as session:
        cancel(session, session.get_one(Job, small), Principal("user", None, "alice", False))
    loop.run_round(T0)
    loop.run_round(T0)
    assert state(factory, big) is JobState.RUNNING
    assert len(held_gpus(factory, big)) == 8


def test_a_plan_item_the_validator_refuses_is_dropped_not_the_round(
    factory: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    def careless(snapshot: ClusterSnapshot) -> Plan:
        """FIFO, plus the second job on a GPU that does not exist."""
        plan = fifo.schedule(snapshot)
        return Plan(start=(*plan.start[:1], Placement(plan.start[1].job_id, (10**6,))))

    monkeypatch.setitem(POLICIES, "careless", careless)
    add_nodes(factory, {"a": 2})
    placed, refused = add_job(factory, 1), add_job(factory, 1)
    loop = SchedulerService(
        factory, SimulatedDispatcher(iterations_per_second=10), SETTINGS, policy_name="careless"
    )

    result = loop.run_round(T0)

    assert (result.started, result.conflicts) == (1, 1)
    assert (state(factory, placed), state(factory, refused)) == (JobState.RUNNING, JobState.QUEUED)
    assert held_gpus(factory, refused) == []


def test_a_launched_job_s_start_is_measured_once_its_first_iteration_is_in(
    factory: sessionmaker[Session],
) -> None:
    """From its placement to its first report: what JigSaw charges a waiting job."""
    add_nodes(factory, {"a": 1})
    job_id = add_job(factory, 1, max_iterations=1000)
    loop, _ = service(factory)
    loop.run_round(T0)
    loop.run_round(T0 + timedelta(seconds=1))
    assert events(factory, "started") == []  # no iteration reported yet
    with transaction(factory) as session:
        [placed] = session.scalars(select(Allocation.created_at)).all()
        first = placed + timedelta(seconds=7.5)
        record(session, [{"job_id": job_id, "iteration": 1, "step_seconds": 0.1}])
        session.execute(update(IterationMetric).values(reported_at=first))
    loop.run_round(T0 + timedelta(seconds=2))
    [started] = events(factory, "started")
    assert (started.job_id, started.data) == (job_id, {"iteration": 1, "seconds": 7.5})
    with transaction(factory) as session:
        snapshot = build_snapshot(session, T0 + timedelta(seconds=4))
    assert snapshot.jobs[0].start_seconds == started.data["seconds"]


@dataclass
class StillExiting(SimulatedDispatcher):
    """The processes of these jobs' earlier runs have not exited yet."""

    exiting: frozenset[int] = frozenset()

    def active(self) -> dict[int, frozenset[str]]:
        return {**super().active(), **{job_id: frozenset({"a"}) for job_id in self.exiting}}


def test_a_job_whose_earlier_run_is_still_exiting_waits_queued_instead_of_being_refused(
    factory: sessionmaker[Session],
) -> None:
    """An agent refuses a launch while the job's earlier processes live (they are writing
    its checkpoint): the start waits, saying why, instead of costing an allocation."""
    add_nodes(factory, {"a": 1})
    job_id = add_job(factory, 1)
    dispatcher = StillExiting(iterations_per_second=1, exiting=frozenset({job_id}))
    loop, _ = service(factory, dispatcher)
    assert loop.run_round(T0).started == 0
    assert state(factory, job_id) is JobState.QUEUED
    assert Command("launch", job_id) not in dispatcher.commands
    [pending] = events(factory, "pending")
    assert "earlier run's processes are still checkpointing" in pending.message
    dispatcher.exiting = frozenset()
    assert loop.run_round(T0 + timedelta(seconds=1)).started == 1
    with factory() as session:
        assert (
            len(session.scalars(select(Allocation).where(Allocation.job_id == job_id)).all()) == 1
        )


def test_a_running_job_s_memory_cap_is_lowered_once_to_what_its_run_showed(
    factory: sessionmaker[Session],
) -> None:
    """Launched before it reported, a job may fill its GPU; once its run has shown its
    peak the cap is lowered to that with headroom, recorded before the plan (which sees
    the room) and sent once. Not for a run at partial backprop, nor one that has
    reported too little."""
    add_nodes(factory, {"a": 3})
    full, partial, fresh = (add_job(factory, 1, max_iterations=10**6) for _ in range(3))
    loop, dispatcher = service(factory)
    loop.run_round(T0)
    half = {"full_fraction": 0.5, "partial_depth": 0.5, "rotation_period": 0}
    with transaction(factory) as session:
        session.execute(update(Allocation).where(Allocation.job_id == partial).values(spb=half))
        for job_id, count in ((full, 5), (partial, 5), (fresh, 4)):
            peaks = (90 << 20, 100 << 20, 80 << 20, 0, 0)[:count]
            rows = [
                {"job_id": job_id, "iteration": i, "step_seconds": 0.1, "peak_memory_bytes": peak}
                for i, peak in enumerate(peaks, start=1)
            ]
            record(session, rows)
        # Reported during the runs (the loop's clock is T0's).
        session.execute(update(IterationMetric).values(reported_at=T0 + timedelta(seconds=0.5)))
    lowered = loop.run_round(T0 + timedelta(seconds=1))
    expected = allowance(100 << 20, LOWERED_CAP_HEADROOM)
    assert [(d.kind, d.job_id, d.detail) for d in lowered.decisions] == [
        ("cap", full, {"memory_bytes": expected})
    ]
    assert [c for c in dispatcher.commands if c.kind == "cap"] == [Command("cap", full)]
    with factory() as session:
        caps = dict(
            session.execute(
                select(Allocation.job_id, Allocation.memory_bytes).where(
                    Allocation.released_at.is_(None)
                )
            ).all()
        )
        snapshot = build_snapshot(session, T0 + timedelta(seconds=2))
    assert caps == {full: expected, partial: None, fresh: None}
    assert {job.id: job.memory_cap_bytes for job in snapshot.jobs} == {
        full: expected,
        partial: None,
        fresh: None,
    }
    loop.run_round(T0 + timedelta(seconds=2))  # what it showed is what it has now
    assert [c for c in dispatcher.commands if c.kind == "cap"] == [Command("cap", full)]
