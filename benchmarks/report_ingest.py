"""Iteration reports from many agents over real gRPC into PostgreSQL, against a plain
batched INSERT of the same rows in the same run.

The scheduler's side is the real one (AgentService, AgentDispatcher, ReportWriter, token
interceptor) on a scratch PostgreSQL database, in this process. Simulated agents are
raw gRPC clients in `--client-processes` processes: each registers, opens its Connect
stream saying it runs one job (allocated to its node beforehand, as a launch to it
would), then streams `--messages` messages of `--records`
iteration records each, as fast as the server takes them. The rate counts rows in the
database, from the first row written to the last (client start-up excluded). The
baseline inserts the same number of rows with plain multi-row INSERTs (SQLAlchemy Core
executemany) in transactions of the writer's batch size, from one thread; the writer
itself uses COPY. Target: >= 20,000 rows/s and >= 50% of the baseline.

    python -m benchmarks.report_ingest [--agents 200] [--messages 15] [--records 100]
                                       [--json | --markdown]
"""

from __future__ import annotations

import argparse
import multiprocessing
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
from sqlalchemy import delete, func, insert, select

from benchmarks.harness import add_output_options, emit
from jigsaw.gpus import GpuSlot
from jigsaw.jobspec import JobSpec
from jigsaw.proto.v2 import agent_pb2 as pb
from jigsaw.proto.v2 import agent_pb2_grpc
from scheduler.agents.dispatcher import AgentDispatcher, RendezvousPorts
from scheduler.agents.ingest import ReportWriter
from scheduler.agents.server import start_server
from scheduler.agents.service import AgentService
from scheduler.db import make_engine, session_factory, transaction
from scheduler.migrate import upgrade
from scheduler.models.agents import instance_digest, register
from scheduler.models.jobs import submit
from scheduler.models.metrics import ROW_COLUMNS
from scheduler.models.users import (
    AGENT_SCOPE,
    Principal,
    TokenVerifier,
    get_or_create_user,
    issue_token,
)
from scheduler.orm import GPU, Allocation, IterationMetric, table_of, utcnow
from scheduler.settings import GrpcSettings
from tests.servers import scratch_postgres

POSTGRES = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
WRITER_BATCH_ROWS = 5000


def _record(iteration: int) -> pb.IterationRecord:
    return pb.IterationRecord(
        iteration=iteration,
        step_seconds=0.1,
        compute_seconds=0.08,
        comm_seconds=0.02,
        samples_per_second=640.0,
        loss=1.0 / iteration,
        utilization=0.7,
        peak_memory_bytes=1 << 30,
        bytes_communicated=1 << 20,
    )


def _instance(node: str) -> str:
    """The instance key of the simulated agent process of `node`."""
    return f"bench-agent-process-{node}"


def _allocate(factory: Any, agents: list[tuple[str, int]]) -> None:
    """Each job allocated to its agent's node and launched to its process (attempt 1)."""
    slot = GpuSlot(0, "virtual-cpu", 1 << 30, virtual=True)
    with transaction(factory) as session:
        for node, job_id in agents:
            node_id = register(
                session, node_name=node, address="127.0.0.1", gpus=[slot], version="bench"
            ).node_id
            session.add(
                Allocation(
                    job_id=job_id,
                    gpu_id=session.scalars(select(GPU.id).where(GPU.node_id == node_id)).one(),
                    rank=0,
                    lease_iterations=1,
                    attempt=1,
                    agent_instance=instance_digest(_instance(node)),
                )
            )


def _agent_stream(
    stub: agent_pb2_grpc.AgentServiceStub,
    token: str,
    node: str,
    job_id: int,
    messages: int,
    records: int,
) -> None:
    metadata = [("authorization", f"Bearer {token}")]
    stub.Register(
        pb.RegisterRequest(
            node_name=node,
            gpus=[pb.Gpu(index=0, kind="virtual-cpu", memory_bytes=1 << 30, virtual=True)],
            agent_version="bench",
            address="127.0.0.1",
            instance=_instance(node),
        ),
        metadata=metadata,
    )

    def outgoing() -> Iterator[pb.AgentMessage]:
        yield pb.AgentMessage(
            hello=pb.Hello(
                node_name=node,
                running=[
                    pb.RunningJob(
                        job_id=job_id, attempt=1, ranks=[pb.RankAssignment(rank=0, gpu_index=0)]
                    )
                ],
                instance=_instance(node),
            )
        )
        for m in range(messages):
            batch = [_record(m * records + i + 1) for i in range(records)]
            yield pb.AgentMessage(
                reports=pb.IterationReports(jobs=[pb.JobIterations(job_id=job_id, records=batch)])
            )

    # Sending ends with a half-close; the server then ends the stream, and this loop.
    for _command in stub.Connect(outgoing(), metadata=metadata):
        pass


