"""The agents' gRPC endpoint over real gRPC on loopback, on both databases.

The client side here is a raw stub speaking agent.proto, so that it can also send what
a correct agent never would: no token, a user token, malformed registrations, a stream
that does not start with hello, reports about jobs it was never given.
"""

from __future__ import annotations

import itertools
import math
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest
from sqlalchemy import Engine, select

import jigsaw
from jigsaw.jobspec import JobSpec
from jigsaw.proto.v2 import agent_pb2 as pb
from scheduler.agents.dispatcher import AgentDispatcher, RendezvousPorts
from scheduler.agents.server import start_server
from scheduler.agents.service import AgentService
from scheduler.core.states import JobState, SuspendedBy
from scheduler.db import transaction
from scheduler.dispatch import Launch, Report, RunOutcome, Worker
from scheduler.loop import SchedulerService
from scheduler.models.agents import instance_digest
from scheduler.models.jobs import submit
from scheduler.models.snapshot import build_snapshot
from scheduler.models.users import (
    Principal,
    TokenVerifier,
    get_or_create_user,
)
from scheduler.orm import (
    GPU,
    Agent,
    Allocation,
    IterationMetric,
    Job,
    JobLog,
    ModelProfile,
    Node,
)
from scheduler.settings import GrpcSettings, SchedulerSettings
from tests.agent_endpoint import CHECKPOINT_EVERY, Endpoint, agent_endpoint

NOW = datetime.now(UTC)
# The instance key of the agent process these tests speak for.
INSTANCE = "node-a-agent-process-1"
LOOP_SETTINGS = SchedulerSettings(policy="fifo", lease_iterations=50, agent_timeout_seconds=30)


@pytest.fixture
def endpoint(engine: Engine, tmp_path: Path) -> Iterator[Endpoint]:
    with agent_endpoint(engine, tmp_path) as running:
        yield running


def register_request(
    name: str = "node-a", gpus: int = 2, instance: str = INSTANCE
) -> pb.RegisterRequest:
    return pb.RegisterRequest(
        node_name=name,
        gpus=[pb.Gpu(index=i, kind="virtual-cpu", memory_bytes=1 << 30, virtual=True)
              for i in range(gpus)],
        agent_version="test",
        address="127.0.0.1",
        instance=instance,
    )  # fmt: skip


class Stream:
    """An agent's side of Connect: messages queued by the test, commands collected."""

    def __init__(self, endpoint: Endpoint, first: pb.AgentMessage) -> None:
        self._outgoing: queue.Queue[pb.AgentMessage | None] = queue.Queue()
        self._outgoing.put(first)
        self.commands: queue.Queue[pb.SchedulerMessage] = queue.Queue()
        self.error: grpc.RpcError | None = None
        self._call = endpoint.stub.Connect(self._messages(), metadata=endpoint.auth())
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def send(self, message: pb.AgentMessage) -> None:
        self._outgoing.put(message)

    def close(self) -> None:
        self._outgoing.put(None)
        self._reader.join(timeout=10)

    def wait_closed(self) -> grpc.RpcError | None:
        self._reader.join(timeout=10)
        assert not self._reader.is_alive()
        return self.error

    def _messages(self) -> Iterator[pb.AgentMessage]:
        while (message := self._outgoing.get()) is not None:
            yield message

    def _read(self) -> None:
        try:
            for command in self._call:
                self.commands.put(command)
        except grpc.RpcError as exc:
            self.error = exc


def hello(
    name: str = "node-a",
    running: dict[int, dict[int, int]] | None = None,
    exits: list[pb.JobExit] | None = None,
    instance: str = INSTANCE,
    attempt: int = 1,
    ports: list[int] | None = None,
) -> pb.AgentMessage:
    """`running`: job -> rank -> GPU index, each of `attempt`, whose groups had `ports`."""
    jobs = [
        pb.RunningJob(
            job_id=job_id,
            attempt=attempt,
            ranks=[pb.RankAssignment(rank=r, gpu_index=g) for r, g in ranks.items()],
            rendezvous_ports=ports or [],
        )
        for job_id, ranks in (running or {}).items()
    ]
    return pb.AgentMessage(
        hello=pb.Hello(node_name=name, running=jobs, exits=exits or [], instance=instance)
    )


def allocate(
    endpoint: Endpoint,
    job_id: int,
    ranks: dict[int, int],
    *,
    node: str = "node-a",
    attempt: int = 1,
    instance: str = INSTANCE,
    at: datetime = NOW,
) -> None:
    """What the loop's placement (at `at`) and a launch to agent process `instance` leave
    in the database: the job's allocations of `attempt` on `node` (rank -> GPU index)."""
    with transaction(endpoint.factory) as session:
        session.get_one(Job, job_id).attempts = attempt
        gpus = dict(
            session.execute(
                select(GPU.index, GPU.id)
                .join(Node, Node.id == GPU.node_id)
                .where(Node.name == node)
            ).all()
        )
        session.add_all(
            Allocation(
                job_id=job_id,
                gpu_id=gpus[index],
                rank=rank,
                lease_iterations=50,
                attempt=attempt,
                agent_instance=instance_digest(instance),
                created_at=at,
            )
            for rank, index in ranks.items()
        )


