"""End to end with real processes on loopback: `jigsaw up` (API, scheduler, gRPC
endpoint), `jigsaw agent` processes with virtual GPUs, real torch.distributed training.

Each test runs on one database (alternating, so both are exercised): the whole matrix
twice would double the slowest part of the suite for little more coverage.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.cluster import (
    CHECKPOINT_EVERY,
    LOSE_AGENTS_FAST,
    LOST_AGENT_SECONDS,
    Cluster,
    cluster,
    ended,
    incarnations,
    kill,
    wait_for,
    worker_pids,
)
from tests.runtime_helpers import run_gang
from tests.servers import JIGSAW, clean_env
from worker_agent.runtime.checkpoint import CHECKPOINT_FILE
from worker_agent.runtime.config import WorkerConfig

pytestmark = pytest.mark.timeout(420)


def _database(request: pytest.FixtureRequest, backend: str) -> dict[str, str]:
    if backend == "sqlite":
        return {}
    return {"JIGSAW_DATABASE_URL": str(request.getfixturevalue("postgres_url"))}


def _nodes_of(client: Any, job_id: int) -> list[str]:
    decisions = [e for e in client.events(job_id)["items"] if e["kind"] == "decision"]
    return list(decisions[-1]["data"]["nodes"])


@pytest.mark.parametrize("backend", ["sqlite"])
def test_three_jobs_train_to_success_across_two_agents(
    request: pytest.FixtureRequest, tmp_path: Path, backend: str
) -> None:
    with cluster(tmp_path, **_database(request, backend)) as c:
        c.start_agent("agent-a", gpus=2)
        c.start_agent("agent-b", gpus=2)
        c.wait_nodes(alive=2)
        with c.client() as client:
            # Three workers: more than either agent has, so the gang spans both.
            spanning = client.submit(
                {
                    "name": "lm",
                    "workload": "text-transformer",
                    "workers": 3,
                    "hyperparameters": {"batch_size": 48, "optimizer": "adam",
                                        "learning_rate": 0.003},
                    "max_iterations": 40,
                }
            )["id"]  # fmt: skip
            digits = client.submit(
                {
                    "name": "digits",
                    "workload": "digits-mlp",
                    "hyperparameters": {"batch_size": 64, "learning_rate": 0.1},
                    "max_iterations": 400,
                    "target_metric": {"name": "accuracy", "value": 0.9},
                }
            )["id"]
            cnn = client.submit(
                {
                    "name": "cnn",
                    "workload": "digits-cnn",
                    "workers": 2,
                    "hyperparameters": {"batch_size": 64, "learning_rate": 0.05},
                    "max_iterations": 30,
                    # Rank 1 trains only the top of the model's two stages.
                    "spb": {"full_fraction": 0.5, "partial_depth": 0.5},
                }
            )["id"]
            # Pipeline parallel: rank r trains stage r; the spec travels to every rank.
            pipelined = client.submit(
                {
                    "name": "pipelined-lm",
                    "workload": "text-transformer",
                    "workers": 2,
                    "hyperparameters": {"batch_size": 16, "optimizer": "adam",
                                        "learning_rate": 0.003},
                    "max_iterations": 20,
                    "pipeline": {"stages": 2, "schedule": "zero-bubble", "microbatches": 4},
                }
            )["id"]  # fmt: skip
            crash = client.submit(
                {
                    "name": "crash",
                    "workload": "tests.runtime_helpers:CrashingTrial",
                    "max_iterations": 10,
                    "max_retries": 1,
                }
            )["id"]
            trained = (spanning, digits, cnn, pipelined)
            jobs = {job_id: c.wait_job(job_id, ended, "ended") for job_id in trained}
            assert {job["state"] for job in jobs.values()} == {"SUCCEEDED"}, [
                (job["name"], job["state"], job["message"]) for job in jobs.values()
            ]

            assert sorted(set(_nodes_of(client, spanning))) == ["agent-a", "agent-b"]
            assert jobs[digits]["metrics"]["accuracy"] >= 0.9
            # Rank 0 evaluated the whole model, gathered from both stages.
            assert jobs[pipelined]["metrics"]["loss"] < 4.0
            for job_id in trained:
                series = client.metrics(job_id, points=20)["points"]
                assert series and series[-1]["iteration"] == jobs[job_id]["iterations_done"]
                assert all(p["loss"] is not None and p["step_seconds"] > 0 for p in series)
                assert series[-1]["samples_per_second"] > 0
                # The launch's SPB configuration reached the workers: depths 2 and 1 of 2.
                depths = {p["spb_depth"] for p in series}
                assert depths == ({0.75} if job_id == cnn else {None}), (job_id, depths)
            # The SPB job measured its model before training: its profile is stored.
            (profile,) = client.profiles()["items"]
            assert (profile["workload"], profile["key"]) == ("digits-cnn", "virtual-cpu/batch-32")
            lines = [line["message"] for line in client.logs(spanning)["items"]]
            assert any("succeeded at iteration 40" in line for line in lines), lines

            # A crashing trial is retried once, then fails with the error.
            failed = c.wait_job(crash, ended, "ended")
            assert (failed["state"], failed["failures"], failed["attempts"]) == ("FAILED", 1, 2)
            assert "the user's loss exploded" in failed["message"]

        logs = subprocess.run(
            [*JIGSAW, "logs", str(crash)],
            env=clean_env(tmp_path),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert logs.returncode == 0, logs.stderr
        assert "RuntimeError: the user's loss exploded" in logs.stdout
        assert worker_pids(tmp_path) == []


@pytest.mark.parametrize("backend", ["postgres"])
def test_suspend_then_resume_on_another_agent_continues_the_same_trajectory(
    request: pytest.FixtureRequest, tmp_path: Path, backend: str
) -> None:
    spec = {
        "name": "digits",
        "workload": "digits-mlp",
        "hyperparameters": {"batch_size": 64, "learning_rate": 0.05, "optimizer": "adam"},
        "max_iterations": 2000,
    }
    with cluster(tmp_path, **_database(request, backend)) as c:
        c.start_agent("agent-a", gpus=1)
        c.wait_nodes(alive=1)
        with c.client() as client:
            job_id = client.submit(spec)["id"]
            c.wait_job(job_id, lambda j: j["iterations_done"] >= 25, "past iteration 25")
            client.suspend(job_id)
            c.wait_job(job_id, lambda j: j["state"] == "SUSPENDED", "suspended")
            wait_for(lambda: worker_pids(tmp_path) == [], "the suspended workers to exit")
            checkpoint = tmp_path / "checkpoints" / f"job-{job_id}" / CHECKPOINT_FILE
            suspended_at = torch.load(checkpoint, weights_only=True)["iteration"]
            assert 25 <= suspended_at < 2000

            # The job's agent goes away; the resumed job can only land on the new one.
            c.agents["agent-a"].send_signal(signal.SIGTERM)
            c.agents["agent-a"].wait(timeout=60)
            c.start_agent("agent-b", gpus=1)
            client.resume(job_id)
            job = c.wait_job(job_id, ended, "ended")
            assert job["state"] == "SUCCEEDED", job
            assert _nodes_of(client, job_id) == ["agent-b"]
            lines = [line["message"] for line in client.logs(job_id)["items"]]
            assert any(f"resumed from the checkpoint at iteration {suspended_at}" in line
                       for line in lines), lines  # fmt: skip

        # The same job, uninterrupted, in a process of the test's own.
        reference = tmp_path / "reference"
        run_gang(
            [
                WorkerConfig(
                    job_id=job_id,
                    workload=spec["workload"],
                    hyperparameters=spec["hyperparameters"],
                    rank=0,
                    world_size=1,
                    master_port=_port(),
                    seed=job_id,
                    max_iterations=2000,
                    checkpoint_dir=reference,
                    torch_threads=1,
                )
            ]
        )
        expected = torch.load(reference / CHECKPOINT_FILE, weights_only=True)
        actual = torch.load(checkpoint, weights_only=True)
        assert actual["iteration"] == expected["iteration"] == 2000
        for name, tensor in expected["model"].items():
            assert torch.allclose(actual["model"][name], tensor, rtol=1e-5, atol=1e-6), name


def _underway(c: Cluster, client: Any, spec: dict[str, Any] | None = None) -> int:
    """A job (`spec`; default: 3000 iterations of digits) long enough to be still running
    when its agent goes, a few seconds in, once it has checkpointed."""
    spec = spec or {"name": "digits", "workload": "digits-mlp", "max_iterations": 3000}
    job_id: int = client.submit(spec)["id"]
    c.wait_job(job_id, lambda j: j["iterations_done"] > 2 * CHECKPOINT_EVERY, "underway")
    return job_id


@pytest.mark.parametrize("backend", ["postgres"])
def test_a_killed_agent_loses_its_job_which_resumes_from_its_checkpoint_elsewhere(
    request: pytest.FixtureRequest, tmp_path: Path, backend: str
) -> None:
    with cluster(tmp_path, **_database(request, backend), **LOSE_AGENTS_FAST) as c:
        c.start_agent("agent-a", gpus=1)
        c.start_agent("agent-b", gpus=1)
        c.wait_nodes(alive=2)
        with c.client() as client:
            job_id = _underway(c, client)
            (victim,) = _nodes_of(client, job_id)
            (survivor,) = {"agent-a", "agent-b"} - {victim}
            victims = worker_pids(tmp_path)
            assert victims
            kill(c.agents[victim])
            # The agent's training processes die with it, without waiting for a timeout.
            wait_for(lambda: not set(victims) & set(worker_pids(tmp_path)), "orphans to die")

            job = c.wait_job(job_id, ended, "ended")
            assert job["state"] == "SUCCEEDED", job
            assert _nodes_of(client, job_id) == [survivor]
            events = client.events(job_id)["items"]
            assert any(e["to_state"] == "QUEUED" and "agent lost" in e["message"] for e in events)
            lines = [line["message"] for line in client.logs(job_id)["items"]]
            assert any("resumed from the checkpoint at iteration" in line for line in lines)
        assert worker_pids(tmp_path) == []


@pytest.mark.parametrize("backend", ["sqlite"])
def test_a_job_whose_agent_fell_silent_past_the_timeout_runs_once_more_and_succeeds(
    request: pytest.FixtureRequest, tmp_path: Path, backend: str
) -> None:
    """An agent paused (as a loaded host can pause it) past the timeout is declared lost
    and its job requeued while its training processes go on; when it speaks again on the
    same stream, the job's next launch there finds the stale run: the agent stops that run
    and refuses the launch (the job queues again, through no fault of its own) until it is
    gone, and the job then succeeds from its checkpoint, never two runs at once."""
    # 50 ms a step whatever the load: the stale run still has most of its 30 s to go when
    # the agent speaks again (a CPU-bound job sometimes ended during the pause).
    slow = {"name": "slow", "workload": "tests.runtime_helpers:SlowTrial", "max_iterations": 600}
    with cluster(tmp_path, **_database(request, backend), **LOSE_AGENTS_FAST) as c:
        agent = c.start_agent("agent-a", gpus=1)
        c.wait_nodes(alive=1)
        with c.client() as client:
            job_id = _underway(c, client, slow)
            agent.send_signal(signal.SIGSTOP)
            try:
                c.wait_job(job_id, lambda j: j["state"] == "QUEUED", "requeued")
            finally:
                agent.send_signal(signal.SIGCONT)
            job = c.wait_job(job_id, ended, "ended")
            assert job["state"] == "SUCCEEDED", job
            assert job["iterations_done"] == 600 and job["failures"] == 0
            messages = [e["message"] for e in client.events(job_id)["items"]]
            assert "agent lost" in messages
            assert any("still runs on this node" in m for m in messages), messages
        assert len(incarnations(tmp_path)) == 0


@pytest.mark.parametrize("backend", ["sqlite"])
def test_a_scheduler_restart_keeps_jobs_running_without_a_second_launch(
    request: pytest.FixtureRequest, tmp_path: Path, backend: str
) -> None:
    # The agent redials every second at most: it is back soon after the scheduler is.
    env = {**_database(request, backend), **LOSE_AGENTS_FAST}
    with cluster(tmp_path, JIGSAW_AGENT_RECONNECT_MAX_SECONDS="1", **env) as c:
        c.start_agent("agent-a", gpus=1)
        c.wait_nodes(alive=1)
        with c.client() as client:
            # 50 ms a step: 30 s in all, most of it after the scheduler is back (the
            # digits MLP's 4,000 steps once ended while it was away).
            slow = {"name": "slow", "workload": "tests.runtime_helpers:SlowTrial"}
            job_id = client.submit({**slow, "max_iterations": 600})["id"]
        c.wait_job(job_id, lambda j: j["iterations_done"] > 5, "underway")
        pids = worker_pids(tmp_path)

        assert c.server is not None
        c.server.proc.send_signal(signal.SIGTERM)
        c.server.proc.wait(timeout=60)
        # Away for longer than an agent may be silent: what it sent meanwhile reached no
        # scheduler, so the new one times it from its own start, not from its last
        # heartbeat (else it would requeue the job and launch it again).
        time.sleep(LOST_AGENT_SECONDS * 1.5)
        assert worker_pids(tmp_path) == pids  # training goes on while the scheduler is away
        c.start_server()

        job = c.wait_job(job_id, ended, "ended")
        assert job["state"] == "SUCCEEDED", job
        with c.client() as client:
            launches = [e for e in client.events(job_id)["items"] if e["to_state"] == "RUNNING"]
        assert len(launches) == 1, launches
        assert "Traceback" not in c.agent_log("agent-a")


def _port() -> int:
    from api.server import free_port

    return free_port()