def _client_process(
    address: str, token: str, agents: list[tuple[str, int]], messages: int, records: int
) -> None:
    from concurrent.futures import ThreadPoolExecutor

    with grpc.insecure_channel(address) as channel:
        stub = agent_pb2_grpc.AgentServiceStub(channel)
        with ThreadPoolExecutor(max_workers=len(agents)) as pool:
            for node, job_id in agents:
                pool.submit(_agent_stream, stub, token, node, job_id, messages, records)


def _rows(factory: Any) -> int:
    with factory() as session:
        return int(session.scalar(select(func.count()).select_from(IterationMetric)) or 0)


def _grpc_ingest(factory: Any, jobs: list[int], token: str, args: argparse.Namespace) -> float:
    writer = ReportWriter(factory, max_rows=WRITER_BATCH_ROWS)
    writer.start()
    dispatcher = AgentDispatcher(
        factory,
        checkpoint_root=Path("/nonexistent"),
        checkpoint_every=0,
        ports=RendezvousPorts(29500, 29999),
    )
    service = AgentService(factory, dispatcher, writer, heartbeat_interval_seconds=5.0)
    settings = GrpcSettings(host="127.0.0.1", port=0, max_connections=args.agents + 16)
    server, port = start_server(service, TokenVerifier(factory, 60), settings)
    expected = args.agents * args.messages * args.records
    agents = [(f"bench-{i}", job_id) for i, job_id in enumerate(jobs)]
    _allocate(factory, agents)
    shards = [agents[i :: args.client_processes] for i in range(args.client_processes)]
    context = multiprocessing.get_context("spawn")
    processes = [
        context.Process(
            target=_client_process,
            args=(f"127.0.0.1:{port}", token, shard, args.messages, args.records),
        )
        for shard in shards
    ]
    try:
        for process in processes:
            process.start()
        # Sustained rate: from the first row in the database (client processes have
        # started, imported and registered) to the last.
        while _rows(factory) == 0:
            if all(p.exitcode is not None for p in processes):
                break
            time.sleep(0.01)
        start = time.perf_counter()
        while _rows(factory) < expected:
            if all(p.exitcode is not None for p in processes) and writer.flush(timeout=30):
                break
            time.sleep(0.05)
        elapsed = time.perf_counter() - start
    finally:
        for process in processes:
            process.join(timeout=60)
        server.stop(grace=None).wait()
        writer.close()
    written = _rows(factory)
    if written != expected:
        raise SystemExit(f"only {written} of {expected} rows arrived")
    return elapsed


def _plain_insert(factory: Any, jobs: list[int], args: argparse.Namespace) -> float:
    """The obvious way: multi-row INSERTs of the writer's batch size, one per transaction."""
    rows_per_job = args.messages * args.records
    table = table_of(IterationMetric)
    now = utcnow()
    start = time.perf_counter()
    batch: list[dict[str, Any]] = []
    for job_id in jobs:
        for i in range(rows_per_job):
            r = _record(i + 1)
            batch.append(
                {"job_id": job_id, "reported_at": now}
                | {name: getattr(r, name) for name in ROW_COLUMNS if name != "job_id"}
            )
            if len(batch) >= WRITER_BATCH_ROWS or (job_id == jobs[-1] and i == rows_per_job - 1):
                with transaction(factory) as session:
                    session.execute(insert(table), batch)
                batch = []
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=200)
    parser.add_argument("--messages", type=int, default=15, help="per agent")
    parser.add_argument("--records", type=int, default=100, help="iteration records a message")
    parser.add_argument("--client-processes", type=int, default=3)
    parser.add_argument("--postgres", default=POSTGRES, help="server URL (a scratch DB is made)")
    add_output_options(parser)
    args = parser.parse_args()

    with scratch_postgres(args.postgres, prefix="jigsaw_bench") as url:
        engine = make_engine(url)
        upgrade(engine)
        factory = session_factory(engine)
        with transaction(factory) as session:
            token = issue_token(session, scope=AGENT_SCOPE)
            user = get_or_create_user(session, "bench")
            owner = Principal("user", user.id, user.name, False)
            spec = JobSpec(name="bench", workload="digits-mlp", max_iterations=10**9)
            jobs = [submit(session, spec, owner).id for _ in range(args.agents)]
        rows = args.agents * args.messages * args.records
        grpc_seconds = _grpc_ingest(factory, jobs, token, args)
        with transaction(factory) as session:
            session.execute(delete(IterationMetric))
        plain_seconds = _plain_insert(factory, jobs, args)
        engine.dispose()

    grpc_rate, plain_rate = rows / grpc_seconds, rows / plain_seconds
    emit(
        [
            {
                "case": f"gRPC, {args.agents} agents",
                "rows": rows,
                "seconds": grpc_seconds,
                "rows/s": grpc_rate,
                "vs plain": grpc_rate / plain_rate,
            },
            {
                "case": "plain batched INSERT",
                "rows": rows,
                "seconds": plain_seconds,
                "rows/s": plain_rate,
                "vs plain": 1.0,
            },
        ],
        "Iteration report ingest into PostgreSQL",
        args.output,
    )


if __name__ == "__main__":
    main()