def add_job(endpoint: Endpoint) -> int:
    spec = JobSpec(name="j", workload="digits-mlp", workers=2, max_iterations=10)
    with transaction(endpoint.factory) as session:
        user = get_or_create_user(session, "alice")
        job = submit(session, spec, Principal("user", user.id, user.name, False))
        return job.id


def launch(endpoint: Endpoint, job_id: int, start_iteration: int = 0, attempt: int = 1) -> Launch:
    with endpoint.factory() as session:
        spec = session.get_one(Job, job_id).spec
    workers = tuple(Worker(rank, 0, 0, "node-a", rank, "127.0.0.1") for rank in range(2))
    return Launch(job_id, spec, workers, {}, start_iteration, 50, attempt)


def record(iteration: int, step: float = 0.1) -> pb.IterationRecord:
    return pb.IterationRecord(
        iteration=iteration,
        step_seconds=step,
        compute_seconds=step * 0.8,
        comm_seconds=step * 0.2,
        samples_per_second=640.0,
        loss=2.0 / iteration,
        utilization=0.5,
        peak_memory_bytes=1 << 20,
        bytes_communicated=4096,
    )


def test_calls_without_a_cluster_token_are_refused_and_change_nothing(
    endpoint: Endpoint,
) -> None:
    for metadata, needle in (
        ([], "missing cluster token"),
        ([("authorization", "Bearer not-a-token")], "invalid or revoked"),
        (endpoint.auth(endpoint.user_token), "user token cannot act as an agent"),
    ):
        with pytest.raises(grpc.RpcError) as refused:
            endpoint.stub.Register(register_request(), metadata=metadata)
        assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED
        assert needle in str(refused.value.details())
        stream = endpoint.stub.Connect(iter([hello()]), metadata=metadata)
        with pytest.raises(grpc.RpcError) as refused:
            next(stream)
        assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED
    assert endpoint.count(Node) == 0


def test_a_second_endpoint_on_a_taken_port_fails_to_start(endpoint: Endpoint) -> None:
    """gRPC would share the port (SO_REUSEPORT) and the kernel split the agents'
    connections between two schedulers of different databases."""
    service = AgentService(endpoint.factory, endpoint.dispatcher, endpoint.writer, 0.5)
    port = int(endpoint.address.rsplit(":", 1)[1])
    with pytest.raises(OSError, match="cannot bind the agents' gRPC endpoint.*taken"):
        start_server(
            service, TokenVerifier(endpoint.factory, 0), GrpcSettings(host="127.0.0.1", port=port)
        )
    assert endpoint.stub.Register(register_request(), metadata=endpoint.auth()).node_id


def test_agents_of_protocol_v1_are_told_to_upgrade_and_change_nothing(
    endpoint: Endpoint,
) -> None:
    """An old agent's calls, byte for byte: v1's Register and Connect messages are v2's
    with the same fields (its spec and profile fields never appear in them)."""
    channel = grpc.insecure_channel(endpoint.address)
    try:
        register = channel.unary_unary(
            "/jigsaw.v1.AgentService/Register",
            request_serializer=pb.RegisterRequest.SerializeToString,
            response_deserializer=pb.RegisterResponse.FromString,
        )
        connect = channel.stream_stream(
            "/jigsaw.v1.AgentService/Connect",
            request_serializer=pb.AgentMessage.SerializeToString,
            response_deserializer=pb.SchedulerMessage.FromString,
        )
        with pytest.raises(grpc.RpcError) as refused:
            register(register_request(), metadata=endpoint.auth())
        assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert refused.value.details() == (
            f"this scheduler speaks jigsaw.v2; upgrade the agent to {jigsaw.__version__}"
        )
        with pytest.raises(grpc.RpcError) as refused:
            next(connect(iter([hello()]), metadata=endpoint.auth()))
        assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert "upgrade the agent" in str(refused.value.details())
        # A token is still needed to learn even that.
        with pytest.raises(grpc.RpcError) as refused:
            register(register_request(), metadata=[])
        assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED
    finally:
        channel.close()
    assert endpoint.count(Node) == 0


