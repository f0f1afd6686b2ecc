"""Overhead of the training runtime over a bare DDP loop, in the same processes.

Two gloo workers on localhost run the same trial (model, data, batches) two ways,
interleaved in alternating order to cancel drift:
  * bare:    DistributedDataParallel + DistributedSampler + optimizer, nothing else;
  * runtime: `run_worker` with a controller checked at every boundary, the boundary
    all-reduce, step timing hooks and batched reports.
Iterations are timed after a warm-up, from boundary `warmup` to the last boundary.
Figures are medians over repetitions; "overhead %" is the runtime's median time per
iteration over the bare loop's, minus one.

    python -m benchmarks.runtime_overhead [--workload digits-cnn] [--lease 1] [--json | --markdown]
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import math
import statistics
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from benchmarks.harness import add_output_options, emit
from jigsaw.jobspec import Hyperparameters
from worker_agent.runtime.boundary import BoundarySync
from worker_agent.runtime.config import WorkerConfig
from worker_agent.runtime.control import LocalController
from worker_agent.runtime.gang import free_local_port, run_local_gang
from worker_agent.runtime.loop import run_worker
from worker_agent.runtime.protocol import Decision
from worker_agent.runtime.timing import CommMeter, DeviceClock
from worker_agent.runtime.trial import TrialContext
from worker_agent.runtime.workloads import load_trial

WORLD_SIZE = 2
MODES = ("bare", "runtime")
AGREEMENTS = ("ddp", "comm hook", "hook + agreement riding", "hook + agreement all-reduce")
# Steps per timed chunk of part 2, and chunks per case.
_CHUNK_STEPS = 50
_CHUNKS = 30


@dataclass
class TimedController(LocalController):
    """Notes when rank 0 reaches the boundaries that open and close the timed window."""

    window: tuple[int, int] = (0, 0)
    times: dict[int, float] = field(default_factory=dict)
    # Boundaries a decision holds for (1: asked at every boundary, as the agent does).
    lease: int = 1

    def check(self, iteration: int) -> Any:
        if iteration in self.window:
            self.times[iteration] = time.perf_counter()
        decision = super().check(iteration)
        # The lease ends at the window's boundaries too, so that they are timed.
        ends = [b for b in self.window if b > iteration] + [iteration + self.lease]
        return dataclasses.replace(decision, lease_until=min(ends))


def _config(rank: int, port: int, args: argparse.Namespace) -> WorkerConfig:
    return WorkerConfig(
        job_id=0,
        workload=args.workload,
        hyperparameters={"batch_size": args.batch_size},
        rank=rank,
        world_size=WORLD_SIZE,
        master_port=port,
        max_iterations=args.warmup + args.iterations,
        # No evaluation inside the timed window: it would be the same work in both modes.
        eval_every=args.warmup + args.iterations + 1,
        torch_threads=1,
    )


def _runtime_seconds(config: WorkerConfig, args: argparse.Namespace) -> float:
    controller = TimedController(
        window=(args.warmup, args.warmup + args.iterations), lease=args.lease
    )
    run_worker(config, controller)
    if config.rank != 0:
        return math.nan  # only rank 0 consults its controller
    return controller.times[controller.window[1]] - controller.times[controller.window[0]]


def _bare_seconds(config: WorkerConfig, args: argparse.Namespace) -> float:
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{config.master_addr}:{config.master_port}",
        rank=config.rank,
        world_size=config.world_size,
        timeout=timedelta(seconds=config.collective_timeout_seconds),
    )
    try:
        # In a frame of its own, so that DDP is freed while the group is alive (as
        # `run_worker` does: freed after it, a gloo group can hang at teardown).
        return _bare_loop(config, args)
    finally:
        gc.collect()  # DDP's reference cycles too
        dist.destroy_process_group()


def _bare_loop(config: WorkerConfig, args: argparse.Namespace) -> float:
    torch.manual_seed(config.seed)
    context = TrialContext(
        config.hyperparameters, config.rank, WORLD_SIZE, torch.device("cpu"), config.seed
    )
    trial = load_trial(config.workload)(context)
    model = DistributedDataParallel(trial.build_model())
    optimizer = trial.build_optimizer(model.parameters())
    sampler: DistributedSampler[Any] = DistributedSampler(
        trial.train_data(), WORLD_SIZE, config.rank, seed=config.seed, drop_last=True
    )
    loader = DataLoader(
        trial.train_data(), context.per_rank_batch_size, sampler=sampler, drop_last=True
    )
    iteration, epoch, start = 0, 0, 0.0
    while iteration < args.warmup + args.iterations:
        sampler.set_epoch(epoch)
        for batch in loader:
            if iteration == args.warmup:
                start = time.perf_counter()
            optimizer.zero_grad()
            trial.loss(model, batch).backward()
            optimizer.step()
            iteration += 1
            if iteration == args.warmup + args.iterations:
                break
        epoch += 1
    # Both modes end their window after a collective: the runtime's boundary check.
    dist.barrier()
    return time.perf_counter() - start


def _member(rank: int, world_size: int, ports: Any, args: argparse.Namespace) -> Any:
    timings: list[tuple[str, float]] = []
    for repeat in range(args.repeats):
        # Alternate which mode goes first, so drift (thermal, caches) hits both alike.
        order = MODES if repeat % 2 == 0 else tuple(reversed(MODES))
        for mode in order:
            config = _config(rank, _rendezvous_port(rank, world_size, ports), args)
            run = _bare_seconds if mode == "bare" else _runtime_seconds
            seconds = run(config, args)
            if rank == 0:
                timings.append((mode, seconds))
    return timings if rank == 0 else None


def _rendezvous_port(rank: int, world_size: int, ports: Any) -> int:
    """A port rank 0 found free just now, for every rank: one chosen minutes ahead may
    be taken by then on a shared machine, and a rank would wait for a peer that never
    comes."""
    if rank == 0:
        port = free_local_port()
        for _ in range(world_size - 1):
            ports.put(port)
        return port
    return int(ports.get(timeout=600))


def _agreement_member(rank: int, world_size: int, args: argparse.Namespace) -> Any:
    """Part 2 on one rank: seconds per step of each case, median over chunks."""
    cpu = torch.device("cpu")
    hyperparameters = Hyperparameters(batch_size=args.batch_size)
    context = TrialContext(hyperparameters, rank, world_size, cpu, seed=0)
    trial = load_trial(args.workload)(context)
    loader = DataLoader(trial.train_data(), context.per_rank_batch_size, shuffle=True)
    batch = next(iter(loader))
    cases = []
    for case in AGREEMENTS:
        torch.manual_seed(0)
        model = DistributedDataParallel(trial.build_model())
        sync = BoundarySync(rank, world_size, cpu, {})
        if case != "ddp":
            riding = sync if case == "hook + agreement riding" else None
            model.register_comm_hook(
                CommMeter(DeviceClock(cpu), world_size, riding), CommMeter.hook
            )
        optimizer = trial.build_optimizer(model.parameters())
        cases.append((case, model, optimizer, sync))
    seconds: dict[str, list[float]] = {case: [] for case in AGREEMENTS}
    for chunk in range(_CHUNKS):
        for case, model, optimizer, sync in cases if chunk % 2 == 0 else reversed(cases):
            agreeing = case.startswith("hook + agreement")
            dist.barrier()
            start = time.perf_counter()
            for step in range(_CHUNK_STEPS):
                optimizer.zero_grad()
                if agreeing:
                    # Rank 0's controller renews the decision for one boundary.
                    decision = Decision(lease_until=step + 1) if rank == 0 else None
                    sync.offer(step, decision, target_reached=False)
                loss = trial.loss(model, batch)
                if case == "hook + agreement all-reduce":
                    sync.launch()
                loss.backward()
                optimizer.step()
                if agreeing:
                    sync.wait()
            seconds[case].append((time.perf_counter() - start) / _CHUNK_STEPS)
    return {case: statistics.median(values) for case, values in seconds.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="digits-cnn")
    parser.add_argument("--batch-size", type=int, default=64, help="global batch")
    parser.add_argument("--iterations", type=int, default=300, help="timed per repetition")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument(
        "--lease", type=int, default=1, help="boundaries a decision holds (1: ask at each)"
    )
    add_output_options(parser)
    args = parser.parse_args()

    # A queue of the spawn context the gang's processes are made with.
    ports = torch.multiprocessing.get_context("spawn").Queue()
    timings: list[tuple[str, float]] = run_local_gang(
        _member, WORLD_SIZE, ports, args, init_group=False, timeout_seconds=3600
    )[0]

    per_iteration = {
        mode: sorted(seconds / args.iterations for m, seconds in timings if m == mode)
        for mode in MODES
    }
    bare_median = statistics.median(per_iteration["bare"])
    rows = [
        {
            "case": mode,
            "workload": args.workload,
            "workers": WORLD_SIZE,
            "lease": args.lease,
            "it/s": 1 / statistics.median(values),
            "ms/it": 1000 * statistics.median(values),
            "ms/it best": 1000 * values[0],
            "overhead %": 100 * (statistics.median(values) / bare_median - 1),
        }
        for mode, values in per_iteration.items()
    ]
    emit(
        rows, f"Runtime overhead vs bare DDP ({args.repeats} interleaved repetitions)", args.output
    )

    per_step: dict[str, float] = run_local_gang(_agreement_member, WORLD_SIZE, args)[0]
    rows = [
        {
            "case": case,
            "workload": args.workload,
            "workers": WORLD_SIZE,
            "ms/it": 1000 * seconds,
            "overhead %": 100 * (seconds / per_step["ddp"] - 1),
        }
        for case, seconds in per_step.items()
    ]
    emit(
        rows,
        f"What the boundary agreement costs ({_CHUNKS} chunks of {_CHUNK_STEPS} steps)",
        args.output,
    )


if __name__ == "__main__":
    main()
