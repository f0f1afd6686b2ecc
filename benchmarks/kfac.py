"""Distributed K-FAC: naive vs pipelined+fused vs pipelined+fused+balanced, and K-FAC vs
SGD to a target accuracy, with gloo workers on this machine.

Iteration time: every worker runs the same model and batches under each variant in one
process group, variants interleaved over repetitions (drift hits all alike); an
iteration's time is the slowest worker's, its split is rank 0's K-FAC step times:
  factor compute  computing A and G in the hooks (and launching their messages)
  factor exchange blocked after backward until every factor message has arrived
  inversion       eigendecompositions this worker computes
  broadcast       blocked until the decompositions other workers own have arrived
  apply           preconditioning the gradients with the decompositions
  other           forward, backward, gradient all-reduce, SGD update
Variants: naive = every factor's message starts after backward, one per factor,
round-robin inversion; pipelined+fused = messages start from the hooks, merged by the
profiled plan; +balanced = the measured-cost placement; +balanced, ooo = the same
K-FAC under out-of-order backprop (reverse first-k's per-layer exchanges instead of
DDP's, K-FAC's factor work while they travel). Speedups are against naive, and the ooo
row's also against +balanced on DDP, in the same run. Under ooo, "other" includes the
wait for the gradient exchanges.

Training: the real runtime loop (`run_worker`) with the same workers, K-FAC and SGD
(best of its learning rates), steps and seconds until the evaluation (every
--eval-every iterations) reaches the target accuracy.

With `--device cuda` every worker has its own GPU (cuda:RANK, NCCL; `--workers` at most
the GPUs there are, so one GPU measures one worker: its factor, inversion and apply split
without the exchanges). Its kernels run synchronously (CUDA_LAUNCH_BLOCKING=1) so that
the split's host-side timers measure the GPU's work; iteration times are then upper
bounds.

    python -m benchmarks.kfac [--workers 4] [--iterations 20] [--ooo-first-k K]
                              [--device cpu|cuda] [--json | --markdown]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from api.server import free_port
from benchmarks.harness import add_output_options, emit
from jigsaw.jobspec import Hyperparameters
from worker_agent.runtime.config import WorkerConfig
from worker_agent.runtime.control import LocalController
from worker_agent.runtime.gang import run_local_gang
from worker_agent.runtime.kfac import KFACSGD, NAIVE, KFACSettings, StepTimes
from worker_agent.runtime.loop import run_worker
from worker_agent.runtime.ooo.schedules import out_of_order
from worker_agent.runtime.schedules.base import BackpropSchedule
from worker_agent.runtime.schedules.standard import StandardBackprop
from worker_agent.runtime.trial import TrialContext
from worker_agent.runtime.workloads import load_trial


@dataclass(frozen=True)
class Variant:
    settings: KFACSettings
    ooo: bool = False  # reverse first-k instead of DDP


VARIANTS = {
    "naive": Variant(NAIVE),
    "pipelined+fused": Variant(KFACSettings(placement="round-robin")),
    "pipelined+fused+balanced": Variant(KFACSettings()),
    "pipelined+fused+balanced, ooo": Variant(KFACSettings(), ooo=True),
}
# What the ooo row is also compared with: the same K-FAC on DDP.
OOO_BASELINE = "pipelined+fused+balanced"
SPLIT = ("factor_compute", "factor_exchange", "inversion", "broadcast", "apply")


def _device(args: argparse.Namespace, rank: int) -> torch.device:
    return torch.device("cuda", rank) if args.device == "cuda" else torch.device("cpu")


def _join_group(rank: int, world_size: int, args: argparse.Namespace) -> torch.device:
    """On CUDA: this rank's GPU and an NCCL group (on CPU the gang's gloo group exists)."""
    device = _device(args, rank)
    if device.type == "cuda":
        # Before the first CUDA call: every kernel completes before its launch returns.
        os.environ["CUDA_LAUNCH_BLOCKING"] = "1"
        torch.cuda.set_device(device)
        dist.init_process_group(
            "nccl", init_method=args.init_method, rank=rank, world_size=world_size
        )
    return device


def _timed_variant(
    name: str, args: argparse.Namespace, batches: list[Any], rank: int, device: torch.device
) -> tuple[float, StepTimes, str]:
    """Seconds per timed iteration (slowest worker), rank 0's split (summed) and the
    layout it ran: messages per factor step, factors decomposed by every worker."""
    torch.manual_seed(0)
    context = TrialContext(
        Hyperparameters(batch_size=args.batch_size), rank, args.workers, device, 0
    )
    trial = load_trial(args.workload)(context)
    model = trial.build_model().to(device)
    variant = VARIANTS[name]
    optimizer = KFACSGD(model, 0.01, settings=variant.settings, group=dist.new_group())
    # The runtime loop's schedules, driven as the loop drives them.
    schedule: BackpropSchedule
    if variant.ooo:
        wrapped = model
        schedule = out_of_order(model, optimizer, args.ooo_first_k)
    else:
        wrapped = DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
        schedule = StandardBackprop(optimizer)
    total = StepTimes()
    elapsed = 0.0
    for i, batch in enumerate(batches):
        optimizer.preconditioner.times = StepTimes()
        dist.barrier()
        start = time.perf_counter()
        schedule.zero_grad()
        schedule.backward(trial.loss(wrapped, batch))
        schedule.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=device)
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
        if i >= args.warmup:
            elapsed += float(seconds)
            total.add(optimizer.preconditioner.times)
    preconditioner = optimizer.preconditioner
    preconditioner.remove_hooks()
    assert preconditioner.placement is not None
    layout = (
        f"{len(preconditioner.exchange.groups)} messages, "
        f"{preconditioner.placement.owners.count(None)} local"
    )
    return elapsed / args.iterations, total, layout


def _iteration_member(
    rank: int, world_size: int, args: argparse.Namespace
) -> list[tuple[str, float, StepTimes, str]]:
    device = _join_group(rank, world_size, args)
    context = TrialContext(Hyperparameters(batch_size=args.batch_size), rank, world_size, device, 0)
    trial = load_trial(args.workload)(context)
    inputs, targets = trial.train_data()[:]
    local = context.per_rank_batch_size
    count = args.warmup + args.iterations
    batches = [
        (inputs[start : start + local].to(device), targets[start : start + local].to(device))
        for start in (
            ((i * world_size + rank) * local) % (len(inputs) - local) for i in range(count)
        )
    ]
    timings: list[tuple[str, float, StepTimes, str]] = []
    names = list(VARIANTS)
    for repeat in range(args.repeats):
        order = names[repeat % len(names) :] + names[: repeat % len(names)]
        for name in order:
            timings.append((name, *_timed_variant(name, args, batches, rank, device)))
    return timings


@dataclass
class _TargetController(LocalController):
    """Notes the time of the first boundary and of every evaluation."""

    started: float | None = None
    evaluated_at: list[float] = field(default_factory=list)

    def check(self, iteration: int) -> Any:
        if self.started is None:
            self.started = time.perf_counter()
        return super().check(iteration)

    def evaluation(self, iteration: int, metrics: dict[str, float]) -> None:
        self.evaluated_at.append(time.perf_counter())
        super().evaluation(iteration, metrics)


def _training_member(rank: int, world_size: int, configs: list[str]) -> _TargetController:
    controller = _TargetController()
    run_worker(WorkerConfig.model_validate_json(configs[rank]), controller)
    return controller


def _train(optimizer: str, learning_rate: float, args: argparse.Namespace) -> dict[str, Any]:
    port = free_port()
    configs = [
        WorkerConfig(
            job_id=0,
            workload=args.train_workload,
            hyperparameters={
                "batch_size": args.train_batch_size,
                "learning_rate": learning_rate,
                "optimizer": optimizer,
            },
            rank=rank,
            world_size=args.workers,
            master_port=port,
            max_iterations=args.max_steps,
            target_metric={"name": "accuracy", "value": args.target},
            eval_every=args.eval_every,
            torch_threads=1,
            device=str(_device(args, rank)),
        )
        for rank in range(args.workers)
    ]
    payload = [config.model_dump_json() for config in configs]
    controller: _TargetController = run_local_gang(
        _training_member, args.workers, payload, init_group=False
    )[0]
    reached = [
        (iteration, at)
        for (iteration, metrics), at in zip(
            controller.evaluations, controller.evaluated_at, strict=True
        )
        if metrics["accuracy"] >= args.target
    ]
    assert controller.started is not None
    steps, seconds = (
        (reached[0][0], reached[0][1] - controller.started) if reached else (None, None)
    )
    return {"learning_rate": learning_rate, "steps_to_target": steps, "time_to_target_s": seconds}


def _iteration_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    timings: list[tuple[str, float, StepTimes, str]] = run_local_gang(
        _iteration_member, args.workers, args, init_group=args.device == "cpu"
    )[0]
    medians = {
        name: statistics.median(s for n, s, _, _ in timings if n == name) for name in VARIANTS
    }
    rows = []
    for name in VARIANTS:
        split = StepTimes()
        layouts = set()
        for n, _, times, layout in timings:
            if n == name:
                split.add(times)
                layouts.add(layout)
        per_iteration = args.iterations * args.repeats
        parts = {f"{part}_ms": 1000 * getattr(split, part) / per_iteration for part in SPLIT}
        rows.append(
            {
                "variant": name,
                "workload": args.workload,
                "workers": args.workers,
                "layout": " / ".join(sorted(layouts)),
                "iteration_time_s": medians[name],
                "speedup_vs_naive": medians["naive"] / medians[name],
                "speedup_vs_ddp": (
                    medians[OOO_BASELINE] / medians[name] if VARIANTS[name].ooo else None
                ),
                **parts,
                "other_ms": 1000 * medians[name] - sum(parts.values()),
            }
        )
    return rows


def _training_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for optimizer, rates in (("kfac", args.kfac_lr), ("sgd", args.sgd_lr)):
        runs = [_train(optimizer, lr, args) for lr in rates]
        reached = [r for r in runs if r["steps_to_target"] is not None]
        best = min(reached, key=lambda r: r["steps_to_target"]) if reached else runs[0]
        rows.append(
            {
                "variant": f"train {optimizer}",
                "workload": args.train_workload,
                "workers": args.workers,
                "target_accuracy": args.target,
                **best,
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--workload", default="resnet-synthetic")
    parser.add_argument("--batch-size", type=int, default=64, help="global batch")
    parser.add_argument("--iterations", type=int, default=20, help="timed per repetition")
    parser.add_argument("--warmup", type=int, default=5, help="includes fusion profiling")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--ooo-first-k", type=int, default=None, help="the ooo row's k (default: all layers)"
    )
    parser.add_argument("--train-workload", default="digits-cnn")
    parser.add_argument("--train-batch-size", type=int, default=128)
    parser.add_argument("--target", type=float, default=0.95)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--max-steps", type=int, default=300)
    parser.add_argument("--kfac-lr", type=float, nargs="+", default=[0.1])
    parser.add_argument("--sgd-lr", type=float, nargs="+", default=[0.03, 0.1, 0.3])
    parser.add_argument("--skip-training", action="store_true")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    add_output_options(parser)
    args = parser.parse_args()
    if args.workers < 1 or args.iterations < 1 or args.repeats < 1 or args.warmup < 3:
        parser.error("--workers, --iterations, --repeats must be >= 1 and --warmup >= 3")
    if args.device == "cuda":
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if args.workers > gpus:
            parser.error(f"--device cuda: one GPU per worker, and there are {gpus}")
    args.init_method = f"tcp://127.0.0.1:{free_port()}"
    workers = (
        f"{args.workers} {'NCCL workers on GPUs' if args.device == 'cuda' else 'gloo workers'}"
    )
    emit(_iteration_rows(args), f"K-FAC iteration time, {workers}", args.output)
    if not args.skip_training:
        emit(_training_rows(args), f"Steps and time to {args.target} accuracy", args.output)


if __name__ == "__main__":
    main()