@pytest.mark.parametrize(
    ("request_", "needle"),
    [
        (pb.RegisterRequest(node_name="", agent_version="x"), "not a DNS name"),
        (pb.RegisterRequest(node_name="bad name!", agent_version="x"), "not a DNS name"),
        # `$` alone would accept it, and it would show as a second `local-0`.
        (pb.RegisterRequest(node_name="local-0\n", agent_version="x"), "not a DNS name"),
        (
            pb.RegisterRequest(
                node_name="node-a",
                gpus=[pb.Gpu(index=0, kind="k"), pb.Gpu(index=0, kind="k")],
            ),
            "unique",
        ),
        (pb.RegisterRequest(node_name="node-a", gpus=[pb.Gpu(index=-1, kind="k")]), "unique"),
        (pb.RegisterRequest(node_name="node-a", gpus=[pb.Gpu(index=0, kind="")]), "kind"),
        (
            pb.RegisterRequest(node_name="node-a", gpus=[pb.Gpu(index=0, kind="k", max_jobs=65)]),
            "max_jobs must be 0-64",
        ),
        (pb.RegisterRequest(node_name="node-a", instance=""), "instance must be"),
        (pb.RegisterRequest(node_name="node-a", instance="short"), "instance must be"),
    ],
)
def test_malformed_registrations_are_invalid_arguments(
    endpoint: Endpoint, request_: pb.RegisterRequest, needle: str
) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        endpoint.stub.Register(request_, metadata=endpoint.auth())
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert needle in str(refused.value.details())
    assert endpoint.count(Node) == 0 and endpoint.count(GPU) == 0


def test_a_stream_must_open_with_hello_from_a_registered_node(endpoint: Endpoint) -> None:
    heartbeat = pb.AgentMessage(heartbeat=pb.Heartbeat())
    error = Stream(endpoint, heartbeat).wait_closed()
    assert error is not None and error.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "must be a hello" in str(error.details())

    error = Stream(endpoint, hello("never-registered")).wait_closed()
    assert error is not None and error.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert endpoint.dispatcher.connected() == frozenset()


def test_register_is_idempotent(endpoint: Endpoint) -> None:
    first = endpoint.stub.Register(register_request(gpus=2), metadata=endpoint.auth())
    again = endpoint.stub.Register(register_request(gpus=3), metadata=endpoint.auth())
    assert (first.agent_id, first.node_id) == (again.agent_id, again.node_id)
    assert first.heartbeat_interval_seconds == 0.5
    assert endpoint.count(Node) == 1 and endpoint.count(GPU) == 3


def test_each_gpu_s_job_limit_reaches_the_policy(endpoint: Endpoint) -> None:
    """What the agent runs at once on a slot is what packing may place there; an agent
    that does not say (0) gets a pair."""
    request = register_request()
    request.gpus[0].max_jobs = 4
    endpoint.stub.Register(request, metadata=endpoint.auth())
    with endpoint.factory() as session:
        snapshot = build_snapshot(session, NOW)
    assert [gpu.max_jobs for node in snapshot.nodes for gpu in node.gpus] == [4, 2]


def test_launch_reports_and_exit_round_trip(endpoint: Endpoint, tmp_path: Path) -> None:
    endpoint.stub.Register(register_request(), metadata=endpoint.auth())
    stream = Stream(endpoint, hello())
    job_id, other_job = add_job(endpoint), add_job(endpoint)
    try:
        _wait(lambda: endpoint.dispatcher.connected() == frozenset({"node-a"}))
        assert endpoint.dispatcher.launch(launch(endpoint, job_id))
        command = stream.commands.get(timeout=10)
        assert command.WhichOneof("command") == "launch"
        sent = command.launch
        assert (sent.job_id, sent.world_size, sent.master_addr) == (job_id, 2, "127.0.0.1")
        assert [(r.rank, r.gpu_index) for r in sent.ranks] == [(0, 0), (1, 1)]
        assert 29500 <= sent.master_port <= 29999
        assert sent.checkpoint_dir == str(tmp_path / f"job-{job_id}")
        assert sent.checkpoint_every == CHECKPOINT_EVERY
        assert sent.attempt == 1
        # A second launch while the first run's processes live is refused.
        assert not endpoint.dispatcher.launch(
            launch(endpoint, job_id, start_iteration=3, attempt=2)
        )

        stream.send(
            pb.AgentMessage(
                reports=pb.IterationReports(
                    jobs=[
                        pb.JobIterations(job_id=job_id, records=[record(1), record(2)]),
                        # Not this agent's job: dropped, not written.
                        pb.JobIterations(job_id=other_job, records=[record(1)]),
                    ]
                )
            )
        )
        stream.send(pb.AgentMessage(log=pb.LogTail(job_id=job_id, rank=1, message="hi")))
        stream.send(
            pb.AgentMessage(
                evaluation=pb.Evaluation(job_id=job_id, iteration=2, metrics={"accuracy": 0.5})
            )
        )
        stream.send(
            pb.AgentMessage(
                exit=pb.JobExit(
                    job_id=job_id,
                    attempt=1,
                    outcome=pb.OUTCOME_SUCCEEDED,
                    iteration=2,
                    metrics={"accuracy": 0.9},
                )
            )
        )
        _wait(lambda: endpoint.count(JobLog) == 1)
        assert endpoint.writer.flush()
        with endpoint.factory() as session:
            rows = session.execute(select(IterationMetric.job_id, IterationMetric.iteration)).all()
            job = session.get_one(Job, job_id)
            assert sorted(rows) == [(job_id, 1), (job_id, 2)]
            assert job.iterations_done == 2
            assert job.metrics == {"accuracy": 0.5}
        assert endpoint.dropped("not_allocated") == 1  # the other job's one record

        [report] = _poll(endpoint.dispatcher)
        assert (report.job_id, report.outcome, report.iterations_done) == (
            job_id,
            RunOutcome.SUCCEEDED,
            2,
        )
        assert report.metrics == {"accuracy": 0.9}
        assert endpoint.dispatcher.active() == {}
    finally:
        stream.close()


