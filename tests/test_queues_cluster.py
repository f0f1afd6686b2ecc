"""Queues on a live cluster, on SQLite and PostgreSQL: `jigsaw up` and a `jigsaw agent`
with four virtual GPUs running real training processes.

Two teams are guaranteed two GPUs each and may borrow two. Team A fills the cluster
while team B is idle; when B submits, the scheduler takes its two GPUs back from the
fewest of A's borrowing jobs: they checkpoint where they are, B's jobs start, and the
suspended jobs resume later from their checkpoints with no iteration lost or repeated.
A sampler watches the allocations and the live training processes throughout: no queue
ever holds more than its guarantee plus its borrowing limit, nor the cluster more than
its GPUs.
"""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from scheduler.db import make_engine
from scheduler.orm import Allocation, IterationMetric
from tests.cluster import ON_POSTGRES, Cluster, cluster, ended, incarnations

pytestmark = pytest.mark.timeout(420)

GPUS = 4
QUEUE = {"quota": 2, "borrowing_limit": 2}
CAP = QUEUE["quota"] + QUEUE["borrowing_limit"]
# Long enough that none of A's jobs ends before all four train: under CI's load their
# cold starts are seconds apart, and at 400 two of them once ended before B came, which
# then needed no GPU back.
A_ITERATIONS = 1000
B_ITERATIONS = 40


def _spec(queue: str, iterations: int) -> dict[str, Any]:
    return {
        "name": f"{queue}-job",
        "workload": "digits-mlp",
        "queue": queue,
        "hyperparameters": {"batch_size": 16, "learning_rate": 0.05},
        "max_iterations": iterations,
    }


class Sampler(threading.Thread):
    """GPUs each queue holds, by its allocations (GET /v1/cluster) and by the training
    processes alive under the cluster's home, sampled until stopped."""

    def __init__(self, c: Cluster) -> None:
        super().__init__(daemon=True)
        self.cluster = c
        self.queue_of: dict[int, str] = {}
        self.allocated: list[Counter[str]] = []
        self.running: list[Counter[str]] = []
        self.failure: BaseException | None = None
        self._stop_event = threading.Event()

    def run(self) -> None:
        try:
            with self.cluster.client() as client:
                while not self._stop_event.wait(0.1):
                    holders = [
                        holder["job_id"]
                        for node in client.cluster()["nodes"]
                        for gpu in node["gpus"]
                        for holder in gpu["holders"]
                    ]
                    live = incarnations(self.cluster.home)
                    for job_id in {*holders, *live} - self.queue_of.keys():
                        self.queue_of[job_id] = client.get_job(job_id)["spec"]["queue"]
                    self.allocated.append(Counter(self.queue_of[j] for j in holders))
                    self.running.append(Counter(self.queue_of[j] for j in live))
        except BaseException as exc:  # noqa: BLE001 - re-raised by the test
            self.failure = exc

    def stop(self) -> None:
        self._stop_event.set()
        self.join()
        if self.failure is not None:
            raise self.failure


@ON_POSTGRES
def test_a_team_gets_its_lent_gpus_back_from_real_training_jobs(
    tmp_path: Path, db_url: str
) -> None:
    settings = {
        "JIGSAW_DATABASE_URL": db_url,
        "JIGSAW_SCHEDULER_POLICY": "fifo",
    }
    home = tmp_path / "home"
    with cluster(home, **settings) as c:
        # Cold workers (no warm pool): each run's command line names its job, which the
        # sampler reads to count the processes training for each queue.
        c.start_agent("gpus", gpus=GPUS)
        c.wait_nodes(alive=1)
        sampler = Sampler(c)
        with c.client() as client:
            for name in ("team-a", "team-b"):
                client.create_queue({"name": name, **QUEUE})
            sampler.start()
            a = [client.submit(_spec("team-a", A_ITERATIONS))["id"] for _ in range(GPUS)]
            # Team B is idle: team A borrows its two GPUs and trains on all four.
            for job_id in a:
                c.wait_job(job_id, lambda j: j["iterations_done"] >= 20, "training")
            assert client.get_queue("team-a")["borrowed_gpus"] == 2
            before = {job_id: client.get_job(job_id)["iterations_done"] for job_id in a}

            b = [client.submit(_spec("team-b", B_ITERATIONS))["id"] for _ in range(2)]
            finished = {job_id: c.wait_job(job_id, ended, "ended") for job_id in a + b}
            events = {job_id: client.events(job_id)["items"] for job_id in a + b}
            rounds = client.rounds(limit=1000, decisions=True)["items"]
            logs = {
                job_id: [line["message"] for line in client.logs(job_id, limit=1000)["items"]]
                for job_id in a
            }
        sampler.stop()

    assert all(job["state"] == "SUCCEEDED" for job in finished.values()), finished
    # No queue ever held more than its guarantee plus borrowing limit, and B ran both
    # its jobs at once beside A's two guaranteed ones.
    for sample in sampler.allocated + sampler.running:
        assert sum(sample.values()) <= GPUS and max(sample.values(), default=0) <= CAP, sample
    assert Counter({"team-a": 2, "team-b": 2}) in sampler.allocated
    assert Counter({"team-a": 2, "team-b": 2}) in sampler.running

    # The fewest victims: two of A's jobs, each suspended once by the policy.
    suspended = {
        job_id: [
            e for e in events[job_id] if e["kind"] == "transition" and e["to_state"] == "SUSPENDED"
        ]
        for job_id in a
    }
    victims = [job_id for job_id in a if suspended[job_id]]
    assert len(victims) == 2 and all(len(suspended[v]) == 1 for v in victims), suspended
    suspends = [d["job_id"] for r in rounds for d in r["decisions"] if d["kind"] == "suspend"]
    assert sorted(suspends) == sorted(victims), rounds
    # Within one lease: B's jobs were placed in the first round that saw each (none of
    # their waits was for a quota or for free GPUs), started once each as soon as the
    # victims' processes had checkpointed and exited, never launched onto GPUs those
    # still held (which the agent refuses, sending the job back to the queue round
    # after round).
    for job_id in b:
        moves = [e["to_state"] for e in events[job_id] if e["kind"] == "transition"]
        assert moves[:3] == ["QUEUED", "SCHEDULED", "RUNNING"], moves
        assert moves.count("SCHEDULED") == 1, moves
        waits = [e["message"] for e in events[job_id] if e["kind"] == "pending"]
        assert all("still held by the processes of a suspended" in w for w in waits), waits

    engine = make_engine(db_url)
    try:
        with engine.connect() as connection:
            for job_id in a:
                iterations = connection.scalars(
                    select(IterationMetric.iteration).where(IterationMetric.job_id == job_id)
                ).all()
                # Every iteration reported exactly once: none lost, none run twice.
                assert sorted(iterations) == list(range(1, A_ITERATIONS + 1)), job_id
                leases = connection.scalars(
                    select(Allocation.lease_start_iteration)
                    .where(Allocation.job_id == job_id)
                    .order_by(Allocation.id)
                ).all()
                if job_id not in victims:
                    assert leases == [0]
                    continue
                # Resumed later from the checkpoint written where it stopped.
                assert len(leases) == 2 and leases[0] == 0, leases
                stopped = leases[1]
                assert stopped >= before[job_id], (before, stopped)
                assert any(
                    f"resumed from the checkpoint at iteration {stopped}" in line
                    for line in logs[job_id]
                ), logs[job_id]
    finally:
        engine.dispose()
