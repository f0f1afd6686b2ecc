"""High availability with real processes: two `jigsaw up` replicas on one PostgreSQL,
two `jigsaw agent`s dialing the scheduler's one gRPC address (as they dial a Kubernetes
Service), real training jobs.

Exactly one replica leads; both serve the API. SIGKILL of the leader hands leadership
to the other, the agents redial it, and every job ends SUCCEEDED having been placed
exactly once: no job launched twice, none lost. How fast the handover is (the
requirement: within 10 s) is measured by `benchmarks/failover.py`, not asserted here on
a shared machine's clock.
"""

from __future__ import annotations

import os
import re
import signal
from contextlib import ExitStack
from pathlib import Path
from pprint import pformat

import httpx
import pytest

from api.server import free_port
from tests.cluster import Cluster, wait_for, worker_pids
from tests.servers import HTTP_TIMEOUT_SECONDS, Server, jigsaw_up

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(300)]

JOBS = 3
ITERATIONS = 240


def leads(server: Server) -> bool:
    scrape = httpx.get(f"{server.url}/metrics", timeout=10).text
    match = re.search(r"^jigsaw_scheduler_leader (\S+)$", scrape, re.MULTILINE)
    return match is not None and float(match.group(1)) == 1.0


def _decisions(api: httpx.Client, job_id: int) -> list[object]:
    """What the rounds of either leader decided about the job, and agents they lost."""
    params = {"limit": 1000, "decisions": True}
    rounds = api.get("/v1/scheduler/rounds", params=params).json()["items"]
    return [
        (r["leader"], r["started_at"], d)
        for r in rounds
        for d in r["decisions"]
        if d.get("job_id") == job_id or d.get("kind") == "agent_lost"
    ]


def test_killing_the_leader_hands_over_without_losing_or_relaunching_jobs(
    postgres_url: str, tmp_path: Path
) -> None:
    grpc_port = free_port()
    env = {
        "JIGSAW_DATABASE_URL": postgres_url,
        "JIGSAW_GRPC_PORT": str(grpc_port),
        "JIGSAW_SCHEDULER_ROUND_SECONDS": "0.2",
        # Longer than a takeover, so no agent is declared dead while it redials.
        "JIGSAW_SCHEDULER_AGENT_TIMEOUT_SECONDS": "30",
        "JIGSAW_SCHEDULER_CHECKPOINT_EVERY": "20",
        "JIGSAW_AGENT_RECONNECT_MAX_SECONDS": "1",
    }
    with ExitStack() as stack:
        first = stack.enter_context(jigsaw_up(tmp_path, **env))
        wait_for(lambda: leads(first), "the first replica to lead")
        second = stack.enter_context(jigsaw_up(tmp_path, **env))
        cluster = Cluster(tmp_path, grpc_port, env, stack, server=first)
        cluster.start_agent("agent-a", gpus=1)
        cluster.start_agent("agent-b", gpus=1)
        cluster.wait_nodes(alive=2)
        assert not leads(second)

        token = {"Authorization": f"Bearer {first.token()}"}
        api = [
            httpx.Client(base_url=s.url, headers=token, timeout=HTTP_TIMEOUT_SECONDS)
            for s in (first, second)
        ]
        spec = {
            "workload": "digits-mlp",
            "hyperparameters": {"batch_size": 32, "learning_rate": 0.05},
            "max_iterations": ITERATIONS,
        }
        # Both replicas serve the API: submissions go through either.
        jobs = [
            api[i % 2].post("/v1/jobs", json={**spec, "name": f"ha-{i}"}).json()["id"]
            for i in range(JOBS)
        ]

        def progress() -> dict[int, int]:
            return {j: api[1].get(f"/v1/jobs/{j}").json()["iterations_done"] for j in jobs}

        wait_for(lambda: sum(done >= 20 for done in progress().values()) == 2, "two jobs training")
        first.killed = True
        os.kill(first.proc.pid, signal.SIGKILL)
        first.proc.wait()
        wait_for(lambda: leads(second), "the second replica to lead", seconds=60)

        def ended() -> bool:
            states = {api[1].get(f"/v1/jobs/{j}").json()["state"] for j in jobs}
            return states <= {"SUCCEEDED", "FAILED", "CANCELLED"}

        wait_for(ended, "every job to end", seconds=240)
        for job_id in jobs:
            job = api[1].get(f"/v1/jobs/{job_id}").json()
            events = api[1].get(f"/v1/jobs/{job_id}/events").json()["items"]
            # A relaunch says why in the job's events and the rounds' decisions (a flake
            # once in five CI runs left only `attempts` 2 to read).
            story = [(e["kind"], e["message"], e["data"]) for e in events]
            assert (job["state"], job["iterations_done"], job["attempts"]) == (
                "SUCCEEDED",
                ITERATIONS,
                1,
            ), pformat((job, story, _decisions(api[1], job_id)))
            assert [e["kind"] for e in events].count("decision") == 1, story
            lines = [
                line["message"] for line in api[1].get(f"/v1/jobs/{job_id}/logs").json()["items"]
            ]
            assert not any("resumed from the checkpoint" in line for line in lines)
        # The new leader records its own rounds.
        leaders = {r["leader"] for r in api[1].get("/v1/scheduler/rounds").json()["items"]}
        assert f":{second.proc.pid}" in " ".join(leaders), leaders
        for client in api:
            client.close()
    assert worker_pids(tmp_path) == []
