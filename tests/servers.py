"""Real servers for tests and benchmarks: `jigsaw up` subprocesses, scratch PostgreSQL DBs."""

from __future__ import annotations

import getpass
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import uvicorn
from fastapi import FastAPI
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from api.credentials import load_credentials
from api.server import free_port

_SCRIPT = Path(sys.executable).parent / "jigsaw"
JIGSAW = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "api.cli"]
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}
# What a test's HTTP call waits, not httpx's 5 s: a loaded CI host stalls for seconds (a
# schema built in 0.1 s here once timed out so).
HTTP_TIMEOUT_SECONDS = 30.0
# Tests' homes lie in pytest's temporary root, private to this user, which the default
# worker user (`nobody`, when tests run as root) cannot reach: agents in tests run their
# workers as this user. tests/test_isolation.py runs them as another user.
TEST_WORKER_USER = getpass.getuser()


def clean_env(home: Path, **extra: str) -> dict[str, str]:
    """The test's environment without any JIGSAW_* the developer may have set."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JIGSAW_")}
    env.update({"JIGSAW_HOME": str(home), "JIGSAW_AGENT_WORKER_USER": TEST_WORKER_USER, **extra})
    return env


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    home: Path
    url: str
    log: Path
    killed: bool = False  # the test killed it: its exit is not checked

    def token(self) -> str:
        credentials = load_credentials(self.home)
        assert credentials is not None
        return credentials.token


def jigsaw_up(home: Path, *args: str, **env_extra: str) -> AbstractContextManager[Server]:
    """`jigsaw up` on a free port until the block ends; then SIGTERM and a clean exit
    (unchecked once the test set `server.killed`).

    `env_extra` adds JIGSAW_* variables (a database URL, a round period).
    """
    return jigsaw_up_with(home, args, env_extra)


@contextmanager
def jigsaw_up_with(
    home: Path,
    args: Sequence[str],
    env_extra: Mapping[str, str],
    *,
    log_dir: Path | None = None,
    jigsaw: Sequence[str] = JIGSAW,
) -> Iterator[Server]:
    """`jigsaw_up` with its log in `log_dir` (leaving it to jigsaw up to create `home`)
    instead of `home`, run by the command `jigsaw`."""
    port = free_port()
    if log_dir is None:
        home.mkdir(parents=True, exist_ok=True)
    log = (log_dir or home) / f"server-{port}.log"
    # FIFO by name: these tests assert its first-come order (JigSaw, the default, is
    # driven live by test_jigsaw_replay).
    env = clean_env(
        home,
        **{"JIGSAW_SCHEDULER_ROUND_SECONDS": "0.1", "JIGSAW_SCHEDULER_POLICY": "fifo", **env_extra},
    )
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [*jigsaw, "up", "--port", str(port), *args], env=env, stdout=sink, stderr=sink
        )
    server = Server(proc, home, f"http://127.0.0.1:{port}", log)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, f"jigsaw up exited early:\n{log.read_text()[-3000:]}"
            try:
                if httpx.get(f"{server.url}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"not ready in 60 s:\n{log.read_text()[-3000:]}"
            time.sleep(0.1)
        yield server
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    output = log.read_text()
    if server.killed:
        return
    assert proc.returncode == 0, f"jigsaw up exited with {proc.returncode}:\n{output[-3000:]}"
    assert "Traceback" not in output, output[-3000:]


@contextmanager
def scratch_postgres(server_url: str, prefix: str = "jigsaw_test") -> Iterator[str]:
    """A fresh, empty PostgreSQL database on `server_url`'s server, dropped afterwards."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(server_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@contextmanager
def serve_app(app: FastAPI) -> Iterator[str]:
    """`app` under uvicorn on a loopback port in this process; yields its base URL."""
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
