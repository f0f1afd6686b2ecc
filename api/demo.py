"""`jigsaw demo`: a throwaway real cluster on this machine, a few jobs, live progress.

It runs `jigsaw up --local-agents 2` (API, scheduler, gRPC endpoint and two worker
agents with virtual GPUs backed by CPU processes) on a fresh SQLite home, submits a
small mixed set of real training jobs (one spanning both agents), shows their progress
live and ends with a summary: job completion time and final loss/accuracy per job.
"""

from __future__ import annotations

import getpass
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from api.client import ApiError, JigsawClient
from api.credentials import Credentials, load_credentials
from api.server import free_port
from scheduler.core.states import TERMINAL

AGENTS = 2
GPUS_PER_AGENT = 2
_START_SECONDS = 90.0
_POLL_SECONDS = 0.5

# Small enough for 2 CPU cores: four virtual GPUs share them. The transformer takes
# three GPUs, more than one agent has, so it spans both.
DEMO_JOBS: list[dict[str, Any]] = [
    {
        "name": "digits-mlp",
        "workload": "digits-mlp",
        "workers": 1,
        "hyperparameters": {"batch_size": 64, "learning_rate": 0.05},
        "max_iterations": 300,
    },
    {
        "name": "lm-2-agents",
        "workload": "text-transformer",
        "workers": 3,
        "hyperparameters": {"batch_size": 48, "learning_rate": 0.003, "optimizer": "adam"},
        "max_iterations": 150,
    },
    {
        "name": "digits-cnn",
        "workload": "digits-cnn",
        "workers": 2,
        "hyperparameters": {"batch_size": 64, "learning_rate": 0.05},
        "max_iterations": 200,
    },
    {
        "name": "resnet",
        "workload": "resnet-synthetic",
        "workers": 1,
        "hyperparameters": {"batch_size": 32},
        "max_iterations": 40,
    },
]


class DemoError(Exception):
    """The demo cluster could not start or the API refused; the message says why."""


def run_demo(console: Console, workdir: Path, state_style: Callable[[str], str]) -> int:
    """Run the demo in `workdir`; returns the number of jobs that did not succeed."""
    with (
        _cluster(console, workdir) as credentials,
        JigsawClient(credentials.url, credentials.token) as client,
    ):
        console.print(f"API on {credentials.url} (interactive docs at {credentials.url}/docs)")
        ids = [client.submit(spec)["id"] for spec in DEMO_JOBS]
        with Live(console=console, refresh_per_second=2) as live:
            while True:
                jobs = [client.get_job(job_id) for job_id in ids]
                live.update(_progress_table(jobs, state_style))
                if all(job.get("state") in TERMINAL for job in jobs):
                    break
                time.sleep(_POLL_SECONDS)
        if not console.is_terminal:
            console.line()  # Live leaves the cursor after its last frame off a terminal
        console.print(_summary_table(client, jobs, state_style))
        return sum(job.get("state") != "SUCCEEDED" for job in jobs)


@contextmanager
def _cluster(console: Console, workdir: Path) -> Iterator[Credentials]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("JIGSAW_")}
    env.update(
        JIGSAW_HOME=str(workdir),
        JIGSAW_SCHEDULER_ROUND_SECONDS="0.25",
        JIGSAW_GRPC_PORT=str(free_port()),
        # The demo's own built-in jobs only, on a cluster that ends with it: its training
        # processes run as this user unless told otherwise (as root, the default worker
        # user could not reach a Python or a home under a private /root).
        JIGSAW_AGENT_WORKER_USER=os.environ.get("JIGSAW_AGENT_WORKER_USER", getpass.getuser()),
    )
    log_path = workdir / "server.log"
    console.print(
        f"starting API, scheduler and {AGENTS} agents with {GPUS_PER_AGENT} virtual GPUs "
        f"each in {workdir}"
    )
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "api.cli", "up", "--port", str(port),
             "--local-agents", str(AGENTS), "--gpus-per-agent", str(GPUS_PER_AGENT)],
            env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        yield _wait_ready(process, workdir, log_path)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
        console.print(f"cluster stopped; logs in {workdir}")


def _wait_ready(process: subprocess.Popen[bytes], workdir: Path, log: Path) -> Credentials:
    """The credentials, once the API answers and every agent has registered."""
    deadline = time.monotonic() + _START_SECONDS
    while True:
        if process.poll() is not None:
            raise DemoError(f"the server exited ({process.returncode}); see {log}")
        if time.monotonic() > deadline:
            raise DemoError(f"the cluster did not start within {_START_SECONDS:.0f} s; see {log}")
        found = load_credentials(workdir)
        if found is not None:
            try:
                with JigsawClient(found.url, found.token, timeout=2) as probe:
                    nodes = probe.cluster().get("nodes", [])
                if sum(bool(node.get("alive")) for node in nodes) >= AGENTS:
                    return found
            except ApiError:
                pass
        time.sleep(0.3)


def _progress_table(jobs: list[dict[str, Any]], state_style: Callable[[str], str]) -> Table:
    table = Table(title="jobs (Ctrl-C to stop)", title_justify="left", header_style="bold")
    for column in ("ID", "NAME", "STATE", "GPUS", "PROGRESS", "LAST EVALUATION"):
        table.add_column(column)
    for job in jobs:
        spec = job.get("spec") or {}
        done, total = job.get("iterations_done", 0), spec.get("max_iterations") or 0
        state = state_style(str(job.get("state")))
        if job.get("state") == "FAILED":
            state += "\n" + escape(str(job.get("message") or "")[-200:])
        table.add_row(
            str(job.get("id")),
            escape(str(job.get("name"))),
            state,
            str(job.get("workers")),
            f"{done}/{total}" if total else str(done),
            _metrics_text(job.get("metrics") or {}),
        )
    return table


def _summary_table(
    client: JigsawClient, jobs: list[dict[str, Any]], state_style: Callable[[str], str]
) -> Table:
    table = Table(title="summary", title_justify="left", header_style="bold")
    for column in ("ID", "NAME", "STATE", "JCT", "ITERATIONS", "FINAL LOSS", "ACCURACY"):
        table.add_column(column)
    for job in jobs:
        metrics = job.get("metrics") or {}
        loss = metrics.get("loss")
        if loss is None:
            points = client.metrics(int(job["id"]), points=1).get("points", [])
            loss = points[-1].get("loss") if points else None
        accuracy = metrics.get("accuracy")
        table.add_row(
            str(job.get("id")),
            escape(str(job.get("name"))),
            state_style(str(job.get("state"))),
            _jct(job),
            str(job.get("iterations_done")),
            f"{loss:.3f}" if loss is not None else "-",
            f"{accuracy:.3f}" if accuracy is not None else "-",
        )
    return table


def _jct(job: dict[str, Any]) -> str:
    """Job completion time: submission to end."""
    try:
        start = datetime.fromisoformat(job["created_at"])
        end = datetime.fromisoformat(job["finished_at"])
    except (KeyError, TypeError, ValueError):
        return "-"
    return f"{(end - start).total_seconds():.1f} s"


def _metrics_text(metrics: dict[str, float]) -> str:
    return " ".join(f"{name} {value:.3f}" for name, value in sorted(metrics.items()))
