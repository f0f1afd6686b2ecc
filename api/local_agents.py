"""Worker agents `jigsaw up --local-agents N` runs on this machine, as child processes.

Each is a real `jigsaw agent` with its own node name (`local-0`, `local-1`, ...) and
virtual GPUs, dialling this process's gRPC endpoint exactly as a remote agent would;
the embedded default is a real cluster, only a small one.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

logger = logging.getLogger(__name__)

NODE_PREFIX = "local-"
# Under JIGSAW_HOME: one work directory per local agent.
WORK_ROOT = "agents"
_LOG_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW
# Agents stop their jobs' processes before exiting; give them time to.
_STOP_SECONDS = 30.0


class LocalAgents:
    def __init__(
        self, home: Path, *, scheduler: str, token_file: Path, count: int, gpus_per_agent: int
    ) -> None:
        self._home = home
        self._scheduler = scheduler
        self._token_file = token_file
        self._count = count
        self._gpus = gpus_per_agent
        self._processes: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        for i in range(self._count):
            name = f"{NODE_PREFIX}{i}"
            work_dir = self._home / WORK_ROOT / name
            work_dir.mkdir(parents=True, exist_ok=True)
            # The agent's log is its own: workers may search this directory (as root,
            # another user's), never read what the agent says about other jobs.
            log = os.fdopen(os.open(work_dir / "agent.log", _LOG_FLAGS, 0o600), "ab")
            command = [
                sys.executable, "-m", "api.cli", "agent",
                "--scheduler", self._scheduler,
                "--gpus", str(self._gpus),
                "--node-name", name,
                "--token-file", str(self._token_file),
                "--work-dir", str(work_dir),
            ]  # fmt: skip
            with log:
                self._processes.append(
                    subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
                )
            logger.info(
                "local agent %s with %d virtual GPU(s); log %s",
                name,
                self._gpus,
                work_dir / "agent.log",
            )

    def stop(self) -> None:
        for process in self._processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self._processes:
            try:
                process.wait(timeout=_STOP_SECONDS)
            except subprocess.TimeoutExpired:
                logger.warning("local agent pid %d did not stop; killing it", process.pid)
                process.kill()
                process.wait()
        self._processes.clear()
