"""Worker agents `jigsaw up --local-agents N` runs on this machine, as child processes.

Each is a real `jigsaw agent` with its own node name (`local-0`, `local-1`, ...) and
virtual GPUs, dialling this process's gRPC endpoint exactly as a remote agent would;
the embedded default is a real cluster, only a small one.

The agents never outlive this process (`worker_agent.runtime.lifeline`: a death signal
and a pipe on their stdin), so a restarted `jigsaw up` starts the only agents of those
names, and their jobs are never run twice. An agent that dies is started again, after a
backoff that grows while it keeps dying.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from worker_agent.runtime.lifeline import UP_PID_ENV

# Under JIGSAW_HOME: one work directory per local agent.
WORK_ROOT = "agents"
_LOG_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW

logger = logging.getLogger(__name__)

NODE_PREFIX = "local-"
# Agents stop their jobs' processes before exiting; give them time to.
_STOP_SECONDS = 30.0
_WATCH_SECONDS = 0.5
# Restart backoff: doubles from the first to the most while an agent keeps dying; an
# agent that ran this long before it died starts over from the first.
_FIRST_RESTART_SECONDS = 1.0
_MOST_RESTART_SECONDS = 60.0
_HEALTHY_SECONDS = 60.0


@dataclass
class _Agent:
    name: str
    process: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    restarts: int = 0  # deaths in a row, each soon after its start
    restart_at: float = 0.0


class LocalAgents:
    def __init__(
        self, home: Path, *, scheduler: str, token_file: Path, count: int, gpus_per_agent: int
    ) -> None:
        self._home = home
        self._scheduler = scheduler
        self._token_file = token_file
        self._gpus = gpus_per_agent
        self._agents = [_Agent(f"{NODE_PREFIX}{i}") for i in range(count)]
        self._stopping = threading.Event()
        self._started = threading.Event()
        # The one thread that starts the agents, and it lives as long as they should:
        # PR_SET_PDEATHSIG fires when the thread that forked a child ends.
        self._keeper = threading.Thread(target=self._keep, name="jigsaw-local-agents", daemon=True)

    def start(self) -> None:
        """Start the agents (returns once each has been started) and keep them running."""
        self._keeper.start()
        self._started.wait()

    def stop(self) -> None:
        """Stop the agents (they stop their jobs first) and wait for them."""
        self._stopping.set()
        if self._keeper.is_alive():
            self._keeper.join()

    def pids(self) -> dict[str, int]:
        """Node name -> process id of each running agent (for tests and diagnostics)."""
        return {
            agent.name: agent.process.pid
            for agent in self._agents
            if agent.process is not None and agent.process.poll() is None
        }

    def _keep(self) -> None:
        try:
            for agent in self._agents:
                self._spawn(agent)
        finally:
            self._started.set()
        while not self._stopping.wait(_WATCH_SECONDS):
            for agent in self._agents:
                self._revive(agent)
        self._terminate()

    def _revive(self, agent: _Agent) -> None:
        """Start `agent` again if it died and its backoff has passed."""
        process = agent.process
        now = time.monotonic()
        if process is not None:
            code = process.poll()
            if code is None:
                return
            _close_lifeline(process)
            agent.process = None
            lived = now - agent.started
            agent.restarts = 0 if lived >= _HEALTHY_SECONDS else agent.restarts + 1
            delay = min(
                _MOST_RESTART_SECONDS, _FIRST_RESTART_SECONDS * 2 ** max(agent.restarts - 1, 0)
            )
            agent.restart_at = now + delay
            logger.warning(
                "local agent %s (pid %d) exited with code %d after %.0f s; starting it again "
                "in %.0f s (log %s)",
                agent.name,
                process.pid,
                code,
                lived,
                delay,
                self._work_dir(agent) / "agent.log",
            )
        if now >= agent.restart_at:
            self._spawn(agent)

    def _spawn(self, agent: _Agent) -> None:
        work_dir = self._work_dir(agent)
        try:
            work_dir.mkdir(parents=True, exist_ok=True)
            command = [
                sys.executable, "-m", "api.cli", "agent",
                "--scheduler", self._scheduler,
                "--gpus", str(self._gpus),
                "--node-name", agent.name,
                "--token-file", str(self._token_file),
                "--work-dir", str(work_dir),
            ]  # fmt: skip
            # The agent's log is its own: workers may search this directory (as root,
            # another user's), never read what the agent says about other jobs.
            with os.fdopen(os.open(work_dir / "agent.log", _LOG_FLAGS, 0o600), "ab") as log:
                agent.process = subprocess.Popen(
                    command,
                    # The lifeline: only this process holds the pipe's other end.
                    stdin=subprocess.PIPE,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env={**os.environ, UP_PID_ENV: str(os.getpid())},
                )
        except OSError as exc:
            agent.restarts += 1
            agent.restart_at = time.monotonic() + _MOST_RESTART_SECONDS
            logger.error("could not start local agent %s: %s", agent.name, exc)
            return
        agent.started = time.monotonic()
        logger.info(
            "local agent %s (pid %d) with %d virtual GPU(s); log %s",
            agent.name,
            agent.process.pid,
            self._gpus,
            work_dir / "agent.log",
        )

    def _terminate(self) -> None:
        running = [agent.process for agent in self._agents if agent.process is not None]
        for process in running:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in running:
            try:
                process.wait(timeout=_STOP_SECONDS)
            except subprocess.TimeoutExpired:
                logger.warning("local agent pid %d did not stop; killing it", process.pid)
                process.kill()
                process.wait()
            _close_lifeline(process)
        for agent in self._agents:
            agent.process = None

    def _work_dir(self, agent: _Agent) -> Path:
        return self._home / WORK_ROOT / agent.name


def _close_lifeline(process: subprocess.Popen[bytes]) -> None:
    if process.stdin is not None:
        process.stdin.close()
