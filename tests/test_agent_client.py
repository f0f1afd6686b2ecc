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

from scheduler.orm import Node
from tests.agent_endpoint import Endpoint, agent_endpoint
from tests.servers import TEST_WORKER_USER
from worker_agent.agent import AgentRejected, run_agent
from worker_agent.outbox import Outbox
from worker_agent.proto.jigsaw.v1 import agent_pb2
from worker_agent.settings import AgentSettings


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
