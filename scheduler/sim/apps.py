"""Measured application profiles of the Pollux artifact, turned into job speed.

Each application directory holds `placements.csv` (step and sync time by placement and
per-GPU batch), `scalability.csv` (larger placements) and `validation-<batch>.csv`
(one row per epoch with the iterations done so far). A job's step time comes from its
placement (GPUs per node) and per-GPU batch; its length is the iterations of its last
epoch at its global batch, interpolated between measured batch sizes on log-log axes.
A per-GPU batch above the largest measured one runs as gradient accumulation, as in
the Pollux simulator: the extra micro-batches cost compute, not synchronisation.

For jobs that adapt their batch size (`scheduler.sim.adaptive`), the validation files
also give statistical progress (`progress`: iterations at the smallest validated batch,
scaled by efficiency), the progress that finishes a job (the least over batch sizes at
its last epoch, as the Pollux artifact takes it) and the gradient noise of each epoch
(`grad_sqr`, `grad_var`), linear between validated batch sizes as the artifact does.
"""

from __future__ import annotations

import bisect
import csv
import math
from collections import defaultdict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from functools import cache, cached_property
from pathlib import Path
from typing import TypeVar

from scheduler.core.goodput import GradParams, PerfParams, fit_throughput, profile_samples

Key = TypeVar("Key", bound=Hashable)

# Epochs to finish a job, and the largest per-GPU batch, per the Pollux artifact.
EPOCHS = {"bert": 2, "cifar10": 100, "ncf": 10, "imagenet": 90, "deepspeech2": 80, "yolov3": 50}
MAX_LOCAL_BATCH = {"yolov3": 8}


class ProfileError(ValueError):
    """An application profile is missing or unreadable."""


@dataclass(frozen=True)
class _Curve:
    """Step and sync time against per-GPU batch, for one placement."""

    batches: tuple[float, ...]
    steps: tuple[float, ...]
    syncs: tuple[float, ...]

    def at(self, batch: float) -> tuple[float, float]:
        return _interp(self.batches, self.steps, batch), _interp(self.batches, self.syncs, batch)


def _interp(xs: tuple[float, ...], ys: tuple[float, ...], x: float) -> float:
    """Piecewise-linear through the points, clamped at the ends."""
    if len(xs) == 1 or x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    i = bisect.bisect_right(xs, x)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def _curves(rows: Sequence[tuple[Key, float, float, float]]) -> dict[Key, _Curve]:
    points: dict[Key, list[tuple[float, float, float]]] = defaultdict(list)
    for key, batch, step, sync in rows:
        points[key].append((batch, step, sync))
    curves = {}
    for key, values in points.items():
        merged: dict[float, list[tuple[float, float]]] = defaultdict(list)
        for batch, step, sync in values:
            merged[batch].append((step, sync))
        batches = sorted(merged)
        curves[key] = _Curve(
            tuple(batches),
            tuple(sum(s for s, _ in merged[b]) / len(merged[b]) for b in batches),
            tuple(sum(s for _, s in merged[b]) / len(merged[b]) for b in batches),
        )
    return curves


@dataclass(frozen=True)
class _Epoch:
    """One epoch of a validation run: statistical progress at its end, gradient noise."""

    progress: float
    grad_sqr: float
    grad_var: float


def _canonical(placement: tuple[int, ...]) -> str:
    """The Pollux key of a placement: its smallest rotation, as digits."""
    rotations = [placement[i:] + placement[:i] for i in range(len(placement))]
    return "".join(map(str, min(rotations)))


