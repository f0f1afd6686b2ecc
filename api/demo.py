"""`jigsaw demo`: a throwaway real cluster on this machine, a few jobs, live progress.

It runs `jigsaw up --local-agents 2` (API, scheduler, gRPC endpoint and two worker
agents with virtual GPUs backed by CPU processes) on a fresh SQLite home under the
default policy, JigSaw, submits a small mixed set of real training jobs (one spanning
both agents, one whose SPB configuration the scheduler chooses), shows their progress
and the scheduler's decisions live, and ends with what each job reached and what the
scheduler did; then it runs the same jobs first-come-first-served (FIFO) on a fresh
cluster and sets the two side by side, both measured in this run (`--no-compare`
skips that second pass).
"""

from __future__ import annotations

import getpass
import math
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from statistics import mean
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from api.client import ApiError, JigsawClient
from api.credentials import Credentials, load_credentials
from api.server import free_port
from scheduler.core import rounds
from scheduler.core.states import TERMINAL
from worker_agent.runtime.lifeline import UP_PARENT_PID_ENV

AGENTS = 2
GPUS_PER_AGENT = 2
_START_SECONDS = 90.0
_POLL_SECONDS = 0.5
_DECISIONS_SHOWN = 6
# Decisions worth a line in the live feed (`scheduler.core.rounds`' kinds).
_NOTABLE = (
    rounds.LEASE,
    rounds.SUSPEND,
    rounds.RECONFIGURE,
    rounds.RESIZE,
    rounds.RESIZED,
    rounds.REQUEUE,
)

# Small enough for 2 CPU cores: four virtual GPUs share them. Every job learns
# something real (digits, text); the transformer takes three GPUs, more than one agent
# has, so it spans both; `spb: auto` leaves that job's SPB configuration to JigSaw.
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
        "name": "digits-cnn-spb",
        "workload": "digits-cnn",
        "workers": 2,
        "spb": "auto",
        "hyperparameters": {"batch_size": 64, "learning_rate": 0.05},
        "max_iterations": 200,
    },
]


class DemoError(Exception):
    """The demo cluster could not start or the API refused; the message says why."""


@dataclass
class PolicyRun:
    """One pass of the demo's jobs under one policy, as measured."""

    policy: str
    jobs: list[dict[str, Any]] = field(default_factory=list)
    decisions: Counter[str] = field(default_factory=Counter)

    @property
    def failed(self) -> int:
        return sum(job.get("state") != "SUCCEEDED" for job in self.jobs)

    @property
    def jcts(self) -> list[float]:
        return [jct for job in self.jobs if (jct := _jct_seconds(job)) is not None]

    @property
    def makespan(self) -> float | None:
        """First submission to last end."""
        try:
            start = min(datetime.fromisoformat(job["created_at"]) for job in self.jobs)
            end = max(datetime.fromisoformat(job["finished_at"]) for job in self.jobs)
        except (KeyError, TypeError, ValueError):
            return None
        return (end - start).total_seconds()


def run_demo(
    console: Console, workdir: Path, state_style: Callable[[str], str], compare: bool = True
) -> int:
    """Run the demo in `workdir`; returns the number of jobs that did not succeed."""
    runs = [_run(console, workdir, "jigsaw", state_style)]
    if compare:
        console.print("the same jobs first-come-first-served (FIFO), for comparison")
        runs.append(_run(console, workdir / "fifo", "fifo", state_style))
    console.print(decisions_table(runs[0]))
    if compare:
        console.print(comparison_table(runs))
    return sum(run.failed for run in runs)


def _run(
    console: Console, workdir: Path, policy: str, state_style: Callable[[str], str]
) -> PolicyRun:
    run = PolicyRun(policy)
    seen: set[int] = set()
    feed: list[str] = []
    with (
        _cluster(console, workdir, policy) as credentials,
        JigsawClient(credentials.url, credentials.token) as client,
    ):
        console.print(f"API on {credentials.url} (interactive docs at {credentials.url}/docs)")
        ids = [client.submit(spec)["id"] for spec in DEMO_JOBS]
        names = {job_id: spec["name"] for job_id, spec in zip(ids, DEMO_JOBS, strict=True)}
        with Live(console=console, refresh_per_second=2) as live:
            while True:
                run.jobs = [client.get_job(job_id) for job_id in ids]
                _follow_decisions(client, run, seen, feed, names)
                live.update(Group(_progress_table(run.jobs, state_style), _feed_table(feed)))
                if all(job.get("state") in TERMINAL for job in run.jobs):
                    break
                time.sleep(_POLL_SECONDS)
        if not console.is_terminal:
            console.line()  # Live leaves the cursor after its last frame off a terminal
        console.print(_summary_table(client, run.jobs, state_style))
    return run


