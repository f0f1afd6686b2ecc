"""Scheduler failover: how long the cluster goes without a leader when the leader dies.

Two real `jigsaw up` replicas (API + scheduler campaign) on one scratch PostgreSQL
database. Each run stops the current leader and times, from the moment its process is
gone, until the other replica reports itself leader on /metrics (polled every 50 ms);
the stopped replica is then started again as the new follower. Runs alternate a
graceful stop (SIGTERM: the leader releases its lock on the way out; the baseline) and
a crash (SIGKILL: PostgreSQL frees the advisory lock when the connection drops), so
that the crash's extra cost is the difference. Target: takeover after a SIGKILL within
10 s.

    python -m benchmarks.failover [--runs 4] [--retry-seconds 2] [--json | --markdown]
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

from benchmarks.harness import add_output_options, emit
from tests.servers import Server, jigsaw_up, scratch_postgres

POSTGRES = os.environ.get(
    "JIGSAW_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
POLL_SECONDS = 0.05
STOPS = {"sigterm": signal.SIGTERM, "sigkill": signal.SIGKILL}


def leads(server: Server) -> bool:
    try:
        scrape = httpx.get(f"{server.url}/metrics", timeout=5).text
    except httpx.TransportError:
        return False
    match = re.search(r"^jigsaw_scheduler_leader (\S+)$", scrape, re.MULTILINE)
    return match is not None and float(match.group(1)) == 1.0


def _wait(condition: Any, what: str, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(POLL_SECONDS)


def measure(runs: int, retry_seconds: float) -> list[tuple[str, float]]:
    results = []
    with (
        scratch_postgres(POSTGRES) as url,
        tempfile.TemporaryDirectory(prefix="jigsaw-failover-") as home,
    ):
        env = {
            "JIGSAW_DATABASE_URL": url,
            "JIGSAW_SCHEDULER_LEADER_RETRY_SECONDS": str(retry_seconds),
        }
        with ExitStack() as stack:
            replicas = [stack.enter_context(jigsaw_up(Path(home) / "a", **env))]
            _wait(lambda: leads(replicas[0]), "the first replica to lead")
            replicas.append(stack.enter_context(jigsaw_up(Path(home) / "b", **env)))
            for run in range(runs):
                mode = list(STOPS)[run % len(STOPS)]
                leader, follower = replicas
                leader.killed = True
                leader.proc.send_signal(STOPS[mode])
                leader.proc.wait()
                gone = time.monotonic()
                _wait(lambda f=follower: leads(f), "the follower to lead")
                results.append((mode, time.monotonic() - gone))
                restarted = stack.enter_context(jigsaw_up(leader.home, **env))
                replicas = [follower, restarted]
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=6, help="leader stops, alternating modes")
    parser.add_argument("--retry-seconds", type=float, default=2.0, help="campaign period")
    add_output_options(parser)
    args = parser.parse_args()
    results = measure(args.runs, args.retry_seconds)
    baseline = statistics.median(s for m, s in results if m == "sigterm")
    rows = []
    for mode in STOPS:
        times = sorted(s for m, s in results if m == mode)
        rows.append(
            {
                "case": mode,
                "runs": len(times),
                "median_s": statistics.median(times),
                "max_s": times[-1],
                "vs_sigterm": statistics.median(times) / baseline,
                "retry_s": args.retry_seconds,
            }
        )
    emit(
        rows,
        "Scheduler failover: leader stopped -> the other replica leads (target 10 s)",
        args.output,
    )


if __name__ == "__main__":
    main()
