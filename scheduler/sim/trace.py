"""Workloads the simulator replays: Pollux workloads, the Philly trace, the project's CSV.

The format is told by the header. Every row becomes a `TraceJob`; a row that cannot be
read is reported with its line number and skipped, or refused with the whole file when
`strict`. Formats:

- Pollux workload: `name,time,application,num_replicas,batch_size`; speed and length
  from the measured application profiles (`scheduler.sim.apps`).
- Philly (`philly.csv`): `timestamp,duration,num_gpus,gpu_time,cluster`; a job runs
  `duration` seconds on its GPUs (one "iteration" per second), whatever the placement.
- Project CSV: `name,submit_seconds,workers,iterations,step_seconds` and optionally
  `sync_seconds`, `workload`, `priority`, `queue`.
"""

from __future__ import annotations

import csv
import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Protocol

from scheduler.sim.apps import Application, ProfileError, load_application

POLLUX_COLUMNS = {"name", "time", "application", "num_replicas", "batch_size"}
PHILLY_COLUMNS = {"timestamp", "duration", "num_gpus", "gpu_time", "cluster"}
PROJECT_COLUMNS = {"name", "submit_seconds", "workers", "iterations", "step_seconds"}


class TraceError(ValueError):
    """A workload file that cannot be replayed."""


class Speed(Protocol):
    @property
    def elastic(self) -> bool:
        """Whether step times are known on other GPU counts (a job may be resized)."""
        ...

    def step_time(self, placement: tuple[int, ...]) -> tuple[float, float]:
        """Seconds per iteration, and of them in synchronisation, on GPUs per node."""
        ...


@dataclass(frozen=True)
class FixedSpeed:
    """The same step time on every placement (traces that record only durations)."""

    step_seconds: float
    sync_seconds: float = 0.0
    elastic: bool = False

    def step_time(self, placement: tuple[int, ...]) -> tuple[float, float]:
        return self.step_seconds, self.sync_seconds


@dataclass(frozen=True)
class MeasuredSpeed:
    """Step time of a Pollux application at a global batch size, by placement."""

    application: Application
    batch_size: int
    elastic: bool = True

    @property
    def most_workers(self) -> int:
        """The most GPUs the application's step time is measured on."""
        return self.application.max_replicas

    def step_time(self, placement: tuple[int, ...]) -> tuple[float, float]:
        return self.application.step_time(placement, self.batch_size)


@dataclass(frozen=True)
class TraceJob:
    name: str
    submit_seconds: float
    workers: int
    iterations: int
    speed: Speed
    workload: str  # application (or model family) whose SPB profile applies
    priority: int = 0
    batch_size: int = 0  # global (0: unknown, the SPB profile's own per GPU)
    max_micro_batch: float = 0.0  # largest per-GPU batch that fits (beyond: accumulation)
    queue: str = "default"  # the quota layer's queue (`jigsaw simulate --queues`)

    def micro_batch_at(self, workers: int) -> float:
        """Per-GPU batch run on `workers` GPUs (0: unknown)."""
        if not self.batch_size:
            return 0.0
        return min(self.batch_size / workers, self.max_micro_batch or math.inf)


@dataclass(frozen=True)
class Skipped:
    line: int
    reason: str


@dataclass
class Workload:
    name: str
    jobs: list[TraceJob]
    skipped: list[Skipped] = field(default_factory=list)


@dataclass(frozen=True)
class PhillyFilter:
    """Which Philly jobs to replay: a cluster, a window of submission times, a sample."""

    cluster: str | None = None
    start: datetime | None = None
    end: datetime | None = None
    sample: float = 1.0  # fraction kept, drawn with `seed`
    seed: int = 0
    limit: int | None = None  # the first N (by submission) after the rest


def load_workload(
    path: Path,
    *,
    apps_dir: Path | None = None,
    philly: PhillyFilter | None = None,
    strict: bool = False,
) -> Workload:
    try:
        with path.open(newline="") as handle:
            reader = csv.DictReader(handle)
            columns = set(reader.fieldnames or ())
            rows = list(_numbered(reader))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise TraceError(f"{path}: cannot read ({exc})") from exc
    workload = Workload(path.stem, [])
    if columns >= POLLUX_COLUMNS:
        apps = apps_dir or path.parent.parent / "apps"
        parse = pollux_parser(apps)
    elif columns >= PHILLY_COLUMNS:
        parse = _philly_row
    elif columns >= PROJECT_COLUMNS:
        parse = _project_row
    else:
        raise TraceError(
            f"{path}: unknown columns {sorted(columns)}; expected a Pollux workload "
            f"({', '.join(sorted(POLLUX_COLUMNS))}), Philly ({', '.join(sorted(PHILLY_COLUMNS))})"
            f" or the project format ({', '.join(sorted(PROJECT_COLUMNS))})"
        )
    stamped: list[tuple[TraceJob, dict[str, str]]] = []
    for line, row in rows:
        try:
            stamped.append((parse(row), row))
        except (KeyError, ValueError, ProfileError) as exc:
            reason = str(exc) if not isinstance(exc, KeyError) else f"missing field {exc}"
            if strict:
                raise TraceError(f"{path}:{line}: {reason}") from exc
            workload.skipped.append(Skipped(line, reason))
    if parse is _philly_row:
        stamped = _select_philly(stamped, philly or PhillyFilter())
    workload.jobs = sorted((job for job, _ in stamped), key=lambda j: (j.submit_seconds, j.name))
    return workload