def test_an_invalid_record_is_dropped_and_the_stream_goes_on(endpoint: Endpoint) -> None:
    # Trial code can forge any record: a bad one must not end the stream, which carries
    # the agent's other jobs and its heartbeats (an ended stream makes the agent exit).
    endpoint.stub.Register(register_request(), metadata=endpoint.auth())
    stream = Stream(endpoint, hello())
    job_id = add_job(endpoint)
    try:
        _wait(lambda: endpoint.dispatcher.connected() == frozenset({"node-a"}))
        assert endpoint.dispatcher.launch(launch(endpoint, job_id))
        backwards, unknown = record(4), record(5)
        backwards.progress, unknown.progress = -1.0, float("nan")
        bad = [record(1, step=float("nan")), record(2, step=-1.0), pb.IterationRecord()]
        bad += [backwards, unknown]
        for records in (bad, [record(3)]):
            stream.send(
                pb.AgentMessage(
                    reports=pb.IterationReports(
                        jobs=[pb.JobIterations(job_id=job_id, records=records)]
                    )
                )
            )
        _wait(lambda: endpoint.count(IterationMetric) == 1)
        assert endpoint.dispatcher.connected() == frozenset({"node-a"})
        assert stream.error is None
    finally:
        stream.close()


def test_nul_and_non_finite_values_from_trial_code_are_scrubbed_where_they_enter(
    endpoint: Endpoint,
) -> None:
    """PostgreSQL refuses NUL in text and non-finite numbers in JSON; SQLite stores
    both. On both, NUL becomes U+FFFD and a non-finite metric is dropped."""
    endpoint.stub.Register(register_request(), metadata=endpoint.auth())
    stream = Stream(endpoint, hello())
    job_id = add_job(endpoint)
    try:
        _wait(lambda: endpoint.dispatcher.connected() == frozenset({"node-a"}))
        assert endpoint.dispatcher.launch(launch(endpoint, job_id))
        diverged = record(1)
        diverged.loss, diverged.utilization = float("inf"), float("nan")
        stream.send(
            pb.AgentMessage(
                reports=pb.IterationReports(
                    jobs=[pb.JobIterations(job_id=job_id, records=[diverged])]
                )
            )
        )
        stream.send(pb.AgentMessage(log=pb.LogTail(job_id=job_id, level="IN\0FO", message="a\0b")))
        metrics = {"mse": float("inf"), "acc\0": float("nan"), "ok\0": 0.5}
        stream.send(
            pb.AgentMessage(evaluation=pb.Evaluation(job_id=job_id, iteration=1, metrics=metrics))
        )
        stream.send(
            pb.AgentMessage(
                exit=pb.JobExit(
                    job_id=job_id,
                    attempt=1,
                    outcome=pb.OUTCOME_FAILED,
                    error_tail="boom\0",
                    metrics=metrics,
                )
            )
        )
        [report] = _poll(endpoint.dispatcher)
        assert endpoint.writer.flush()
        assert "\0" not in report.message and "boom\ufffd" in report.message
        assert report.metrics == {"ok\ufffd": 0.5}
        with endpoint.factory() as session:
            (log,) = session.scalars(select(JobLog)).all()
            assert (log.level, log.message) == ("IN\ufffdFO", "a\ufffdb")
            assert session.get_one(Job, job_id).metrics == {"ok\ufffd": 0.5}
            (row,) = session.scalars(select(IterationMetric)).all()
            assert (row.iteration, row.loss, row.utilization) == (1, None, None)
    finally:
        stream.close()


