"""What a structured partial backprop (SPB) configuration means, in one place.

The training runtime (which stages each rank trains), the scheduler's policies and the
simulator (what a configuration costs) all read SPB through this module, so that a
configuration means the same thing everywhere. It imports no torch.

A job has N workers and its model S ordered stages, input side first (stage 0). Worker
i backpropagates through its top `d_i` stages: stages `S - d_i .. S - 1`. Under a
configuration `{full_fraction, partial_depth}` the first `full_workers` ranks (rotated by
`rotation_period`) train every stage and the others train the top `partial_stages`.
Stage s is trained by its contributors, the workers whose depth reaches it; at least one
worker is always full, so every stage has a contributor.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from jigsaw.jobspec import SPBConfig


def resolve(setting: Any) -> SPBConfig | None:
    """The configuration a spec's or allocation's `spb` value names; None means off.

    Accepts the job spec's forms (`"off"`, `"auto"`, a config object) and the JSON
    object allocations and commands carry (`{}` = off). "auto" is for the policy to
    decide: a policy that does not choose leaves it off.
    """
    if setting is None or setting in ("off", "auto") or setting == {}:
        return None
    if isinstance(setting, SPBConfig):
        return setting
    if isinstance(setting, Mapping):
        return SPBConfig.model_validate(dict(setting))
    raise ValueError(f"not an SPB setting: {setting!r}")


def as_json(config: SPBConfig | None) -> dict[str, Any]:
    """The JSON object allocations and commands carry; `{}` is off."""
    return {} if config is None else config.model_dump(mode="json")


def _round_half_up(value: float) -> int:
    # Python's round() rounds half to even (round(2.5) == 2): counts of workers and
    # stages must not depend on that.
    return math.floor(value + 0.5)


def full_workers(config: SPBConfig | None, workers: int) -> int:
    """How many of `workers` train every stage: at least one, at most all."""
    if config is None:
        return workers
    return max(1, min(workers, _round_half_up(config.full_fraction * workers)))


def partial_stages(config: SPBConfig | None, stages: int) -> int:
    """How many top stages a partial worker trains: at least one, at most all."""
    if config is None:
        return stages
    return max(1, min(stages, _round_half_up(config.partial_depth * stages)))


def worker_depths(
    config: SPBConfig | None, workers: int, stages: int, iteration: int = 0
) -> tuple[int, ...]:
    """Depth (stages trained, from the top) of each rank at `iteration`.

    With fixed roles (rotation_period 0) ranks 0 .. full-1 are full. Otherwise the full
    block moves by one rank every `rotation_period` iterations, so that over N periods
    every rank is full equally often.
    """
    if workers < 1 or stages < 1:
        raise ValueError(f"need at least one worker and one stage, got {workers}, {stages}")
    full = full_workers(config, workers)
    partial = partial_stages(config, stages)
    period = config.rotation_period if config is not None else 0
    offset = (iteration // period) % workers if period else 0
    return tuple(stages if (rank - offset) % workers < full else partial for rank in range(workers))


def contributors(depths: tuple[int, ...], stages: int) -> tuple[frozenset[int], ...]:
    """For each stage (input side first), the ranks that compute its gradient."""
    return tuple(
        frozenset(rank for rank, depth in enumerate(depths) if depth >= stages - stage)
        for stage in range(stages)
    )


def config_key(config: SPBConfig | None) -> str:
    """A stable short name of a configuration's shape, e.g. `off`, `0.5/0.25`, or
    `0.5/0.25/r10` with roles rotating every 10 iterations (which may price
    differently)."""
    if config is None:
        return "off"
    rotation = f"/r{config.rotation_period}" if config.rotation_period else ""
    return f"{config.full_fraction:g}/{config.partial_depth:g}{rotation}"


@dataclass(frozen=True)
class StageProfile:
    """Measured costs of one stage at one per-worker batch size."""

    forward_seconds: float
    backward_input_seconds: float  # the input-gradient (dX) part of backward
    backward_weight_seconds: float  # the weight-gradient (dW) part of backward
    activation_bytes: int  # saved for backward when the stage is trained
    parameter_bytes: int


@dataclass(frozen=True)
class SPBProfile:
    """A workload's measured per-stage costs and SPB statistical efficiency.

    `steps_ratio[config_key]` is the steps to the target under that configuration
    divided by the steps at full backprop (1.0: as efficient; missing: not measured).
    """

    workload: str
    per_worker_batch: int
    stages: tuple[StageProfile, ...]
    steps_ratio: Mapping[str, float]

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SPBProfile:
        return cls(
            workload=str(data["workload"]),
            per_worker_batch=int(data["per_worker_batch"]),
            stages=tuple(StageProfile(**stage) for stage in data["stages"]),
            steps_ratio={str(k): float(v) for k, v in data.get("steps_ratio", {}).items()},
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "workload": self.workload,
            "per_worker_batch": self.per_worker_batch,
            "stages": [vars(stage) for stage in self.stages],
            "steps_ratio": dict(self.steps_ratio),
        }


@dataclass(frozen=True)
class JobCost:
    """First-order cost of one iteration of a job under a configuration (from a profile).

    Compute excludes communication. A synchronous iteration lasts as long as its slowest
    worker, so `iteration_compute_seconds` is the maximum; the partial workers' slack
    (that maximum minus their own compute) is what co-located work can use.
    """

    worker_compute_seconds: tuple[float, ...]
    worker_activation_bytes: tuple[int, ...]
    parameter_bytes: int
    bytes_exchanged: float  # summed over all workers, per iteration
    steps_ratio: float | None  # statistical price (None: not measured for this config)

    @property
    def iteration_compute_seconds(self) -> float:
        return max(self.worker_compute_seconds)


def exchange_bytes(stage_contributors: int, workers: int, parameter_bytes: int) -> float:
    """Bytes all workers send for one stage's gradient per iteration.

    Contributors all-reduce among themselves (a ring: 2(c-1)/c of the gradient each),
    then the c-th share reaches each non-contributor once. With every worker
    contributing this is a ring all-reduce over all N: 2(N-1) gradients in all.
    """
    c = stage_contributors
    return float((2 * (c - 1) + (workers - c)) * parameter_bytes)


def job_cost(
    profile: SPBProfile, config: SPBConfig | None, workers: int, iteration: int = 0
) -> JobCost:
    stages = len(profile.stages)
    depths = worker_depths(config, workers, stages, iteration)
    forward = sum(stage.forward_seconds for stage in profile.stages)
    compute = []
    activations = []
    for depth in depths:
        trained = profile.stages[stages - depth :]
        # Backward stops at the cut: the lowest trained stage's input needs no gradient,
        # so its input-gradient (dX) part is never computed.
        compute.append(
            forward
            + sum(s.backward_weight_seconds for s in trained)
            + sum(s.backward_input_seconds for s in trained[1:])
        )
        activations.append(sum(s.activation_bytes for s in trained))
    bytes_exchanged = sum(
        exchange_bytes(len(ranks), workers, stage.parameter_bytes)
        for ranks, stage in zip(contributors(depths, stages), profile.stages, strict=True)
    )
    return JobCost(
        worker_compute_seconds=tuple(compute),
        worker_activation_bytes=tuple(activations),
        parameter_bytes=sum(stage.parameter_bytes for stage in profile.stages),
        bytes_exchanged=bytes_exchanged,
        steps_ratio=1.0 if config is None else profile.steps_ratio.get(config_key(config)),
    )
