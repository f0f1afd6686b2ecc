"""The agent's gRPC client against the scheduler's real endpoint, and its outbox.

Reconnection, re-announcing running jobs and exits are covered end to end in
test_cluster_e2e.py, against a restarted `jigsaw up`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from jigsaw.proto.v2 import agent_pb2
from scheduler.orm import Node
from scheduler.settings import SchedulerSettings
from tests.agent_endpoint import Endpoint, agent_endpoint
from tests.servers import TEST_WORKER_USER
from worker_agent.agent import AgentRejected, run_agent
from worker_agent.outbox import Outbox
from worker_agent.settings import AgentSettings
from worker_agent.spool import ReportSpool


@pytest.fixture
def endpoint(engine: Engine, tmp_path: Path) -> Iterator[Endpoint]:
    with agent_endpoint(engine, tmp_path) as running:
        yield running


def test_a_wrong_token_is_fatal(endpoint: Endpoint, tmp_path: Path) -> None:
    settings = AgentSettings(
        scheduler=endpoint.address,
        token="wrong",
        node_name="node-a",
        gpus=1,
        work_dir=tmp_path,
        worker_user=TEST_WORKER_USER,
    )
    with pytest.raises(AgentRejected, match="UNAUTHENTICATED"):
        run_agent(settings, threading.Event())
    assert endpoint.count(Node) == 0


def _records(job_id: int, *iterations: int) -> agent_pb2.JobIterations:
    return agent_pb2.JobIterations(
        job_id=job_id, records=[agent_pb2.IterationRecord(iteration=i) for i in iterations]
    )


def test_by_default_an_agent_redials_a_restarted_scheduler_before_it_times_the_agent_out() -> None:
    # A new leader times agents from its first round: an agent must be back within the
    # timeout, and one redials within about twice its cap (its own jittered wait, then
    # its channel's reconnection backoff, capped to the same; gRPC's own reached 120 s).
    redial = AgentSettings.model_fields["reconnect_max_seconds"].default
    timeout = SchedulerSettings.model_fields["agent_timeout_seconds"].default
    assert 2 * redial < timeout


def test_the_outbox_batches_bounds_and_keeps_exits() -> None:
    outbox = Outbox(batch_records=3, batch_seconds=3600, max_records=4, max_other=1)
    never = threading.Event()
    outbox.put(_records(1, 1))
    outbox.put(_records(2, 1))
    assert outbox.next_message(0, never) is None  # neither full nor old: wait for more
    outbox.put(_records(1, 2, 3, 4))  # one record over the bound: the oldest goes
    batch = outbox.next_message(0, never)
    assert batch is not None
    assert [(j.job_id, [r.iteration for r in j.records]) for j in batch.reports.jobs] == [
        (2, [1]),
        (1, [2, 3]),
    ]
    outbox.put(agent_pb2.LogTail(job_id=1, message="old"))
    outbox.put(agent_pb2.LogTail(job_id=1, message="new"))
    outbox.put(agent_pb2.JobExit(job_id=1))
    # The rest of job 1's records go before its exit, which is never dropped.
    kinds = []
    while (message := outbox.next_message(0, never)) is not None:
        kinds.append(message.WhichOneof("body"))
        if message.HasField("log"):
            assert message.log.message == "new"
    assert kinds == ["reports", "log", "exit"]
    assert outbox.dropped == 2


def _sent(message: agent_pb2.AgentMessage | None) -> list[tuple[int, bool, list[int]]]:
    assert message is not None
    return [(j.job_id, j.replayed, [r.iteration for r in j.records]) for j in message.reports.jobs]


def test_records_queued_when_the_agent_dies_are_replayed_by_the_next(tmp_path: Path) -> None:
    never = threading.Event()
    path = tmp_path / "reports.spool"
    # An agent that is killed: its outbox and spool are simply abandoned.
    first = Outbox(batch_records=2, batch_seconds=3600, max_records=4, spool=ReportSpool(path))
    first.put(_records(1, 1, 2, 3))
    assert _sent(first.next_message(0, never)) == [(1, False, [1, 2])]
    first.put(_records(2, 1))
    first.put(_records(1, 4, 5, 6))  # one over the bound: the oldest (3) is dropped

    second = Outbox(batch_records=10, batch_seconds=3600, spool=ReportSpool(path))
    second.put(_records(1, 7))
    # The leftovers go at once, marked replayed, apart from the new run's records.
    assert _sent(second.next_message(0, never)) == [
        (2, True, [1]),
        (1, True, [4, 5, 6]),
        (1, False, [7]),
    ]
    # Sent: the next agent has nothing to replay, and the file is empty again.
    assert ReportSpool(path).recover() == [] and path.stat().st_size == 0


def test_the_spool_stays_small_and_survives_a_torn_write(tmp_path: Path) -> None:
    path = tmp_path / "reports.spool"
    outbox = Outbox(
        batch_records=1000, batch_seconds=3600, max_records=100, spool=ReportSpool(path)
    )
    for iteration in range(1, 5001):  # a long outage: the bound drops the oldest
        outbox.put(_records(1, iteration))
    # Compacted as it goes: a record and a note of its drop each take over 80 kB.
    assert path.stat().st_size < 20_000
    with path.open("ab") as spool:
        spool.write(b"R\xff\xff\x00\x00partial")  # killed in the middle of a write
    recovered = ReportSpool(path).recover()
    assert [record.iteration for _, record in recovered] == list(range(4901, 5001))
