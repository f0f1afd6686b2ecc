"""Helpers of the runtime tests: a user trial referenced as `module:Class`, and running a
gang of real gloo workers in spawned processes."""

from __future__ import annotations

import faulthandler
import random
import sys
import time
import traceback
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from api.server import free_port
from worker_agent.runtime.config import WorkerConfig
from worker_agent.runtime.control import LocalController
from worker_agent.runtime.loop import run_worker
from worker_agent.runtime.trial import Trial
from worker_agent.runtime.workloads.text import TextTransformer

# Spawned workers must finish well within this; a hung gang fails the test instead.
_GANG_TIMEOUT_SECONDS = 120


class TinyTrial(Trial):
    """A user trial: linear regression onto a fixed random map."""

    def __init__(self, context: Any) -> None:
        super().__init__(context)
        generator = torch.Generator().manual_seed(context.seed)
        self.inputs = torch.randn(256, 8, generator=generator)
        self.targets = self.inputs @ torch.randn(8, 1, generator=generator)

    def build_model(self) -> nn.Module:
        return nn.Linear(8, 1)

    def train_data(self) -> Dataset[Any]:
        return TensorDataset(self.inputs, self.targets)

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        inputs, targets = batch
        return F.mse_loss(model(inputs), targets)

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        return {"mse": F.mse_loss(model(self.inputs), self.targets).item()}


class CrashingTrial(TinyTrial):
    """A user trial whose loss raises."""

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        raise RuntimeError("the user's loss exploded")


class SlowTrial(TinyTrial):
    """A user trial whose steps take a while: a job that runs for seconds."""

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        time.sleep(0.05)
        return super().loss(model, batch)


class NulPrintingTrial(SlowTrial):
    """Prints a NUL byte at every step, then fails with one in its error."""

    steps = 0

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        NulPrintingTrial.steps += 1
        sys.stdout.write(f"step {NulPrintingTrial.steps}: \x00 in a log line\n")
        sys.stdout.flush()
        if NulPrintingTrial.steps == 150:
            raise RuntimeError("a NUL \x00 in the error")
        return super().loss(model, batch)


class InfEvaluatingTrial(SlowTrial):
    """Its evaluation (every 100 iterations and at the end) returns inf and NaN."""

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        return {"mse": float("inf"), "accuracy": float("nan"), "steps": 1.0}


class NotATrial:
    """Importable, but not a Trial."""


def worker_configs(world_size: int, **fields: Any) -> list[WorkerConfig]:
    """One config per rank of a gang on a fresh localhost port, one torch thread each."""
    port = free_port()
    return [
        WorkerConfig(
            job_id=1,
            rank=rank,
            world_size=world_size,
            master_port=port,
            torch_threads=1,
            **fields,
        )
        for rank in range(world_size)
    ]


def run_gang(
    configs: list[WorkerConfig],
    controllers: list[LocalController] | None = None,
    *,
    reverse_spawn_order: bool = False,
) -> list[LocalController]:
    """Run one spawned process per config; return each rank's controller after the run.

    `reverse_spawn_order` starts the processes in the opposite rank order and scrambles
    each process's random state first: another placement of the same ranks.
    """
    controllers = controllers or [LocalController() for _ in configs]
    context = torch.multiprocessing.get_context("spawn")
    results = context.Queue()
    order = list(range(len(configs)))
    if reverse_spawn_order:
        order.reverse()
    processes = [
        context.Process(
            target=_gang_member,
            args=(configs[i].model_dump_json(), controllers[i], reverse_spawn_order, results),
        )
        for i in order
    ]
    for process in processes:
        process.start()
    try:
        finished: dict[int, LocalController] = {}
        for _ in processes:
            rank, outcome = results.get(timeout=_GANG_TIMEOUT_SECONDS)
            if isinstance(outcome, str):
                raise AssertionError(f"rank {rank} failed:\n{outcome}")
            finished[rank] = outcome
    finally:
        for process in processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
    return [finished[config.rank] for config in configs]


def _gang_member(
    config_json: str, controller: LocalController, scramble_rng: bool, results: Any
) -> None:
    # A rank still running when the gang gives up says where it hangs.
    faulthandler.dump_traceback_later(_GANG_TIMEOUT_SECONDS - 5, exit=False)
    config = WorkerConfig.model_validate_json(config_json)
    if scramble_rng:
        # Whatever state a process starts with must not leak into the trajectory.
        seed = random.SystemRandom().randrange(2**31)
        random.seed(seed)
        torch.manual_seed(seed)
    try:
        run_worker(config, controller)
    except BaseException:
        results.put((config.rank, traceback.format_exc()))
        raise
    results.put((config.rank, controller))


class DeepTextTransformer(TextTransformer):
    """The text transformer with four blocks: room for four pipeline stages."""

    n_layers = 4


class HungryTrial(SlowTrial):
    """Keeps 64 MiB more of resident memory at every step: a job that outgrows its cap."""

    def __init__(self, context: Any) -> None:
        super().__init__(context)
        self.hoard: list[torch.Tensor] = []

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        self.hoard.append(torch.ones(16 << 20))  # written, so resident
        return super().loss(model, batch)
