"""Load variants of the Pollux workloads, drawn from the Philly trace.

The Pollux artifact evaluates at 0.5x, 1.5x and 2x the jobs of its eight workloads
(160 jobs in 8 hours of the Philly trace, 16 x 4 GPUs) on workloads it holds back.
These are made the same way from `philly.csv`: an 8-hour window of the trace with
enough jobs (its start drawn with the seed), `factor` x 160 of its jobs sampled, their
submission times kept. Each job takes an application, GPU count and batch size from a
row of the given workloads, matched by GPU-time rank: the job at quantile q of the
window's GPU-times gets the row at quantile q of the given rows' GPU-times alone, so
long Philly jobs become long applications as in the given mix.
"""

from __future__ import annotations

import bisect
import csv
import math
import random
from datetime import datetime
from pathlib import Path

from scheduler.sim.trace import TraceError, TraceJob, Workload, pollux_parser

WINDOW_SECONDS = 8 * 3600.0
JOBS = 160  # per given workload: the 1.0x load
_TRIES = 1000


def _gpu_seconds(job: TraceJob) -> float:
    """GPU-seconds of the job alone on the GPUs it asks for."""
    per_node = 4
    placement = (per_node,) * (job.workers // per_node) + (
        (job.workers % per_node,) if job.workers % per_node else ()
    )
    return job.workers * job.iterations * job.speed.step_time(placement)[0]


def load_variant(
    philly: Path, given: list[Workload], factor: float, seed: int, apps_dir: Path
) -> Workload:
    """`factor` x 160 jobs of one 8-hour Philly window, as the given workloads' jobs."""
    if factor <= 0:
        raise TraceError(f"load factor must be positive, not {factor}")
    rows = sorted((job for workload in given for job in workload.jobs), key=_gpu_seconds)
    if not rows:
        raise TraceError("no given workload jobs to assign applications from")
    try:
        with philly.open(newline="") as handle:
            trace = [
                (datetime.fromisoformat(r["timestamp"]).timestamp(), float(r["gpu_time"]))
                for r in csv.DictReader(handle)
            ]
    except (OSError, KeyError, ValueError, csv.Error) as exc:
        raise TraceError(f"{philly}: cannot read ({exc})") from exc
    trace.sort()
    wanted = round(JOBS * factor)
    rng = random.Random(seed)
    times = [t for t, _ in trace]
    for _ in range(_TRIES):
        start = rng.choice(times)
        window = trace[
            bisect.bisect_left(times, start) : bisect.bisect_left(times, start + WINDOW_SECONDS)
        ]
        if len(window) >= wanted:
            break
    else:
        raise TraceError(f"{philly}: no 8-hour window with {wanted} jobs")
    sampled = sorted(rng.sample(window, wanted))
    by_gpu_time = sorted(range(wanted), key=lambda i: sampled[i][1])
    parse = pollux_parser(apps_dir)
    jobs: list[TraceJob] = []
    for rank, index in enumerate(by_gpu_time):
        row = rows[min(len(rows) - 1, math.floor(rank / wanted * len(rows)))]
        jobs.append(
            parse(
                {
                    "name": f"{row.workload}-{index}",
                    "time": str(sampled[index][0] - start),
                    "application": row.workload,
                    "num_replicas": str(row.workers),
                    "batch_size": str(row.batch_size),
                }
            )
        )
    jobs.sort(key=lambda j: (j.submit_seconds, j.name))
    return Workload(f"load-{factor:g}x-seed{seed}", jobs)
