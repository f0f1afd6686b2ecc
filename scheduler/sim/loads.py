"""Load variants of the Pollux workloads, drawn from the Philly trace.

The Pollux artifact evaluates at 0.5x, 1.5x and 2x the jobs of its eight workloads
(160 jobs in 8 hours of the Philly trace, 16 x 4 GPUs) on workloads it holds back.
Two samplers make such variants from `philly.csv`, `factor` x 160 jobs each:

- `hours` (the default): as the given workloads were made. Jobs are drawn from every
  day of the trace whose submission falls in the 8 hours from `START_HOUR`, each
  submitted at its time of day, so arrivals follow the trace's daily profile; a job's
  application follows its GPU-time (under 1 h cifar10 or ncf, under 10 h deepspeech2
  or bert, under 100 h yolov3, beyond imagenet), its GPUs and batch one of the
  pairs the given workloads hold for that application. The given eight match this:
  each hour's share of their arrivals is the trace's within 1.4 points (from any other
  start hour, off by 6-15), their application mix within 0.4 (`tests/test_goodput_sim.py`
  checks 1x draws against them).
- `window`: one day's 8-hour window (its start drawn with the seed), its jobs'
  submission times kept, each job taking the given row at its GPU-time quantile.
  A single day's bursts make these far harder than the given workloads (Pollux's
  policy here runs them 37-49% above its published means at 1.5x and 2x).
"""

from __future__ import annotations

import bisect
import csv
import math
import random
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from scheduler.sim.trace import TraceError, TraceJob, Workload, pollux_parser

WINDOW_SECONDS = 8 * 3600.0
JOBS = 160  # per given workload: the 1.0x load
START_HOUR = 2  # the given workloads' arrivals are the trace's hours 2-10
SAMPLERS = ("hours", "window")
_TRIES = 1000
_SHORTEST_SECONDS = 60.0  # trace rows shorter or of 1,000 GPU-hours or more are left out
_MOST_GPU_SECONDS = 1000 * 3600.0
# Applications by the trace job's GPU-time: (below, the applications drawn among).
_BY_GPU_TIME = (
    (3600.0, ("cifar10", "ncf")),
    (10 * 3600.0, ("deepspeech2", "bert")),
    (100 * 3600.0, ("yolov3",)),
    (math.inf, ("imagenet",)),
)


@dataclass(frozen=True, order=True)
class _TraceRow:
    stamp: datetime
    gpu_seconds: float
    duration: float


def _gpu_seconds(job: TraceJob) -> float:
    """GPU-seconds of the job alone on the GPUs it asks for."""
    per_node = 4
    placement = (per_node,) * (job.workers // per_node) + (
        (job.workers % per_node,) if job.workers % per_node else ()
    )
    return job.workers * job.iterations * job.speed.step_time(placement)[0]


def _read(philly: Path) -> list[_TraceRow]:
    try:
        with philly.open(newline="") as handle:
            rows = [
                (
                    datetime.fromisoformat(r["timestamp"]),
                    float(r["duration"]),
                    float(r["gpu_time"]),
                )
                for r in csv.DictReader(handle)
            ]
    except (OSError, KeyError, ValueError, csv.Error) as exc:
        raise TraceError(f"{philly}: cannot read ({exc})") from exc
    return sorted(_TraceRow(stamp, gpu, duration) for stamp, duration, gpu in rows)


def load_variant(
    philly: Path,
    given: list[Workload],
    factor: float,
    seed: int,
    apps_dir: Path,
    sampler: str = "hours",
) -> Workload:
    """`factor` x 160 jobs of 8 hours of the Philly trace, as the given workloads' jobs."""
    if factor <= 0:
        raise TraceError(f"load factor must be positive, not {factor}")
    if sampler not in SAMPLERS:
        raise TraceError(f"sampler must be one of {', '.join(SAMPLERS)}, not {sampler!r}")
    rows = [job for workload in given for job in workload.jobs]
    if not rows:
        raise TraceError("no given workload jobs to assign applications from")
    trace = _read(philly)
    wanted = round(JOBS * factor)
    rng = random.Random(seed)
    make = _by_hours if sampler == "hours" else _by_window
    jobs = [pollux_parser(apps_dir)(row) for row in make(trace, rows, wanted, rng, philly)]
    jobs.sort(key=lambda j: (j.submit_seconds, j.name))
    suffix = "" if sampler == "hours" else "-window"
    return Workload(f"load-{factor:g}x{suffix}-seed{seed}", jobs)


def _row(name: str, seconds: float, app: str, workers: int, batch: int) -> dict[str, str]:
    return {
        "name": name,
        "time": str(seconds),
        "application": app,
        "num_replicas": str(workers),
        "batch_size": str(batch),
    }


def _by_hours(
    trace: list[_TraceRow], given: list[TraceJob], wanted: int, rng: random.Random, philly: Path
) -> list[dict[str, str]]:
    """Jobs of the trace's 8 hours from `START_HOUR`, on any day, at their time of day."""
    shift = timedelta(hours=START_HOUR)
    hours = [
        row
        for row in trace
        if row.duration >= _SHORTEST_SECONDS
        and row.gpu_seconds < _MOST_GPU_SECONDS
        and (row.stamp - shift).hour < WINDOW_SECONDS / 3600
    ]
    if len(hours) < wanted:
        raise TraceError(f"{philly}: {len(hours)} jobs in its 8 hours, not {wanted}")
    pairs = {
        app: sorted({(job.workers, job.batch_size) for job in given if job.workload == app})
        for app in {job.workload for job in given}
    }
    made = []
    for index, row in enumerate(rng.sample(hours, wanted)):
        day = row.stamp - shift
        seconds = day.hour * 3600 + day.minute * 60 + day.second
        apps = next(apps for below, apps in _BY_GPU_TIME if row.gpu_seconds < below)
        app = rng.choice(apps)
        if app not in pairs:
            raise TraceError(f"no given workload runs {app}, to take its GPUs and batch from")
        workers, batch = rng.choice(pairs[app])
        made.append(_row(f"{app}-{index}", seconds, app, workers, batch))
    return made


def _by_window(
    trace: list[_TraceRow], given: list[TraceJob], wanted: int, rng: random.Random, philly: Path
) -> list[dict[str, str]]:
    """Jobs of one day's 8-hour window, each the given row at its GPU-time quantile."""
    by_time = [(row.stamp.timestamp(), row.gpu_seconds) for row in trace]
    by_time.sort()
    times = [t for t, _ in by_time]
    for _ in range(_TRIES):
        start = rng.choice(times)
        window = by_time[
            bisect.bisect_left(times, start) : bisect.bisect_left(times, start + WINDOW_SECONDS)
        ]
        if len(window) >= wanted:
            break
    else:
        raise TraceError(f"{philly}: no 8-hour window with {wanted} jobs")
    sampled = sorted(rng.sample(window, wanted))
    rows = sorted(given, key=_gpu_seconds)
    made = []
    for rank, index in enumerate(sorted(range(wanted), key=lambda i: sampled[i][1])):
        row = rows[min(len(rows) - 1, math.floor(rank / wanted * len(rows)))]
        made.append(
            _row(
                f"{row.workload}-{index}",
                sampled[index][0] - start,
                row.workload,
                row.workers,
                row.batch_size,
            )
        )
    return made