@contextmanager
def _running(endpoint: Endpoint, gpus: dict[int, int]) -> Iterator[tuple[int, Stream]]:
    """A job whose ranks run on node-a's `gpus` (rank -> GPU index), as its agent says
    when it reconnects after a scheduler restart; the job's id and the agent's stream."""
    endpoint.stub.Register(register_request(), metadata=endpoint.auth())
    job_id = add_job(endpoint)
    allocate(endpoint, job_id, gpus)
    stream = Stream(endpoint, hello(running={job_id: gpus}))
    try:
        _wait(lambda: endpoint.dispatcher.active() == {job_id: frozenset({"node-a"})})
        yield job_id, stream
    finally:
        stream.close()


def test_stop_and_suspend_go_to_each_node_once(endpoint: Endpoint) -> None:
    with _running(endpoint, {0: 0, 1: 1}) as (job_id, stream):
        endpoint.dispatcher.suspend(job_id)
        endpoint.dispatcher.suspend(job_id)
        endpoint.dispatcher.stop(job_id)
        endpoint.dispatcher.stop(job_id, "node-a")
        kinds = [stream.commands.get(timeout=10).WhichOneof("command") for _ in range(2)]
        assert kinds == ["suspend", "stop"]
        assert stream.commands.empty()


def test_an_in_place_shrink_round_trip(endpoint: Endpoint) -> None:
    """The command carries the smaller gang's launch on a new port; the agent's JobShrunk
    of the run becomes a SHRUNK report, one of another attempt is dropped."""
    with _running(endpoint, {0: 0, 1: 1}) as (job_id, stream):
        full = launch(endpoint, job_id, start_iteration=7)
        smaller = replace(full, workers=full.workers[:1])
        assert not endpoint.dispatcher.resize_in_place(replace(smaller, attempt=2))  # not the run's
        assert endpoint.dispatcher.resize_in_place(smaller)
        command = stream.commands.get(timeout=10)
        assert command.WhichOneof("command") == "shrink"
        sent = command.shrink.launch
        assert [(r.rank, r.gpu_index) for r in sent.ranks] == [(0, 0)]
        assert (sent.world_size, sent.attempt, sent.start_iteration) == (1, 1, 7)

        ranks = [pb.RankAssignment(rank=0, gpu_index=0)]
        stream.send(pb.AgentMessage(shrunk=pb.JobShrunk(job_id=job_id, attempt=2, ranks=ranks)))
        stream.send(
            pb.AgentMessage(shrunk=pb.JobShrunk(job_id=job_id, attempt=1, iteration=9, ranks=ranks))
        )
        _wait(lambda: endpoint.dropped("stale_attempt") == 1)
        reports = _poll(endpoint.dispatcher)
        assert [(r.outcome, r.iterations_done, r.node, r.ranks) for r in reports] == [
            (RunOutcome.SHRUNK, 9, "node-a", (0,))
        ]


@pytest.mark.parametrize(("low", "high", "resizes"), [(29500, 29999, 100), (29500, 29501, 4)])
def test_an_in_place_resize_gets_a_rendezvous_port_its_job_never_held(
    engine: Engine, tmp_path: Path, low: int, high: int, resizes: int
) -> None:
    """The kept ranks re-form the group in their processes, where torch's rendezvous
    would reuse a store still served on a port the job held before, with that group's
    keys: a port new to the job while the range has one, never the current one."""
    with agent_endpoint(engine, tmp_path, ports=RendezvousPorts(low, high)) as endpoint:
        endpoint.stub.Register(register_request(), metadata=endpoint.auth())
        stream = Stream(endpoint, hello())
        job_id = add_job(endpoint)
        try:
            _wait(lambda: endpoint.dispatcher.connected() == frozenset({"node-a"}))
            full = launch(endpoint, job_id)
            assert endpoint.dispatcher.launch(full)
            ports = [stream.commands.get(timeout=10).launch.master_port]
            smaller = replace(full, workers=full.workers[:1])
            for _ in range(resizes):
                assert endpoint.dispatcher.resize_in_place(smaller)
                ports.append(stream.commands.get(timeout=10).shrink.launch.master_port)
        finally:
            stream.close()
    assert all(low <= port <= high for port in ports)
    assert all(now != before for before, now in itertools.pairwise(ports))
    assert len(set(ports)) == min(len(ports), high - low + 1)


