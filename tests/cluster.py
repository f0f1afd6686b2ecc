"""A real cluster on loopback for end-to-end tests: `jigsaw up` plus `jigsaw agent`
processes with virtual GPUs, each a separate process that a test may kill."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from api.client import JigsawClient
from api.credentials import agent_token_path, load_credentials
from api.server import free_port
from tests.servers import JIGSAW, TERMINAL, Server, clean_env, jigsaw_up

# A scenario of real training processes runs on one backend (the `db_url` fixture's
# parameter): the control-plane tests take every store path on both, and the scenarios
# are dealt between the two so that each backend carries some.
ON_SQLITE = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
ON_POSTGRES = pytest.mark.parametrize(
    "db_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)

# A scenario that kills or pauses an agent adds LOSE_AGENTS_FAST to `cluster`'s settings,
# so the loss is noticed within seconds. Other scenarios keep the scheduler's default
# (30 s): on a loaded host a live agent's heartbeats come seconds late, and one declared
# lost requeues its jobs under the test (CI failures that looked like scheduling bugs).
LOST_AGENT_SECONDS = 4
LOSE_AGENTS_FAST = {"JIGSAW_SCHEDULER_AGENT_TIMEOUT_SECONDS": str(LOST_AGENT_SECONDS)}
CHECKPOINT_EVERY = 10


@dataclass
class Cluster:
    home: Path
    grpc_port: int
    env: dict[str, str]
    stack: ExitStack
    server: Server | None = None
    agents: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def client(self) -> JigsawClient:
        assert self.server is not None
        credentials = load_credentials(self.home)
        assert credentials is not None
        return JigsawClient(self.server.url, credentials.token)

    def start_server(self) -> None:
        self.server = self.stack.enter_context(jigsaw_up(self.home, **self.env))

    def start_agent(self, name: str, gpus: int | str, **env: str) -> subprocess.Popen[bytes]:
        """`jigsaw agent` for node `name` with `gpus` (N virtual, or `auto`); `env` adds
        settings (JIGSAW_AGENT_WARM_WORKERS)."""
        log = (self.home / f"agent-{name}.log").open("ab")
        with log:
            self.agents[name] = subprocess.Popen(
                [*JIGSAW, "agent", "--scheduler", f"127.0.0.1:{self.grpc_port}",
                 "--gpus", str(gpus), "--node-name", name,
                 "--token-file", str(agent_token_path(self.home)),
                 "--work-dir", str(self.home / name)],
                env=clean_env(self.home, **{**self.env, **env}), stdout=log, stderr=log,
            )  # fmt: skip
        self.stack.callback(_stop, self.agents[name])
        return self.agents[name]

    def agent_log(self, name: str) -> str:
        return (self.home / f"agent-{name}.log").read_text(errors="replace")

    def wait_nodes(self, alive: int) -> None:
        with self.client() as client:
            try:
                wait_for(
                    lambda: sum(n["alive"] for n in client.cluster()["nodes"]) == alive,
                    f"{alive} alive node(s)",
                )
            except AssertionError as exc:  # say why the agents did not come up
                raise AssertionError(f"{exc}\n{self._agent_logs()}") from None

    def _agent_logs(self) -> str:
        """Each agent's exit status (None: running) and its log's tail."""
        return "\n".join(
            f"agent {name} (exit status {process.poll()}):\n{self.agent_log(name)[-3000:]}"
            for name, process in self.agents.items()
        )

    def wait_job(self, job_id: int, done: Callable[[dict[str, Any]], bool], what: str) -> Any:
        with self.client() as client:
            job: dict[str, Any] = {}

            def check() -> bool:
                nonlocal job
                job = client.get_job(job_id)
                return done(job)

            wait_for(check, f"job {job_id} {what}", seconds=240)
            return job

    def wait_success(self, job_id: int) -> Any:
        """Wait for the job to end and assert it SUCCEEDED; when it did not, the message
        carries its events, its last log lines and the agents' logs' tails, so that a
        failure seen once under load can be read from the test report."""
        job = self.wait_job(job_id, ended, "ended")
        if job["state"] != "SUCCEEDED":
            with self.client() as client:
                events = [(e["kind"], e["data"]) for e in client.events(job_id)["items"]]
                lines = [line["message"] for line in client.logs(job_id, limit=1000)["items"]][-40:]
            raise AssertionError(
                f"job {job_id} ended {job['state']}: {job['message']}\n"
                f"events: {events}\nlog: {lines}\n{self._agent_logs()}"
            )
        return job


@contextmanager
def cluster(home: Path, **env: str) -> Iterator[Cluster]:
    """`jigsaw up` on `home` (and `env`'s database), without agents: tests add them."""
    grpc_port = free_port()
    settings = {
        "JIGSAW_GRPC_PORT": str(grpc_port),
        "JIGSAW_SCHEDULER_ROUND_SECONDS": "0.2",
        "JIGSAW_SCHEDULER_CHECKPOINT_EVERY": str(CHECKPOINT_EVERY),
        **env,
    }
    with ExitStack() as stack:
        running = Cluster(home, grpc_port, settings, stack)
        running.start_server()
        yield running


def wait_for(condition: Callable[[], bool], what: str, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {seconds:.0f} s waiting for {what}")
        time.sleep(0.2)


def ended(job: dict[str, Any]) -> bool:
    return job["state"] in TERMINAL


def worker_pids(home: Path) -> list[int]:
    """Training processes whose configuration lies under `home` (this test's cluster)."""
    return [pid for pid, command in _processes(home) if "worker_agent.runtime.worker" in command]


def incarnations(home: Path) -> dict[int, list[tuple[int, Path]]]:
    """Job id -> the live runs of the job under `home`, as (pid, configuration) of their
    rank 0 processes (every run has exactly one, wherever its ranks are)."""
    runs: dict[int, list[tuple[int, Path]]] = {}
    for pid, command in _processes(home):
        if "worker_agent.runtime.worker" in command and "--config" in command:
            config = Path(command[command.index("--config") + 1])
            if config.name == "rank-0.json" and config.parent.name.startswith("job-"):
                job_id = int(config.parent.name.removeprefix("job-"))
                runs.setdefault(job_id, []).append((pid, config))
    return runs


def alive(pid: int) -> bool:
    """Running: a zombie is dead for our purpose (init reaps it once its parent is gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def agent_pids(home: Path) -> dict[str, list[int]]:
    """Node name -> pids of the `jigsaw agent` processes working under `home`."""
    agents: dict[str, list[int]] = {}
    for pid, command in _processes(home):
        if "agent" in command and "--node-name" in command:
            agents.setdefault(command[command.index("--node-name") + 1], []).append(pid)
    return agents


def _processes(home: Path) -> list[tuple[int, list[str]]]:
    """(pid, argv) of the live processes whose command line names `home`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if any(str(home) in part for part in command):
            found.append((int(entry.name), command))
    return found


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def kill(process: subprocess.Popen[bytes]) -> None:
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
