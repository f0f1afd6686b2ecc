"""The statistical price of SPB configurations: steps and time to a target, measured.

Each configuration trains the workload from the same seed on a real local gang (the
training runtime, gloo) until its evaluation reaches the target or the iteration limit;
its price is its steps over full backprop's (`SPBProfile.steps_ratio`). Time counts
rank 0's training steps only, not process start-up or evaluations.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch

from jigsaw import spb
from jigsaw.jobspec import Hyperparameters, SPBConfig, TargetMetric
from jigsaw.spb import SPBProfile
from worker_agent.runtime.config import WorkerConfig
from worker_agent.runtime.gang import free_local_port, run_workers
from worker_agent.runtime.protocol import Outcome
from worker_agent.runtime.spb.profiler import profile_workload


@dataclass(frozen=True)
class TargetRun:
    config: SPBConfig | None
    steps: int
    train_seconds: float
    reached: bool
    metrics: dict[str, float]


def run_to_target(
    workload: str,
    config: SPBConfig | None,
    *,
    workers: int,
    hyperparameters: Hyperparameters,
    target: TargetMetric,
    max_iterations: int,
    eval_every: int,
    seed: int = 0,
    stages: int | None = None,
) -> TargetRun:
    port = free_local_port()
    configs = [
        WorkerConfig(
            job_id=0,
            workload=workload,
            hyperparameters=hyperparameters,
            rank=rank,
            world_size=workers,
            master_port=port,
            seed=seed,
            max_iterations=max_iterations,
            target_metric=target,
            eval_every=eval_every,
            torch_threads=1,
            spb_enabled=True,
            spb=spb.as_json(config),
            spb_stages=stages,
        )
        for rank in range(workers)
    ]
    rank0 = run_workers(configs)[0]
    assert rank0.status is not None
    return TargetRun(
        config=config,
        steps=rank0.status.iteration,
        train_seconds=sum(record.step_seconds for record in rank0.records),
        reached=rank0.status.outcome is Outcome.SUCCEEDED
        and target.name in rank0.status.metrics
        and target.reached_by(rank0.status.metrics[target.name]),
        metrics=rank0.status.metrics,
    )


def steps_ratios(runs: list[TargetRun]) -> dict[str, float]:
    """`SPBProfile.steps_ratio` from runs that include full backprop (config None); a
    configuration that missed the target gets no ratio (unmeasured, not cheap)."""
    full = next((run for run in runs if run.config is None and run.reached), None)
    if full is None:
        return {}
    return {
        spb.config_key(run.config): run.steps / full.steps
        for run in runs
        if run.config is not None and run.reached
    }


# The structured family the profiler prices: fewer full workers and shallower partial
# workers, from mild to aggressive.
PRICED_CONFIGS = (
    SPBConfig(full_fraction=0.75, partial_depth=0.5),
    SPBConfig(full_fraction=0.5, partial_depth=0.25),
    SPBConfig(full_fraction=0.25, partial_depth=0.25),
)


def measure_profile(
    workload: str,
    *,
    workers: int,
    hyperparameters: Hyperparameters,
    stages: int | None,
    repeats: int,
    target: TargetMetric | None,
    max_iterations: int,
    device: torch.device | None = None,
    on_phase: Callable[[str], None] | None = None,
) -> SPBProfile:
    """`profile_workload` on `device` (default CPU), and with a `target` the steps ratio of
    each configuration in `PRICED_CONFIGS` from real training runs (`run_to_target`, on CPU
    processes: steps to a target do not depend on the device). `on_phase` hears each phase
    begin, for progress."""
    announce = on_phase or (lambda _: None)
    announce("per-stage costs")
    costs = profile_workload(
        workload,
        workers=workers,
        hyperparameters=hyperparameters,
        stages=stages,
        repeats=repeats,
        device=device,
    )
    if target is None:
        return costs
    runs = []
    for config in (None, *PRICED_CONFIGS):
        shape = f"spb {spb.config_key(config)}" if config else "full backprop"
        announce(f"training to {target.name}, {shape}")
        runs.append(
            run_to_target(
                workload,
                config,
                workers=workers,
                hyperparameters=hyperparameters,
                target=target,
                max_iterations=max_iterations,
                eval_every=10,
                stages=stages,
            )
        )
    return dataclasses.replace(costs, steps_ratio=steps_ratios(runs))


def phases(target: TargetMetric | None) -> int:
    """How many phases `measure_profile` announces."""
    return 1 if target is None else 1 + 1 + len(PRICED_CONFIGS)