class Application:
    """One application's measured speed and length."""

    def __init__(self, directory: Path) -> None:
        self.name = directory.name
        if self.name not in EPOCHS:
            raise ProfileError(f"unknown application {self.name!r} (known: {sorted(EPOCHS)})")
        try:
            placements = list(csv.DictReader((directory / "placements.csv").open()))
            scalability = list(csv.DictReader((directory / "scalability.csv").open()))
        except OSError as exc:
            raise ProfileError(f"{directory}: {exc}") from exc
        self._exact = _curves(
            [
                (
                    r["placement"],
                    float(r["local_bsz"]),
                    float(r["step_time"]),
                    float(r["sync_time"]),
                )
                for r in placements
            ]
        )
        self._nearest_known: dict[tuple[int, int], _Curve] = {}  # unmeasured sizes
        # By (nodes, GPUs): the exact placements averaged, plus the larger measurements.
        self._by_size = _curves(
            [
                (
                    (len(r["placement"]), sum(map(int, r["placement"]))),
                    float(r["local_bsz"]),
                    float(r["step_time"]),
                    float(r["sync_time"]),
                )
                for r in placements
            ]
            + [
                (
                    (int(r["num_nodes"]), int(r["num_replicas"])),
                    float(r["local_bsz"]),
                    float(r["step_time"]),
                    float(r["sync_time"]),
                )
                for r in scalability
            ]
        )
        # The most GPUs a step time is measured on: sizes past it would be extrapolated.
        self.max_replicas = max(int(r["num_replicas"]) for r in scalability)
        measured = max(float(r["local_bsz"]) for r in placements)
        self.max_local_batch = float(MAX_LOCAL_BATCH.get(self.name, measured))
        self.min_local_batch = min(float(r["local_bsz"]) for r in placements)
        try:
            self._samples = profile_samples(placements + scalability)
        except ValueError as exc:
            raise ProfileError(f"{directory}: {exc}") from exc
        self._iterations: dict[int, int] = {}
        self._epochs: dict[int, list[_Epoch]] = {}
        epochs = EPOCHS[self.name]
        for path in directory.glob("validation-*.csv"):
            batch = int(path.stem.split("-")[1])
            rows = list(csv.DictReader(path.open()))
            if len(rows) < epochs:
                raise ProfileError(f"{path}: {len(rows)} epochs measured, {epochs} needed")
            self._iterations[batch] = int(rows[epochs - 1]["iteration"])
            try:
                self._epochs[batch] = [
                    _Epoch(float(r["progress"]), float(r["grad_sqr"]), float(r["grad_var"]))
                    for r in rows[:epochs]
                ]
            except (KeyError, TypeError, ValueError) as exc:
                raise ProfileError(f"{path}: {exc}") from exc
        if not self._iterations:
            raise ProfileError(f"{directory}: no validation-<batch>.csv")
        self.validated_batches = tuple(sorted(self._iterations))
        self.base_batch = min(self._iterations)  # efficiency and progress are relative to it
        self.max_batch = max(self._iterations)
        # Statistical progress that finishes a job: the least of the batch sizes' last epochs.
        self.target_progress = min(rows[-1].progress for rows in self._epochs.values())

    def iterations(self, batch_size: int) -> int:
        """Iterations to finish at this global batch size."""
        batches = sorted(self._iterations)
        xs = tuple(math.log(b) for b in batches)
        ys = tuple(math.log(self._iterations[b]) for b in batches)
        return max(1, round(math.exp(_interp(xs, ys, math.log(batch_size)))))

    @cached_property
    def perf(self) -> PerfParams:
        """Pollux's throughput model fitted to every step time measured (what a policy
        that chooses batch sizes predicts throughput by)."""
        return fit_throughput(self._samples)

    def epoch_at(self, progress: float) -> int:
        """The epoch (from 0) a job is in after `progress` (the furthest any batch
        size's run had reached by then, as the Pollux artifact counts it)."""
        reached = max(
            bisect.bisect_right([e.progress for e in rows], progress)
            for rows in self._epochs.values()
        )
        return min(reached, EPOCHS[self.name] - 1)

    def epoch_progress(self, epoch: int) -> float:
        """Statistical progress at the end of `epoch` (the least over batch sizes)."""
        return min(rows[epoch].progress for rows in self._epochs.values())

    def grad_params(self, batch_size: float, epoch: int) -> GradParams:
        """Gradient noise during `epoch` at a global batch size, linear between the
        validated batch sizes around it (clamped to the validated range)."""
        batches = sorted(self._epochs)
        batch_size = min(max(batch_size, batches[0]), batches[-1])
        i = bisect.bisect_left(batches, batch_size)
        upper = batches[i]
        lower = batches[i - 1] if batches[i] > batch_size else upper
        low, high = self._epochs[lower][epoch], self._epochs[upper][epoch]
        share = 0.0 if upper == lower else (batch_size - lower) / (upper - lower)
        return GradParams.from_estimates(
            low.grad_sqr + share * (high.grad_sqr - low.grad_sqr),
            low.grad_var + share * (high.grad_var - low.grad_var),
        )

    def step_time(self, placement: tuple[int, ...], batch_size: int) -> tuple[float, float]:
        """Seconds per iteration and the part of it in gradient synchronisation, for
        `batch_size` over a placement of GPUs per node."""
        gpus = sum(placement)
        local = batch_size / gpus
        micro = min(local, self.max_local_batch)
        accumulate = math.ceil(local / self.max_local_batch) - 1
        curve = self._exact.get(_canonical(placement))
        if curve is None:
            curve = self._nearest((len(placement), gpus))
        step, sync = curve.at(micro)
        return step + (step - sync) * accumulate, sync

    def _nearest(self, size: tuple[int, int]) -> _Curve:
        if size in self._by_size:
            return self._by_size[size]
        if size not in self._nearest_known:  # a simulation asks for every job and epoch
            # Relative distance: 12 vs 16 GPUs is closer than 1 vs 2.
            nodes, gpus = size
            key = min(
                self._by_size,
                key=lambda k: (math.log(k[0] / nodes) ** 2 + math.log(k[1] / gpus) ** 2, k),
            )
            self._nearest_known[size] = self._by_size[key]
        return self._nearest_known[size]


@cache
def load_application(directory: Path) -> Application:
    return Application(directory)
