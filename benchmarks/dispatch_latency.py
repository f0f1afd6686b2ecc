"""Dispatch latency on an idle cluster: job submission to its first reported iteration,
with cold worker processes against a warm pool (`JIGSAW_AGENT_WARM_WORKERS=1`) in the
same run.

The real stack on loopback (`tests.cluster`): `jigsaw up` on SQLite with a short
scheduler round, and one `jigsaw agent` with one virtual GPU, restarted before every run
with the mode's setting (same node name) so that each run finds an idle node: the agent
registered and, when warm, its pooled worker idle. Runs alternate cold and warm. Each run
submits a one-worker digits-mlp job (POST /v1/jobs) and polls GET /v1/jobs/{id}/metrics
every 20 ms until the first row appears: that is the latency users see. The scheduler's
own view is also given: the job's creation to its RUNNING event (launch acknowledged).
The first iteration of a run is flushed at once by the worker and the agent, so the
report batching does not count. Target: warm <= 1 s.

    python -m benchmarks.dispatch_latency [--runs 5] [--round-seconds 0.05] [--json | --markdown]
"""

from __future__ import annotations

import argparse
import signal
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from api.client import JigsawClient
from benchmarks.harness import add_output_options, emit
from tests.cluster import Cluster, cluster, ended, wait_for

NODE = "bench"
POLL_SECONDS = 0.02
MODES = {"cold": 0, "warm": 1}  # JIGSAW_AGENT_WARM_WORKERS of each mode
_REGISTERED = "registered with"
_IDLE = "idle, ready for a rank"


@dataclass(frozen=True)
class Run:
    mode: str
    first_metric_seconds: float  # POST /v1/jobs -> first metrics row readable
    running_seconds: float  # the job's creation -> its RUNNING event (server clock)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="runs per mode")
    parser.add_argument("--round-seconds", type=float, default=0.05)
    parser.add_argument("--iterations", type=int, default=20, help="max_iterations of each job")
    parser.add_argument(
        "--settle-seconds",
        type=float,
        default=2.0,
        help="pause once the agent is ready, so that the node is idle at submission",
    )
    add_output_options(parser)
    args = parser.parse_args()
    runs = measure(args.runs, args.round_seconds, args.iterations, args.settle_seconds)
    emit(
        summarize(runs),
        f"Dispatch latency, submission to first reported iteration (seconds; scheduler "
        f"round JIGSAW_SCHEDULER_ROUND_SECONDS={args.round_seconds}, {args.runs} runs "
        "per mode; target warm <= 1 s)",
        args.output,
    )


def measure(runs: int, round_seconds: float, iterations: int, settle: float) -> list[Run]:
    results = []
    with (
        tempfile.TemporaryDirectory(prefix="jigsaw-dispatch-") as home,
        cluster(Path(home), JIGSAW_SCHEDULER_ROUND_SECONDS=str(round_seconds)) as running,
        running.client() as client,
    ):
        for index in range(runs):
            for mode in MODES:  # interleaved, so drifts of the machine hit both alike
                results.append(_run(running, client, mode, index, iterations, settle))
    return results


def _run(
    running: Cluster, client: JigsawClient, mode: str, index: int, iterations: int, settle: float
) -> Run:
    agent = _start_ready_agent(running, mode)
    try:
        time.sleep(settle)
        spec = {
            "name": f"dispatch-{mode}-{index}",
            "workload": "digits-mlp",
            "workers": 1,
            "hyperparameters": {"batch_size": 64},
            "max_iterations": iterations,
        }
        submitted = time.monotonic()
        job_id = client.submit(spec)["id"]
        while not client.metrics(job_id)["points"]:
            time.sleep(POLL_SECONDS)
        first_metric = time.monotonic() - submitted
        running.wait_job(job_id, ended, "ended")
        _check_mode(running, job_id, mode)
        return Run(mode, first_metric, _running_seconds(client, job_id))
    finally:
        _stop(agent)


def _start_ready_agent(running: Cluster, mode: str) -> subprocess.Popen[bytes]:
    """The node's agent in `mode`, once registered and (warm) with its worker idle."""
    log = running.home / f"agent-{NODE}.log"
    before = log.read_text(errors="replace") if log.exists() else ""
    agent = running.start_agent(NODE, gpus=1, JIGSAW_AGENT_WARM_WORKERS=str(MODES[mode]))
    wanted = [_REGISTERED] + ([_IDLE] if MODES[mode] else [])

    def ready() -> bool:
        assert agent.poll() is None, f"the agent exited:\n{running.agent_log(NODE)[-3000:]}"
        text = running.agent_log(NODE)
        return all(text.count(line) > before.count(line) for line in wanted)

    wait_for(ready, f"the {mode} agent to be ready")
    running.wait_nodes(alive=1)
    return agent


def _check_mode(running: Cluster, job_id: int, mode: str) -> None:
    """The run used the worker its mode says (else the comparison means nothing)."""
    line = f"job {job_id}: started ranks [0] from iteration 0 (warm: [0])"
    assert (line in running.agent_log(NODE)) == bool(MODES[mode]), f"job {job_id} not {mode}"


def _running_seconds(client: JigsawClient, job_id: int) -> float:
    events = client.events(job_id)["items"]
    created = _time(events[0])
    running_at = next(_time(e) for e in events if e["to_state"] == "RUNNING")
    return (running_at - created).total_seconds()


def _time(event: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(event["created_at"])


def _stop(agent: subprocess.Popen[bytes]) -> None:
    agent.send_signal(signal.SIGTERM)
    try:
        agent.wait(timeout=60)
    except subprocess.TimeoutExpired:
        agent.kill()
        agent.wait()


def summarize(runs: list[Run]) -> list[dict[str, Any]]:
    cold_median = statistics.median(r.first_metric_seconds for r in runs if r.mode == "cold")
    rows = []
    for mode in MODES:
        first = sorted(r.first_metric_seconds for r in runs if r.mode == mode)
        scheduled = sorted(r.running_seconds for r in runs if r.mode == mode)
        rows.append(
            {
                "case": mode,
                "runs": len(first),
                "median_s": statistics.median(first),
                "min_s": first[0],
                "max_s": first[-1],
                "vs_cold": statistics.median(first) / cold_median,
                "running_median_s": statistics.median(scheduled),
                "running_max_s": scheduled[-1],
            }
        )
    return rows


if __name__ == "__main__":
    main()
