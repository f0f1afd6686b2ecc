"""What an agent may change, over real gRPC on loopback, on both databases.

A cluster token lets a process speak as an agent, not as any agent: a rogue with a
valid token changes nothing the scheduler did not allocate to its own node (exits,
running claims, reports, logs, evaluations, profiles), cannot take another node's name
while that node's agent is connected, and a registered node attracts no placement
before its stream is up. The scheduler's side is the real one: `SchedulerService`
rounds over the real `AgentDispatcher` and `AgentService`.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import grpc
import pytest
from sqlalchemy import Engine, select

from jigsaw.jobspec import JobSpec
from jigsaw.proto.v2 import agent_pb2 as pb
from scheduler.core import rounds
from scheduler.core.rounds import RoundResult
from scheduler.core.states import JobState
from scheduler.db import transaction
from scheduler.loop import SchedulerService
from scheduler.models.jobs import submit
from scheduler.models.users import Principal, get_or_create_user
from scheduler.orm import GPU, Agent, IterationMetric, Job, JobLog, ModelProfile, Node
from scheduler.settings import SchedulerSettings
from tests.agent_endpoint import Endpoint, agent_endpoint
from tests.test_agent_protocol import (
    INSTANCE,
    Stream,
    _profile_report,
    _wait,
    allocate,
    hello,
    record,
    register_request,
)

ROGUE = "a-rogue-agent-process"
SETTINGS = SchedulerSettings(
    policy="fifo", round_seconds=0.01, lease_iterations=50, agent_timeout_seconds=30
)


@pytest.fixture
def endpoint(engine: Engine, tmp_path: Path) -> Iterator[Endpoint]:
    with agent_endpoint(engine, tmp_path) as running:
        yield running


def _round(endpoint: Endpoint) -> RoundResult:
    endpoint.writer.flush()  # heartbeats in: who is alive
    return SchedulerService(endpoint.factory, endpoint.dispatcher, SETTINGS, "fifo").run_round(
        datetime.now(UTC)
    )


def _submit(endpoint: Endpoint, workers: int = 2) -> int:
    spec = JobSpec(name="j", workload="digits-mlp", workers=workers, max_iterations=1000)
    with transaction(endpoint.factory) as session:
        user = get_or_create_user(session, "alice")
        return submit(session, spec, Principal("user", user.id, user.name, False)).id


def _job(endpoint: Endpoint, job_id: int) -> Job:
    with endpoint.factory() as session:
        return session.get_one(Job, job_id)


def _command(stream: Stream) -> pb.SchedulerMessage:
    return stream.commands.get(timeout=10)


def _reports(job_id: int, *iterations: int) -> pb.AgentMessage:
    return pb.AgentMessage(
        reports=pb.IterationReports(
            jobs=[pb.JobIterations(job_id=job_id, records=[record(i) for i in iterations])]
        )
    )


def _exit(job_id: int, attempt: int, iteration: int = 999) -> pb.JobExit:
    return pb.JobExit(
        job_id=job_id,
        attempt=attempt,
        outcome=pb.OUTCOME_SUCCEEDED,
        iteration=iteration,
        metrics={"accuracy": 1.0},
    )


def _refused(call: grpc.RpcError | None) -> str:
    assert call is not None and call.code() is grpc.StatusCode.ALREADY_EXISTS, call
    return str(call.details())


def test_a_rogue_agent_with_a_valid_cluster_token_changes_nothing_it_was_not_allocated(
    endpoint: Endpoint,
) -> None:
    endpoint.stub.Register(register_request("node-a"), metadata=endpoint.auth())
    victim = Stream(endpoint, hello("node-a"))
    _wait(lambda: endpoint.dispatcher.connected() == frozenset({"node-a"}))
    job_id = _submit(endpoint)
    assert _round(endpoint).started == 1
    launched = _command(victim).launch
    assert (launched.job_id, launched.attempt) == (job_id, 1)
    victim.send(_reports(job_id, 1))
    _wait(lambda: endpoint.count(IterationMetric) == 1)

    # The rogue registers a node of its own with the same cluster token and claims the
    # victim's job in every way the protocol has.
    endpoint.stub.Register(register_request("rogue", instance=ROGUE), metadata=endpoint.auth())
    rogue = Stream(
        endpoint,
        hello("rogue", running={job_id: {0: 0, 1: 1}}, exits=[_exit(job_id, 1)], instance=ROGUE),
    )
    rogue.send(_reports(job_id, 2, 3, 4))
    rogue.send(pb.AgentMessage(log=pb.LogTail(job_id=job_id, rank=0, message="injected")))
    rogue.send(pb.AgentMessage(evaluation=pb.Evaluation(job_id=job_id, metrics={"accuracy": 1.0})))
    rogue.send(pb.AgentMessage(profile=_profile_report(job_id)))
    rogue.send(pb.AgentMessage(exit=_exit(job_id, 1)))
    # Running claim, hello exit, 3 records, log, evaluation, profile, exit.
    _wait(lambda: endpoint.dropped("not_allocated") == 9)
    # The only command the rogue gets is to stop what it claimed: on its own node.
    stop = _command(rogue)
    assert (stop.WhichOneof("command"), stop.stop.job_id) == ("stop", job_id)

    # Nor can it take the victim's node over while the victim is connected.
    with pytest.raises(grpc.RpcError) as register:
        endpoint.stub.Register(
            register_request("node-a", gpus=8, instance=ROGUE), metadata=endpoint.auth()
        )
    assert "held by another live agent" in _refused(register.value)
    takeover = Stream(endpoint, hello("node-a", running={job_id: {0: 0, 1: 1}}, instance=ROGUE))
    assert "held by another live agent" in _refused(takeover.wait_closed())

    result = _round(endpoint)
    assert result.finished == 0 and result.requeued == 0
    job = _job(endpoint, job_id)
    assert (job.state, job.iterations_done, job.metrics) == (JobState.RUNNING, 1, {})
    endpoint.writer.flush()
    with endpoint.factory() as session:
        assert session.scalars(select(IterationMetric.iteration)).all() == [1]
        assert session.scalars(select(JobLog.message)).all() == []
        assert session.scalars(select(ModelProfile.id)).all() == []
        node = session.scalars(select(Node).where(Node.name == "node-a")).one()
        assert len(session.scalars(select(GPU).where(GPU.node_id == node.id)).all()) == 2
    assert endpoint.dispatcher.active() == {job_id: frozenset({"node-a"})}
    assert endpoint.dispatcher.connected() == frozenset({"node-a", "rogue"})
    assert victim.commands.empty()

    # The victim's own stream still counts.
    victim.send(_reports(job_id, 2))
    _wait(lambda: _job(endpoint, job_id).iterations_done == 2)
    victim.send(pb.AgentMessage(exit=_exit(job_id, 1, iteration=2)))
    _wait(lambda: _round(endpoint).finished == 1)
    assert _job(endpoint, job_id).state == JobState.SUCCEEDED
    rogue.close()
    victim.close()


def test_a_node_name_is_held_by_one_live_agent_process_at_a_time(endpoint: Endpoint) -> None:
    first, second, third = INSTANCE, "second-agent-process", "third-agent-process"
    endpoint.stub.Register(register_request(instance=first), metadata=endpoint.auth())
    holder = Stream(endpoint, hello(instance=first))
    _wait(lambda: endpoint.dispatcher.connected() == frozenset({"node-a"}))

    with pytest.raises(grpc.RpcError) as register:
        endpoint.stub.Register(register_request(instance=second), metadata=endpoint.auth())
    details = _refused(register.value)
    assert "node 'node-a' is held by another live agent process" in details
    assert "retry once it disconnects" in details
    _refused(Stream(endpoint, hello(instance=second)).wait_closed())

    # The holder itself may reconnect: its new stream replaces the old one.
    endpoint.stub.Register(register_request(instance=first), metadata=endpoint.auth())
    reconnected = Stream(endpoint, hello(instance=first))
    assert holder.wait_closed() is None
    reconnected.send(pb.AgentMessage(heartbeat=pb.Heartbeat()))

    # Once it is gone, the name is free.
    reconnected.close()
    _wait(lambda: endpoint.dispatcher.connected() == frozenset())
    endpoint.stub.Register(register_request(instance=second), metadata=endpoint.auth())
    silent = Stream(endpoint, hello(instance=second))
    _wait(lambda: endpoint.dispatcher.connected() == frozenset({"node-a"}))

    # A holder that falls silent (a hung process, a dead link) loses the name after the
    # agent timeout, and its stream is closed.
    def third_connects() -> bool:
        try:
            endpoint.stub.Register(register_request(instance=third), metadata=endpoint.auth())
        except grpc.RpcError as exc:
            _refused(exc)
            return False
        return True

    _wait(third_connects, seconds=30)
    taker = Stream(endpoint, hello(instance=third))
    assert silent.wait_closed() is None
    taker.close()


def test_claims_and_exits_of_another_attempt_or_agent_process_are_dropped(
    endpoint: Endpoint,
) -> None:
    endpoint.stub.Register(register_request(gpus=3), metadata=endpoint.auth())
    moved, restarted, current = _submit(endpoint), _submit(endpoint), _submit(endpoint)
    # `moved` runs attempt 2 here now; `restarted` was launched to an agent process
    # that has since died; `current` is this process's.
    allocate(endpoint, moved, {0: 0}, attempt=2)
    allocate(endpoint, restarted, {0: 1}, instance="a-dead-agent-process")
    allocate(endpoint, current, {0: 2})
    stream = Stream(
        endpoint,
        hello(
            running={moved: {0: 0}, restarted: {0: 1}, current: {0: 2}},
            exits=[_exit(moved, 1)],
        ),
    )
    _wait(lambda: endpoint.dropped("stale_attempt") == 2)
    assert endpoint.dropped("other_agent") == 1
    stops = {_command(stream).stop.job_id for _ in range(2)}
    assert stops == {moved, restarted}
    assert endpoint.dispatcher.active() == {current: frozenset({"node-a"})}
    # The current run's exit of another attempt does not end it either.
    stream.send(pb.AgentMessage(exit=_exit(current, 2)))
    _wait(lambda: endpoint.dropped("stale_attempt") == 3)
    assert endpoint.dispatcher.poll(datetime.now(UTC)) == []
    stream.close()


def test_a_registered_node_attracts_no_placement_until_its_stream_connects(
    endpoint: Endpoint,
) -> None:
    endpoint.stub.Register(register_request(), metadata=endpoint.auth())
    job_id = _submit(endpoint)
    result = _round(endpoint)
    # No lease: the job waits (and says why: no alive node has a GPU).
    assert [d.kind for d in result.decisions if d.job_id == job_id] == [rounds.UNPLACEABLE]
    with endpoint.factory() as session:
        assert session.scalars(select(Agent.alive)).all() == [False]

    stream = Stream(endpoint, hello())
    _wait(lambda: endpoint.dispatcher.connected() == frozenset({"node-a"}))
    result = _round(endpoint)
    assert rounds.LEASE in [d.kind for d in result.decisions if d.job_id == job_id]
    assert _command(stream).launch.spec.workers == 2
    stream.close()


def test_the_stream_needs_the_agent_process_key(endpoint: Endpoint) -> None:
    endpoint.stub.Register(register_request(), metadata=endpoint.auth())
    error = Stream(endpoint, hello(instance="")).wait_closed()
    assert error is not None and error.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "instance must be" in str(error.details())
    assert endpoint.dispatcher.connected() == frozenset()
