"""`jigsaw up --local-agents` killed, restarted and shot at, with real processes: a job
never has two live incarnations (counted from its workers' processes), none is lost,
and each ends in one terminal state.

Each test runs on one database (the agents' authority is tested on both in
test_agent_authority.py).
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from api.client import JigsawClient
from api.credentials import credentials_path
from api.server import free_port
from tests.cluster import agent_pids, alive, incarnations, wait_for, worker_pids
from tests.servers import JIGSAW, TERMINAL, Server, clean_env, jigsaw_up
from worker_agent.runtime.lifeline import UP_PARENT_PID_ENV

pytestmark = pytest.mark.timeout(600)

LOCAL_AGENTS = 2
CHECKPOINT_EVERY = 10


def _settings(request: pytest.FixtureRequest, backend: str) -> dict[str, str]:
    settings = {
        # The same endpoint across restarts, as an operator's configuration gives it.
        "JIGSAW_GRPC_PORT": str(free_port()),
        "JIGSAW_SCHEDULER_ROUND_SECONDS": "0.2",
        "JIGSAW_SCHEDULER_AGENT_TIMEOUT_SECONDS": "4",
        "JIGSAW_SCHEDULER_CHECKPOINT_EVERY": str(CHECKPOINT_EVERY),
    }
    if backend == "postgres":
        settings["JIGSAW_DATABASE_URL"] = str(request.getfixturevalue("postgres_url"))
    return settings


@dataclass
class Census:
    """Samples the job's live incarnations from /proc while a test runs."""

    home: Path
    most: dict[int, int] = field(default_factory=dict)
    samples: int = 0
    # The first sample that saw a job run twice: its rank 0 processes and their parents.
    twice: list[tuple[int, Path, int]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self._stop.wait(0.05):
            for job_id, runs in incarnations(self.home).items():
                self.most[job_id] = max(self.most.get(job_id, 0), len(runs))
                if len(runs) > 1 and not self.twice:
                    self.twice = [(pid, config, _parent(pid)) for pid, config in runs]
            self.samples += 1

    @contextmanager
    def counting(self) -> Iterator[Census]:
        thread = threading.Thread(target=self.run, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            thread.join()


class ControlPlane:
    """`jigsaw up --local-agents 2` on one home, which a test kills and restarts."""

    def __init__(self, stack: ExitStack, home: Path, settings: dict[str, str]) -> None:
        # Last: whatever a failing test leaves behind is killed.
        stack.callback(_kill_leftovers, home)
        self._stack = stack
        self.home = home
        self._settings = settings
        self.server: Server | None = None
        self._current: ExitStack | None = None
        self.restarts = 0

    def start(self) -> None:
        self._current = self._stack.enter_context(ExitStack())
        self.server = self._current.enter_context(
            jigsaw_up(self.home, "--local-agents", str(LOCAL_AGENTS), **self._settings)
        )

    def kill(self) -> None:
        """SIGKILL `jigsaw up`: nothing of it gets to clean up."""
        assert self.server is not None and self._current is not None
        self.server.killed = True
        os.kill(self.server.proc.pid, signal.SIGKILL)
        self.server.proc.wait()
        self._current.close()
        self.server = None

    def restart(self) -> None:
        self.kill()
        self.start()
        self.restarts += 1

    def client(self) -> JigsawClient:
        assert self.server is not None
        return JigsawClient(self.server.url, self.server.token())

    def alive_nodes(self) -> int:
        with self.client() as client:
            return sum(node["alive"] for node in client.cluster()["nodes"])


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def _kill_leftovers(home: Path) -> None:
    for pid in [*worker_pids(home), *(p for pids in agent_pids(home).values() for p in pids)]:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _job(name: str, iterations: int) -> dict[str, Any]:
    return {
        "name": name,
        "workload": "digits-mlp",
        "hyperparameters": {"batch_size": 32, "learning_rate": 0.05},
        "max_iterations": iterations,
    }


def _terminal_events(client: JigsawClient, job_id: int) -> list[str]:
    return [e["to_state"] for e in client.events(job_id)["items"] if e["to_state"] in TERMINAL]


@pytest.mark.parametrize("backend", ["sqlite"])
def test_a_killed_jigsaw_up_leaves_no_agent_and_its_restart_runs_each_job_once(
    request: pytest.FixtureRequest, tmp_path: Path, backend: str
) -> None:
    with ExitStack() as stack, Census(tmp_path).counting() as census:
        plane = ControlPlane(stack, tmp_path, _settings(request, backend))
        plane.start()
        wait_for(lambda: plane.alive_nodes() == LOCAL_AGENTS, "the local agents")
        with plane.client() as client:
            jobs = [client.submit(_job(f"j{i}", 4000))["id"] for i in range(2)]
            for job_id in jobs:
                wait_for(
                    lambda j=job_id: client.get_job(j)["iterations_done"] > 2 * CHECKPOINT_EVERY,
                    f"job {job_id} underway",
                )
        before = worker_pids(tmp_path)
        assert set(incarnations(tmp_path)) == set(jobs)

        plane.kill()
        # Its agents, and their workers, go with it: nothing is left to run twice.
        wait_for(lambda: agent_pids(tmp_path) == {}, "the local agents to die with jigsaw up")
        wait_for(lambda: not set(before) & set(worker_pids(tmp_path)), "the workers to die")

        plane.start()
        with plane.client() as client:
            ended = {}
            for job_id in jobs:
                wait_for(
                    lambda j=job_id: client.get_job(j)["state"] in TERMINAL,
                    f"job {job_id} to end",
                    seconds=300,
                )
                ended[job_id] = client.get_job(job_id)
                assert _terminal_events(client, job_id) == ["SUCCEEDED"]
            assert {job["state"] for job in ended.values()} == {"SUCCEEDED"}, ended
            # Relaunched once, from the checkpoint.
            assert all(job["attempts"] == 2 for job in ended.values()), ended
            for job_id in jobs:
                lines = [line["message"] for line in client.logs(job_id)["items"]]
                assert any("resumed from the checkpoint" in line for line in lines)
    assert census.samples > 0
    assert census.most == dict.fromkeys(jobs, 1), census.twice
    assert worker_pids(tmp_path) == [] and agent_pids(tmp_path) == {}


@pytest.mark.parametrize("backend", ["postgres"])
def test_jigsaw_up_starts_a_local_agent_that_died_again(
    request: pytest.FixtureRequest, tmp_path: Path, backend: str
) -> None:
    with ExitStack() as stack:
        plane = ControlPlane(stack, tmp_path, _settings(request, backend))
        plane.start()
        wait_for(lambda: plane.alive_nodes() == LOCAL_AGENTS, "the local agents")
        [victim] = agent_pids(tmp_path)["local-0"]
        os.kill(victim, signal.SIGKILL)
        wait_for(
            lambda: agent_pids(tmp_path).get("local-0", [victim]) != [victim],
            "local-0 started again",
        )
        # Once the scheduler has given up on the old one, the new one serves the node.
        with plane.client() as client:
            job_id = client.submit(_job("after", 50) | {"workers": 2 * LOCAL_AGENTS})["id"]
            wait_for(lambda: client.get_job(job_id)["state"] in TERMINAL, "the job", seconds=300)
            assert client.get_job(job_id)["state"] == "SUCCEEDED"
        logs = [path.read_text() for path in tmp_path.glob("server-*.log")]
        assert any("local agent local-0" in log and "starting it again" in log for log in logs)


def test_jigsaw_up_on_a_taken_port_fails_and_writes_no_credentials(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [*JIGSAW, "up", "--port", str(port), "--host", "127.0.0.1"],
            env=clean_env(tmp_path),
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert result.returncode == 1, result.stderr
    assert f"cannot serve the API on 127.0.0.1:{port}" in result.stderr
    assert "Traceback" not in result.stderr
    assert not credentials_path(tmp_path).exists()


def test_jigsaw_up_whose_grpc_port_is_taken_says_so_and_does_not_lead(tmp_path: Path) -> None:
    """Another process on the agents' port (another cluster's scheduler): this one
    serves the API, leads nothing and says why in one line, no traceback (checked as
    `jigsaw_up` exits); it leads once the port is free."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", free_port()))
        taken.listen()
        port = taken.getsockname()[1]
        env = {"JIGSAW_GRPC_PORT": str(port), "JIGSAW_SCHEDULER_LEADER_RETRY_SECONDS": "0.5"}
        with jigsaw_up(tmp_path, **env) as server:
            wait_for(
                lambda: (
                    f"cannot bind the agents' gRPC endpoint to 127.0.0.1:{port}"
                    in server.log.read_text()
                ),
                "the bind failure in the log",
            )
            taken.close()
            wait_for(
                lambda: f"agents' gRPC endpoint on 127.0.0.1:{port}" in server.log.read_text(),
                "the endpoint once the port is free",
            )


def test_free_ports_are_bindable_and_none_the_kernel_hands_to_client_connections() -> None:
    """A port from a bind to 0 is ephemeral: a client connection may take it before the
    server started on it binds (then `jigsaw up` cannot serve, and a test flakes)."""
    ephemeral = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    for _ in range(50):
        port = free_port()
        assert port < min(int(ephemeral[0]), 29500)  # nor torch's rendezvous ports
        with socket.socket() as server:
            server.bind(("127.0.0.1", port))


# A stand-in for the demo: starts `jigsaw up` bound to itself, says its pid, sleeps.
_LAUNCHER = f"""
import os, subprocess, sys, time
env = dict(os.environ, {UP_PARENT_PID_ENV}=str(os.getpid()))
up = subprocess.Popen([*sys.argv[1:], "up", "--port", "0", "--local-agents", "1"], env=env)
print(up.pid, flush=True)
time.sleep(600)
"""


def test_a_jigsaw_up_started_by_a_killed_program_goes_with_its_agents(tmp_path: Path) -> None:
    launcher = subprocess.Popen(
        [sys.executable, "-c", _LAUNCHER, *JIGSAW],
        env=clean_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert launcher.stdout is not None
        up = int(launcher.stdout.readline())
        wait_for(lambda: agent_pids(tmp_path) != {}, "the local agent")
        launcher.kill()
        launcher.wait()
        wait_for(lambda: not alive(up), "jigsaw up to die with the program that started it")
        wait_for(lambda: agent_pids(tmp_path) == {}, "its local agent to die with it")
    finally:
        launcher.kill()
        launcher.wait()
        _kill_leftovers(tmp_path)


def test_jigsaw_up_whose_starter_is_already_gone_refuses_to_start(tmp_path: Path) -> None:
    result = subprocess.run(
        [*JIGSAW, "up", "--port", "0"],
        env=clean_env(tmp_path, **{UP_PARENT_PID_ENV: "1"}),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert "not starting: the program (pid 1) that started it is gone" in result.stderr
    assert "Traceback" not in result.stderr


# -- fault injection ----------------------------------------------------------------

KILLS = 20
SEED = 19
JOBS_AT_ONCE = 3
JOB_ITERATIONS = 300


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite"])
def test_random_kills_of_agents_and_jigsaw_up_lose_no_job_and_run_none_twice(
    request: pytest.FixtureRequest, tmp_path: Path, backend: str
) -> None:
    chance = random.Random(SEED)
    submitted: list[int] = []
    kills = {"agent": 0, "jigsaw up": 0}
    with ExitStack() as stack, Census(tmp_path).counting() as census:
        plane = ControlPlane(stack, tmp_path, _settings(request, backend))
        plane.start()
        wait_for(lambda: plane.alive_nodes() == LOCAL_AGENTS, "the local agents")
        for _ in range(KILLS):
            # Keep a few jobs in flight, so that every kill lands among running work.
            with plane.client() as client:
                active = [j for j in submitted if client.get_job(j)["state"] not in TERMINAL]
                for _ in range(JOBS_AT_ONCE - len(active)):
                    name = f"j{len(submitted)}"
                    submitted.append(client.submit(_job(name, JOB_ITERATIONS))["id"])
            time.sleep(chance.uniform(0.5, 6.0))
            agents = sorted(agent_pids(tmp_path).items())
            if agents and chance.random() < 0.6:
                _, pids = chance.choice(agents)
                os.kill(chance.choice(pids), signal.SIGKILL)
                kills["agent"] += 1
            else:
                plane.restart()
                kills["jigsaw up"] += 1
        with plane.client() as client:
            for job_id in submitted:
                wait_for(
                    lambda j=job_id: client.get_job(j)["state"] in TERMINAL,
                    f"job {job_id} to end",
                    seconds=300,
                )
            ended = {job_id: client.get_job(job_id) for job_id in submitted}
            terminal = {job_id: _terminal_events(client, job_id) for job_id in submitted}
    assert sum(kills.values()) == KILLS and min(kills.values()) > 0, kills
    assert {job["state"] for job in ended.values()} == {"SUCCEEDED"}, ended
    assert all(events == ["SUCCEEDED"] for events in terminal.values()), terminal
    assert census.samples > 0
    assert set(census.most) <= set(submitted)
    assert max(census.most.values()) == 1, (census.most, census.twice)
    assert worker_pids(tmp_path) == [] and agent_pids(tmp_path) == {}
