"""The scheduler's side of co-location over real gRPC (SQLite and PostgreSQL): each
rank's memory cap from the job's measured peak, a placement beside a running job sent,
an agent's refusal queueing the job again (not failing it), what each iteration says
of its neighbours and how each GPU is shared, stored."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker

from jigsaw.jobspec import JobSpec
from jigsaw.proto.v2 import agent_pb2 as pb
from scheduler.core.states import JobState
from scheduler.db import session_factory, transaction
from scheduler.dispatch import Launch, Report, RunOutcome, SimulatedDispatcher, Worker
from scheduler.models.agents import MEMORY_HEADROOM, MEMORY_SLACK_BYTES, allowance
from scheduler.models.jobs import submit
from scheduler.models.users import Principal, get_or_create_user
from scheduler.orm import GPU, Allocation, IterationMetric, Job, JobLog
from tests.agent_endpoint import Endpoint, agent_endpoint
from tests.servers import TEST_WORKER_USER
from tests.test_agent_protocol import (
    INSTANCE,
    Stream,
    _poll,
    _wait,
    add_job,
    allocate,
    hello,
    launch,
    record,
    register_request,
)
from tests.test_scheduler_loop import T0, add_nodes, events, held_gpus, service
from tests.test_scheduler_loop import add_job as add_loop_job
from worker_agent.agent import run_agent
from worker_agent.settings import AgentSettings

GPU_MEMORY = 1 << 30  # register_request's


@pytest.fixture
def endpoint(engine: Engine, tmp_path: Path) -> Iterator[Endpoint]:
    with agent_endpoint(engine, tmp_path) as running:
        yield running


@pytest.fixture
def factory(engine: Engine) -> sessionmaker[Session]:
    return session_factory(engine)


def _launch(endpoint: Endpoint, job_id: int, attempt: int = 1) -> Launch:
    """The job's launch on node-a's GPUs 0 and 1, by their ids."""
    with endpoint.factory() as session:
        ids = {index: gpu_id for index, gpu_id in session.execute(select(GPU.index, GPU.id))}
    plain = launch(endpoint, job_id, attempt=attempt)
    workers = tuple(replace(worker, gpu_id=ids[worker.gpu_index]) for worker in plain.workers)
    return replace(plain, workers=workers)


def _caps(endpoint: Endpoint, job_id: int, attempt: int) -> list[int | None]:
    with endpoint.factory() as session:
        return list(
            session.scalars(
                select(Allocation.memory_bytes).where(
                    Allocation.job_id == job_id, Allocation.attempt == attempt
                )
            )
        )


def test_caps_follow_the_measured_peak_and_a_refusal_comes_back_as_such(
    endpoint: Endpoint,
) -> None:
    request = register_request()
    request.gpus[0].sharing = pb.SHARING_MPS
    endpoint.stub.Register(request, metadata=endpoint.auth())
    with endpoint.factory() as session:
        sharing = {index: mode for index, mode in session.execute(select(GPU.index, GPU.sharing))}
        assert sharing == {0: "mps", 1: "time-sliced"}
    stream = Stream(endpoint, hello())
    host, guest = add_job(endpoint), add_job(endpoint)
    try:
        _wait(lambda: endpoint.dispatcher.connected() == frozenset({"node-a"}))
        allocate(endpoint, host, {0: 0, 1: 1})
        assert endpoint.dispatcher.launch(_launch(endpoint, host))
        # Nothing measured yet: each rank may fill its GPU, so nothing fits beside it.
        assert stream.commands.get(timeout=10).launch.memory_bytes == GPU_MEMORY
        assert _caps(endpoint, host, 1) == [GPU_MEMORY, GPU_MEMORY]

        alone, beside = record(1), record(2)
        beside.co_runners = 1
        for measured in (alone, beside):
            measured.peak_memory_bytes = 100 << 20
        stream.send(
            pb.AgentMessage(
                reports=pb.IterationReports(
                    jobs=[pb.JobIterations(job_id=host, records=[alone, beside])]
                )
            )
        )
        # Messages are taken in order: once the log line is in, so are the reports.
        stream.send(pb.AgentMessage(log=pb.LogTail(job_id=host, rank=0, message="hi")))
        _wait(lambda: endpoint.count(JobLog) == 1)
        assert endpoint.writer.flush()
        with endpoint.factory() as session:
            stored = session.execute(
                select(IterationMetric.iteration, IterationMetric.co_runners).order_by(
                    IterationMetric.iteration
                )
            ).all()
        assert [tuple(row) for row in stored] == [(1, 0), (2, 1)]

        # A guest placed beside the running host is sent (the agent judges its room),
        # with the cap the plan gives it.
        allocate(endpoint, guest, {0: 0, 1: 1})
        assert endpoint.dispatcher.launch(replace(_launch(endpoint, guest), memory_bytes=64 << 20))
        assert stream.commands.get(timeout=10).launch.memory_bytes == 64 << 20
        assert _caps(endpoint, guest, 1) == [64 << 20, 64 << 20]

        # The agent refuses the host's relaunch... its refusal is reported as one.
        refusal = "GPU 0 has 0.50 GiB of its 1.00 GiB free beside jobs [7]"
        stream.send(
            pb.AgentMessage(
                exit=pb.JobExit(
                    job_id=host, attempt=1, outcome=pb.OUTCOME_REFUSED, error_tail=refusal
                )
            )
        )
        [report] = _poll(endpoint.dispatcher)
        assert report.outcome is RunOutcome.REFUSED
        assert report.message == f"launch refused by node-a: {refusal}"

        # ...and placed again, its cap is its measured peak with headroom: 1.25x, and
        # at least MEMORY_SLACK_BYTES more (what a small job's restart needs).
        allocate(endpoint, host, {0: 0, 1: 1}, attempt=2, instance=INSTANCE)
        assert endpoint.dispatcher.launch(_launch(endpoint, host, attempt=2))
        expected = (100 << 20) + MEMORY_SLACK_BYTES
        assert expected == allowance(100 << 20, MEMORY_HEADROOM) > (100 << 20) * MEMORY_HEADROOM
        assert stream.commands.get(timeout=10).launch.memory_bytes == expected
        assert _caps(endpoint, host, 2) == [expected, expected]
    finally:
        stream.close()


class Refusing(SimulatedDispatcher):
    """Every run is refused by its agent at the first poll."""

    def poll(self, now: datetime) -> list[Report]:
        reports = [
            Report(job_id, 0, RunOutcome.REFUSED, "launch refused by a: GPU 0 already holds 4")
            for job_id in self.active()
        ]
        self._runs.clear()
        return reports


def test_a_refused_launch_queues_the_job_again_without_counting_a_failure(
    factory: sessionmaker[Session],
) -> None:
    add_nodes(factory, {"a": 1})
    job_id = add_loop_job(factory, 1, max_retries=0)
    loop, _ = service(factory, Refusing(iterations_per_second=1))
    loop.run_round(T0)  # launch
    loop.run_round(T0)  # refused -> queued (and placed again on the free GPU)
    with factory() as session:
        job = session.get_one(Job, job_id)
        assert job.state == JobState.RUNNING and job.failures == 0 and job.attempts == 2
    requeued = [e for e in events(factory, "transition") if e.from_state == "RUNNING"]
    assert [(e.to_state, e.message) for e in requeued] == [
        ("QUEUED", "launch refused by a: GPU 0 already holds 4")
    ]
    assert held_gpus(factory, job_id) == [("a", 0)]


def _one_rank_job(endpoint: Endpoint, iterations: int) -> int:
    spec = JobSpec(name="small", workload="digits-mlp", workers=1, max_iterations=iterations)
    with transaction(endpoint.factory) as session:
        user = get_or_create_user(session, "alice")
        return submit(session, spec, Principal("user", user.id, user.name, False)).id


@contextmanager
def _one_gpu_agent(endpoint: Endpoint, tmp_path: Path) -> Iterator[None]:
    """A real agent of one virtual GPU connected to `endpoint`, stopped on leaving."""
    settings = AgentSettings(
        scheduler=endpoint.address,
        token=endpoint.agent_token,
        node_name="node-a",
        gpus=1,
        work_dir=tmp_path / "agent",
        worker_user=TEST_WORKER_USER,
        mps="off",
    )
    stop = threading.Event()
    agent = threading.Thread(target=run_agent, args=(settings, stop), daemon=True)
    agent.start()
    try:
        _wait(lambda: endpoint.dispatcher.connected() == frozenset({"node-a"}), 120)
        yield
    finally:
        stop.set()
        agent.join(timeout=120)
    assert not agent.is_alive()


def test_a_real_agent_runs_two_jobs_on_one_gpu_and_refuses_a_third(
    endpoint: Endpoint, tmp_path: Path
) -> None:
    """The placements a packing policy would make, through the dispatcher to a real agent
    over loopback gRPC: both jobs train on GPU 0 at once and succeed, what they report
    says they shared it, and a third that does not fit is refused and reported so."""
    with _one_gpu_agent(endpoint, tmp_path):
        with endpoint.factory() as session:
            gpu = session.scalars(select(GPU)).one()
        first, second = _one_rank_job(endpoint, 60), _one_rank_job(endpoint, 30)
        third = _one_rank_job(endpoint, 30)
        for job_id, cap in ((first, 2 << 30), (second, 2 << 30), (third, gpu.memory_bytes)):
            allocate(endpoint, job_id, {0: 0})
            with endpoint.factory() as session:
                spec = session.get_one(Job, job_id).spec
            worker = Worker(0, gpu.id, gpu.node_id, "node-a", 0, "127.0.0.1")
            placement = Launch(job_id, spec, (worker,), {}, 0, 50, 1, memory_bytes=cap)
            assert endpoint.dispatcher.launch(placement)

        ends: dict[int, Report] = {}

        def all_ended() -> bool:
            ends.update((r.job_id, r) for r in endpoint.dispatcher.poll(T0))
            return len(ends) == 3

        _wait(all_ended, 300)
        assert ends[third].outcome is RunOutcome.REFUSED
        assert f"beside jobs [{first}, {second}]" in ends[third].message
        assert (ends[first].outcome, ends[second].outcome) == (RunOutcome.SUCCEEDED,) * 2
        assert endpoint.writer.flush()
        with endpoint.factory() as session:
            rows = session.execute(
                select(
                    IterationMetric.job_id,
                    IterationMetric.co_runners,
                    IterationMetric.utilization,
                    IterationMetric.peak_memory_bytes,
                )
            ).all()
        shared = {
            job_id: {row[1] for row in rows if row[0] == job_id} for job_id in (first, second)
        }
        assert 1 in shared[first] and 1 in shared[second]
        # A CPU slot's utilization is the process's own: kept while others shared the slot.
        beside = [row for row in rows if row[1] == 1]
        assert all(row[2] is not None and 0 < row[3] < 2 << 30 for row in beside)


def test_a_lowered_cap_lets_a_job_join_a_gpu_its_host_was_launched_to_fill(
    endpoint: Endpoint, tmp_path: Path
) -> None:
    """A job launched before it reported may fill its GPU, so a real agent refuses any
    job beside it; once the scheduler lowers its cap (over loopback gRPC), the agent
    counts the lower cap at once, the host's worker enforces it from its next boundary
    and trains on, and the next job fits beside it."""
    with _one_gpu_agent(endpoint, tmp_path):
        with endpoint.factory() as session:
            gpu = session.scalars(select(GPU)).one()
        worker = Worker(0, gpu.id, gpu.node_id, "node-a", 0, "127.0.0.1")
        ends: dict[int, Report] = {}

        def place(job_id: int, cap: int) -> None:
            allocate(endpoint, job_id, {0: 0})
            with endpoint.factory() as session:
                spec = session.get_one(Job, job_id).spec
            assert endpoint.dispatcher.launch(
                Launch(job_id, spec, (worker,), {}, 0, 50, 1, memory_bytes=cap)
            )

        def ended(job_id: int) -> bool:
            ends.update((r.job_id, r) for r in endpoint.dispatcher.poll(T0))
            return job_id in ends

        # The host trains until stopped: the jobs beside it take seconds.
        host, early, late = (_one_rank_job(endpoint, n) for n in (10**9, 30, 30))
        place(host, gpu.memory_bytes)
        place(early, 1 << 30)
        _wait(lambda: ended(early), 120)
        assert ends[early].outcome is RunOutcome.REFUSED
        assert f"beside jobs [{host}]" in ends[early].message

        def lowered() -> bool:
            endpoint.writer.flush()
            with endpoint.factory() as session:
                said = select(JobLog.message).where(JobLog.job_id == host)
                return any("memory cap lowered to 1024 MiB" in m for m in session.scalars(said))

        endpoint.dispatcher.cap(host, 1 << 30)
        _wait(lowered, 120)
        place(late, 1 << 30)
        _wait(lambda: ended(late), 300)
        assert ends[late].outcome is RunOutcome.SUCCEEDED
        assert host not in ends  # trained on under its lower cap
        endpoint.dispatcher.stop(host)
        _wait(lambda: ended(host), 120)
        assert ends[host].outcome is RunOutcome.STOPPED
        assert endpoint.writer.flush()
        with endpoint.factory() as session:
            shared = session.scalars(
                select(IterationMetric.co_runners).where(IterationMetric.job_id == late)
            ).all()
        assert 1 in shared  # it trained beside the host