def test_a_run_claimed_after_a_restart_never_gets_a_rendezvous_port_its_agent_reports(
    engine: Engine, tmp_path: Path
) -> None:
    """After a scheduler restart its agent's Hello is the only account of the ports the
    run's groups had: an in-place resize gets none of them."""
    with agent_endpoint(engine, tmp_path, ports=RendezvousPorts(29500, 29599)) as endpoint:
        endpoint.stub.Register(register_request(), metadata=endpoint.auth())
        job_id = add_job(endpoint)
        allocate(endpoint, job_id, {0: 0, 1: 1})
        held = [29599, *range(29500, 29598)]  # the launch's, then 98 resizes'
        stream = Stream(endpoint, hello(running={job_id: {0: 0, 1: 1}}, ports=held))
        try:
            _wait(lambda: endpoint.dispatcher.active() == {job_id: frozenset({"node-a"})})
            full = launch(endpoint, job_id)
            assert endpoint.dispatcher.resize_in_place(replace(full, workers=full.workers[:1]))
            assert stream.commands.get(timeout=10).shrink.launch.master_port == 29598
        finally:
            stream.close()


def test_a_shrink_whose_report_was_lost_is_claimed_not_stopped(endpoint: Endpoint) -> None:
    """A reconnecting agent runs fewer ranks of the run than the database holds, as an
    in-place shrink leaves them: taken as that shrink, not stopped as a stray."""
    endpoint.stub.Register(register_request(gpus=3), metadata=endpoint.auth())
    shrunk, other = add_job(endpoint), add_job(endpoint)
    allocate(endpoint, shrunk, {0: 0, 1: 1})
    allocate(endpoint, other, {0: 2})
    # Rank 0's GPU gone: not what a shrink leaves.
    stream = Stream(endpoint, hello(running={shrunk: {0: 0}, other: {0: 1}}))
    try:
        _wait(lambda: endpoint.dispatcher.active() == {shrunk: frozenset({"node-a"})})
        [report] = _poll(endpoint.dispatcher)
        assert (report.job_id, report.outcome, report.ranks) == (shrunk, RunOutcome.SHRUNK, (0,))
        command = stream.commands.get(timeout=10)
        assert (command.WhichOneof("command"), command.stop.job_id) == ("stop", other)
    finally:
        stream.close()


def test_a_growth_under_way_is_claimed_as_the_run_it_was_and_its_report_adds_the_ranks(
    endpoint: Endpoint,
) -> None:
    """A scheduler that restarted while a growth in place was asked (the new GPU held
    since, later than the run's) sees the agent run the ranks it had: the run, not a
    shrink whose report was lost, and the new GPU stays the job's until the agent's
    JobShrunk adds it."""
    endpoint.stub.Register(register_request(gpus=2), metadata=endpoint.auth())
    growing = add_job(endpoint)
    allocate(endpoint, growing, {0: 0})
    allocate(endpoint, growing, {1: 1}, at=NOW + timedelta(seconds=5))
    stream = Stream(endpoint, hello(running={growing: {0: 0}}))
    try:
        _wait(lambda: endpoint.dispatcher.active() == {growing: frozenset({"node-a"})})
        assert endpoint.dispatcher.poll(NOW) == [] and stream.commands.empty()
        grown = [pb.RankAssignment(rank=0, gpu_index=0), pb.RankAssignment(rank=1, gpu_index=1)]
        message = pb.JobShrunk(job_id=growing, attempt=1, iteration=12, ranks=grown)
        stream.send(pb.AgentMessage(shrunk=message))
        [report] = _poll(endpoint.dispatcher)
        assert (report.outcome, report.iterations_done, report.ranks) == (
            RunOutcome.SHRUNK,
            12,
            (0, 1),
        )
    finally:
        stream.close()


def test_a_reconfiguration_reaches_every_node_of_the_job(endpoint: Endpoint) -> None:
    with _running(endpoint, {0: 0}) as (job_id, stream):
        endpoint.dispatcher.reconfigure(job_id, 3, {"full_fraction": 0.5, "partial_depth": 0.5})
        endpoint.dispatcher.reconfigure(job_id + 1, 1, {})  # runs nowhere: nothing sent
        command = stream.commands.get(timeout=10)
        assert command.WhichOneof("command") == "reconfigure"
        assert (command.reconfigure.job_id, command.reconfigure.config_version) == (job_id, 3)
        assert command.reconfigure.spb == pb.SPBConfig(full_fraction=0.5, partial_depth=0.5)
        assert stream.commands.empty()


def _poll(dispatcher: AgentDispatcher) -> list[Report]:
    reports: list[Report] = []
    _wait(lambda: bool(reports.extend(dispatcher.poll(NOW)) or reports))
    return reports