def load_workloads(path: Path, **options: object) -> list[Workload]:
    """One file, or every `*.csv` of a directory (sorted by name)."""
    if path.is_dir():
        files = sorted(path.glob("*.csv"), key=_natural)
        if not files:
            raise TraceError(f"{path}: no *.csv workloads")
        return [load_workload(f, **options) for f in files]  # type: ignore[arg-type]
    if not path.exists():
        raise TraceError(f"{path}: no such file or directory")
    return [load_workload(path, **options)]  # type: ignore[arg-type]


def _natural(path: Path) -> tuple[str, int]:
    # workload-10 after workload-9.
    stem, _, number = path.stem.rpartition("-")
    return (stem, int(number)) if number.isdigit() else (path.stem, -1)


def _numbered(reader: csv.DictReader[str]) -> Iterator[tuple[int, dict[str, str]]]:
    for row in reader:
        yield reader.line_num, row


def _positive_int(row: dict[str, str], key: str) -> int:
    value = int(row[key])
    if value < 1:
        raise ValueError(f"{key} must be at least 1, got {value}")
    return value


def _seconds(row: dict[str, str], key: str, *, positive: bool = False) -> float:
    value = float(row[key])
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise ValueError(f"{key} must be a {'positive' if positive else 'non-negative'} number")
    return value


def pollux_parser(apps_dir: Path) -> Callable[[dict[str, str]], TraceJob]:
    def parse(row: dict[str, str]) -> TraceJob:
        app = load_application(apps_dir / row["application"])
        workers = _positive_int(row, "num_replicas")
        batch = _positive_int(row, "batch_size")
        return TraceJob(
            name=row["name"],
            submit_seconds=_seconds(row, "time"),
            workers=workers,
            iterations=app.iterations(batch),
            speed=MeasuredSpeed(app, batch),
            workload=app.name,
            batch_size=batch,
            max_micro_batch=app.max_local_batch,
        )

    return parse


def _philly_row(row: dict[str, str]) -> TraceJob:
    stamp = datetime.fromisoformat(row["timestamp"])
    duration = _seconds(row, "duration", positive=True)
    return TraceJob(
        name=f"{row['cluster']}-{stamp:%Y%m%d%H%M%S}",
        submit_seconds=stamp.timestamp(),
        workers=_positive_int(row, "num_gpus"),
        iterations=max(1, math.ceil(duration)),
        speed=FixedSpeed(1.0),
        workload="generic",
    )


def _select_philly(
    stamped: list[tuple[TraceJob, dict[str, str]]], chosen: PhillyFilter
) -> list[tuple[TraceJob, dict[str, str]]]:
    rng = random.Random(chosen.seed)
    kept = []
    for job, row in sorted(stamped, key=lambda pair: pair[0].submit_seconds):
        if chosen.cluster is not None and row["cluster"] != chosen.cluster:
            continue
        stamp = datetime.fromtimestamp(job.submit_seconds)
        if (chosen.start and stamp < chosen.start) or (chosen.end and stamp >= chosen.end):
            continue
        if chosen.sample < 1.0 and rng.random() >= chosen.sample:
            continue
        kept.append((job, row))
    if chosen.limit is not None:
        kept = kept[: chosen.limit]
    if not kept:
        return []
    origin = kept[0][0].submit_seconds
    # Times from the first kept submission; names made unique by position.
    return [
        (
            TraceJob(
                name=f"{job.name}-{index}",
                submit_seconds=job.submit_seconds - origin,
                workers=job.workers,
                iterations=job.iterations,
                speed=job.speed,
                workload=job.workload,
            ),
            row,
        )
        for index, (job, row) in enumerate(kept)
    ]


def _project_row(row: dict[str, str]) -> TraceJob:
    return TraceJob(
        name=row["name"],
        submit_seconds=_seconds(row, "submit_seconds"),
        workers=_positive_int(row, "workers"),
        iterations=_positive_int(row, "iterations"),
        speed=FixedSpeed(
            _seconds(row, "step_seconds", positive=True),
            _seconds(row, "sync_seconds") if row.get("sync_seconds") else 0.0,
        ),
        workload=row.get("workload") or "generic",
        priority=int(row["priority"]) if row.get("priority") else 0,
        queue=row.get("queue") or "default",
    )