def _follow_decisions(
    client: JigsawClient,
    run: PolicyRun,
    seen: set[int],
    feed: list[str],
    names: dict[int, str],
) -> None:
    """Count the rounds' decisions not seen yet and keep the latest notable ones."""
    recent = client.rounds(limit=50, decisions=True).get("items", [])
    for item in reversed(recent):  # oldest first
        if item["id"] in seen:
            continue
        seen.add(item["id"])
        for decision in item.get("decisions", []):
            kind = str(decision.get("kind"))
            run.decisions[kind] += 1
            if kind in _NOTABLE:
                job = names.get(decision.get("job_id") or 0, "-")
                details = ", ".join(
                    f"{key} {value}"
                    for key, value in decision.items()
                    if key in ("gpus", "nodes", "spb", "reason", "held")
                )
                feed.append(f"{kind:<12} {job:<15} {details}"[:100])
    del feed[:-_DECISIONS_SHOWN]


def decisions_table(run: PolicyRun) -> Table:
    """What the scheduler did in a run, by kind of decision."""
    table = Table(title=f"what {run.policy} decided", title_justify="left", header_style="bold")
    table.add_column("DECISION")
    table.add_column("COUNT", justify="right")
    for kind, count in sorted(run.decisions.items()):
        table.add_row(escape(kind), str(count))
    return table


def comparison_table(runs: list[PolicyRun]) -> Table:
    """The same jobs under each policy: makespan and job completion times, measured."""
    table = Table(title="the same jobs, measured", title_justify="left", header_style="bold")
    for column in (
        "POLICY",
        "MAKESPAN",
        "MEAN JCT",
        "SUCCEEDED",
        f"MAKESPAN VS {runs[0].policy.upper()}",
    ):
        table.add_column(column, justify="left" if column == "POLICY" else "right")
    first = runs[0]
    for run in runs:
        jcts = run.jcts
        ratio = "-"
        if first.makespan and run.makespan:
            ratio = f"{run.makespan / first.makespan:.2f}x"
        table.add_row(
            run.policy,
            f"{run.makespan:.1f} s" if run.makespan is not None else "-",
            f"{mean(jcts):.1f} s" if jcts else "-",
            f"{len(run.jobs) - run.failed}/{len(run.jobs)}",
            ratio,
        )
    return table


@contextmanager
def _cluster(console: Console, workdir: Path, policy: str) -> Iterator[Credentials]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("JIGSAW_")}
    env.update(
        JIGSAW_HOME=str(workdir),
        JIGSAW_SCHEDULER_ROUND_SECONDS="0.25",
        JIGSAW_SCHEDULER_POLICY=policy,
        JIGSAW_GRPC_PORT=str(free_port()),
        **{UP_PARENT_PID_ENV: str(os.getpid())},  # a killed demo leaves no cluster behind
        # The demo's own built-in jobs only, on a cluster that ends with it: its training
        # processes run as this user unless told otherwise (as root, the default worker
        # user could not reach a Python or a home under a private /root).
        JIGSAW_AGENT_WORKER_USER=os.environ.get("JIGSAW_AGENT_WORKER_USER", getpass.getuser()),
    )
    log_path = workdir / "server.log"
    workdir.mkdir(parents=True, exist_ok=True)
    console.print(
        f"starting API, scheduler ({policy}) and {AGENTS} agents with {GPUS_PER_AGENT} "
        f"virtual GPUs each in {workdir}"
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
        table.add_column(column, no_wrap=column == "NAME")
    for job in jobs:
        spec = job.get("spec") or {}
        done = math.floor(job.get("progress", job.get("iterations_done", 0)))
        total = spec.get("max_iterations") or 0
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
        table.add_column(column, no_wrap=column == "NAME")
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


def _jct_seconds(job: dict[str, Any]) -> float | None:
    """Job completion time: submission to end."""
    try:
        start = datetime.fromisoformat(job["created_at"])
        end = datetime.fromisoformat(job["finished_at"])
    except (KeyError, TypeError, ValueError):
        return None
    return (end - start).total_seconds()


def _jct(job: dict[str, Any]) -> str:
    seconds = _jct_seconds(job)
    return "-" if seconds is None else f"{seconds:.1f} s"


def _feed_table(feed: list[str]) -> Table:
    table = Table(title="scheduler decisions (latest)", title_justify="left", header_style="bold")
    table.add_column("DECISION  JOB  DETAILS")
    for line in feed or ["(none yet)"]:
        table.add_row(escape(line))
    return table


def _metrics_text(metrics: dict[str, float]) -> str:
    return " ".join(f"{name} {value:.3f}" for name, value in sorted(metrics.items()))