def _wait(condition: Callable[[], bool], seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {seconds} s")
        time.sleep(0.02)


def test_after_a_restart_the_hello_says_what_runs_where_and_what_ended(
    endpoint: Endpoint,
) -> None:
    endpoint.stub.Register(register_request(gpus=3), metadata=endpoint.auth())
    running, finished, queued = add_job(endpoint), add_job(endpoint), add_job(endpoint)
    allocate(endpoint, running, {0: 1})
    allocate(endpoint, finished, {0: 0})
    done = pb.JobExit(job_id=finished, attempt=1, outcome=pb.OUTCOME_SUCCEEDED, iteration=10)
    stream = Stream(endpoint, hello(running={running: {0: 1}}, exits=[done]))
    try:
        _wait(lambda: endpoint.dispatcher.connected() == frozenset({"node-a"}))
        # The exit that could not be sent during the outage counts as this node's.
        assert endpoint.dispatcher.active() == {
            running: frozenset({"node-a"}),
            finished: frozenset({"node-a"}),
        }
        [report] = _poll(endpoint.dispatcher)
        assert (report.job_id, report.outcome) == (finished, RunOutcome.SUCCEEDED)

        # GPU 1 is still held by the running job's processes while they stop: a launch
        # onto it waits. (Beside a run that goes on, it would be sent: sharing a GPU is
        # the policy's decision and the agent's to refuse.)
        endpoint.dispatcher.stop(running)
        spec = launch(endpoint, queued).spec
        onto_busy = Launch(queued, spec, (Worker(0, 0, 0, "node-a", 1),), {}, 0, 50, 1)
        assert not endpoint.dispatcher.launch(onto_busy)
        free = Launch(queued, spec, (Worker(0, 0, 0, "node-a", 2),), {}, 0, 50, 1)
        assert endpoint.dispatcher.launch(free)

        # Declared dead: nothing is believed to run there any more.
        endpoint.dispatcher.node_lost("node-a")
        assert endpoint.dispatcher.active() == {}
    finally:
        stream.close()


def _new_leader(endpoint: Endpoint) -> SchedulerService:
    """The rounds of a scheduler that just took over: its dispatcher (the endpoint's,
    fresh) has heard from no agent yet."""
    return SchedulerService(endpoint.factory, endpoint.dispatcher, LOOP_SETTINGS, "fifo")


def test_a_hello_landing_mid_round_does_not_requeue_the_job_it_claims(
    endpoint: Endpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A restarted scheduler (this fresh dispatcher) with a job RUNNING on node-a; the
    # agent's Hello lands right after the round's reconciliation read what runs where,
    # as agents redialling a new leader do.
    endpoint.stub.Register(register_request(), metadata=endpoint.auth())
    job_id = add_job(endpoint)
    allocate(endpoint, job_id, {0: 0, 1: 1})
    with transaction(endpoint.factory) as session:
        session.get_one(Job, job_id).state = JobState.RUNNING
    streams: list[Stream] = []
    reads = endpoint.dispatcher.active

    def hello_lands_after_this_read() -> dict[int, frozenset[str]]:
        seen = reads()
        if not streams and sys._getframe(1).f_code.co_name == "_reconcile":
            streams.append(Stream(endpoint, hello(running={job_id: {0: 0, 1: 1}})))
            _wait(lambda: endpoint.dispatcher.connected() == frozenset({"node-a"}))
        return seen

    monkeypatch.setattr(endpoint.dispatcher, "active", hello_lands_after_this_read)
    service = _new_leader(endpoint)
    try:
        for _ in range(2):  # the round the Hello lands in, and the next
            endpoint.writer.flush()
            assert service.run_round(datetime.now(UTC)).requeued == 0
        with endpoint.factory() as session:
            job = session.get_one(Job, job_id)
            assert (job.state, job.attempts) == (JobState.RUNNING, 1)
        assert streams[0].commands.empty()  # not told to stop it
    finally:
        for stream in streams:
            stream.close()


def test_a_drained_job_is_queued_again_only_once_its_agent_said_its_processes_exited(
    endpoint: Endpoint,
) -> None:
    # A restarted scheduler (this fresh dispatcher): `drain --now` suspended a job on
    # node-a, whose agent, alive, has not redialled yet; its processes may still be
    # writing their checkpoint there.
    endpoint.stub.Register(register_request(), metadata=endpoint.auth())
    job_id = add_job(endpoint)
    allocate(endpoint, job_id, {0: 0, 1: 1})
    with transaction(endpoint.factory) as session:
        job = session.get_one(Job, job_id)
        job.state, job.suspended_by = JobState.SUSPENDED, SuspendedBy.DRAIN
        for allocation in session.scalars(select(Allocation)):
            allocation.released_at = NOW
        session.scalars(select(Node)).one().drained_at = NOW
        for agent in session.scalars(select(Agent)):
            agent.alive, agent.last_heartbeat_at = True, datetime.now(UTC)
    service = _new_leader(endpoint)

    def round_leaves(state: JobState) -> None:
        service.run_round(datetime.now(UTC))
        with endpoint.factory() as session:
            assert session.get_one(Job, job_id).state == state

    round_leaves(JobState.SUSPENDED)  # unheard: it would run twice if queued now
    stream = Stream(endpoint, hello(running={job_id: {0: 0, 1: 1}}))
    try:
        _wait(lambda: endpoint.dispatcher.active() == {job_id: frozenset({"node-a"})})
        round_leaves(JobState.SUSPENDED)  # its processes are told to checkpoint and exit
        assert stream.commands.get(timeout=10).WhichOneof("command") == "suspend"
        exited = pb.JobExit(job_id=job_id, attempt=1, outcome=pb.OUTCOME_SUSPENDED)
        stream.send(pb.AgentMessage(exit=exited))
        _wait(lambda: endpoint.dispatcher.active() == {})
        round_leaves(JobState.QUEUED)
    finally:
        stream.close()


def test_after_a_takeover_no_job_that_ran_starts_until_every_live_agent_redialled(
    endpoint: Endpoint,
) -> None:
    # A restarted scheduler (this fresh dispatcher). The job ran on node-a until a
    # minute ago and was queued again; node-a's agent, alive, has not redialled (the
    # job's earlier processes may still be checkpointing there); node-b's has.
    other = "node-b-agent-process-1"
    endpoint.stub.Register(register_request(), metadata=endpoint.auth())
    endpoint.stub.Register(register_request("node-b", instance=other), metadata=endpoint.auth())
    job_id = add_job(endpoint)
    allocate(endpoint, job_id, {0: 0, 1: 1}, at=NOW - timedelta(minutes=5))
    with transaction(endpoint.factory) as session:
        for allocation in session.scalars(select(Allocation)):
            allocation.released_at = NOW - timedelta(minutes=1)
        for agent in session.scalars(select(Agent)):
            agent.alive, agent.last_heartbeat_at = True, datetime.now(UTC)
    streams = [Stream(endpoint, hello("node-b", instance=other))]
    service = _new_leader(endpoint)
    try:
        _wait(lambda: endpoint.dispatcher.connected() == frozenset({"node-b"}))
        service.run_round(datetime.now(UTC))
        with endpoint.factory() as session:
            job = session.get_one(Job, job_id)
            assert (job.state, job.attempts) == (JobState.QUEUED, 1)
            assert "node-a have not yet told this scheduler" in str(job.pending_reason)
        assert streams[0].commands.empty()

        streams.append(Stream(endpoint, hello()))
        _wait(lambda: endpoint.dispatcher.connected() == frozenset({"node-a", "node-b"}))
        service.run_round(datetime.now(UTC))
        with endpoint.factory() as session:
            assert session.get_one(Job, job_id).state == JobState.RUNNING
    finally:
        for stream in streams:
            stream.close()


def _profile_report(job_id: int, **patch: Any) -> pb.ModelProfileReport:
    stage = pb.StageProfile(
        forward_seconds=0.01,
        backward_input_seconds=0.01,
        backward_weight_seconds=0.02,
        activation_bytes=1024,
        parameter_bytes=256,
    )
    profile: dict[str, Any] = {
        "workload": "digits-mlp",
        "per_worker_batch": 32,
        "stages": [stage, stage],
        **patch,
    }
    return pb.ModelProfileReport(
        job_id=job_id,
        workload="digits-mlp",
        device_kind="virtual-cpu",
        profile=pb.ModelProfile(**profile),
    )


def test_profile_reports_are_stored_and_malformed_ones_dropped(endpoint: Endpoint) -> None:
    endpoint.stub.Register(register_request(), metadata=endpoint.auth())
    stream = Stream(endpoint, hello())
    job_id, other_job = add_job(endpoint), add_job(endpoint)
    _wait(lambda: endpoint.dispatcher.connected() == frozenset({"node-a"}))
    assert endpoint.dispatcher.launch(launch(endpoint, job_id))
    stream.send(pb.AgentMessage(profile=_profile_report(other_job, per_worker_batch=99)))
    stream.send(pb.AgentMessage(profile=_profile_report(job_id)))
    _wait(lambda: endpoint.count(ModelProfile) == 1)
    with endpoint.factory() as session:
        stored = session.scalars(select(ModelProfile)).one()
        # Not this agent's job: dropped; this one's stored under its batch and device.
        assert (stored.workload, stored.key) == ("digits-mlp", "virtual-cpu/batch-32")
        assert len(stored.data["stages"]) == 2
    # Malformed (trial code can forge profiles): dropped, and the stream goes on.
    for figure in (-1.0, math.nan):
        stages = [pb.StageProfile(forward_seconds=figure)]
        stream.send(pb.AgentMessage(profile=_profile_report(job_id, stages=stages)))
    stream.send(pb.AgentMessage(log=pb.LogTail(job_id=job_id, message="still here")))
    _wait(lambda: endpoint.count(JobLog) == 1)
    assert stream.error is None
    assert endpoint.count(ModelProfile) == 1
    stream.close()
