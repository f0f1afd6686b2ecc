"""What the benchmarks on a live cluster share: waiting on it, and what its jobs took.

A live benchmark starts a real `jigsaw up` with agents (tests/servers.py,
tests/cluster.py), submits jobs through the API and reads back what the database
recorded: submission and end times, states, iterations, allocations.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from api.client import JigsawClient

POLL_SECONDS = 0.5


def wait(condition: Callable[[], bool], what: str, seconds: float = 600) -> None:
    """Poll `condition` until it holds; past `seconds`, end the benchmark saying why."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(POLL_SECONDS)


def alive_gpus(client: JigsawClient) -> int:
    return sum(len(node["gpus"]) for node in client.cluster()["nodes"] if node["alive"])


def timestamp(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


def makespan_and_mean_jct(jobs: Sequence[Mapping[str, Any]]) -> tuple[float, float]:
    """From the first submission to the last end, and the mean of each finished job's
    end less its submission (the API's `created_at` and `finished_at`)."""
    finished = [job for job in jobs if job["finished_at"]]
    ends = [timestamp(job["finished_at"]) for job in finished]
    makespan = max(ends) - min(timestamp(job["created_at"]) for job in jobs)
    jct = statistics.mean(
        timestamp(job["finished_at"]) - timestamp(job["created_at"]) for job in finished
    )
    return makespan, jct


def lost(jobs: Iterable[Mapping[str, Any]], specs: Iterable[Mapping[str, Any]]) -> set[int]:
    """Jobs that did not succeed with every iteration their spec asked for (an adaptive
    batch's: steps of its base batch, each step counting its AdaScale gain)."""
    return {
        job["id"]
        for job, spec in zip(jobs, specs, strict=True)
        if job["state"] != "SUCCEEDED" or not _all_done(job, spec["max_iterations"])
    }


def _all_done(job: Mapping[str, Any], wanted: int) -> bool:
    done, progress = job["iterations_done"], job["progress"]
    return done == wanted or done < wanted <= progress
