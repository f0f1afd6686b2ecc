"""Structured partial backprop against DDP, in the same run.

Part 1, per-iteration costs: one gang of `--workers` gloo processes per workload runs
DDP (the baseline) and the SPB configurations in interleaved rounds, each rank on its
own fixed batch (the global batch over the workers). Per configuration and rank:
  * compute: forward + backward of the bare model (no exchange), one rank at a time,
    so that neither communication nor the other ranks count as compute;
  * peak memory: parameter, gradient and optimizer-state bytes plus what is in use at
    the end of forward, when saved activations peak (glibc's heap on CPU, the CUDA
    allocator on a GPU; `spb.memory.forward_peak_bytes`);
  * wire bytes per iteration (ring all-reduce 2(k-1)/k per member, broadcast 1 per
    receiver; DDP through the runtime's comm hook);
  * iteration time: whole training iterations with the exchange, on rank 0.
Ratios are to DDP: compute summed over workers, a partial worker's backward and peak
memory (the lowest-depth rank), bytes summed over workers, iteration time.

Part 2, time to target: the real runtime (`run_to_target`) trains digits-cnn to 0.96 test
accuracy and the character transformer to validation loss 1.9, from the same seed, under
full backprop and each configuration (and one with rotating roles); steps and rank 0's
training seconds, as ratios to full backprop.

One device (`--one-device`, implied by `--device cuda`): what one GPU can show without a
gang. In one process on cuda:0 (or the CPU), a full worker and the partial worker of each
configuration (`--workers` sets how many workers the configuration spreads over) run the
forward and backward of a ResNet-50-sized CNN (bottleneck blocks 3-4-6-3, 224x224 images)
and a BERT-base-sized transformer (12 layers, 768 wide, 128 tokens); `--small` takes the
CPU workloads instead. Per configuration: the partial worker's backward, its forward plus
backward summed over the configuration's workers, and its peak memory (parameters,
gradients, and the allocator's peak over the step: `torch.cuda.max_memory_allocated` on
a GPU), each as a ratio to the full worker's. No exchange: bytes and iteration time need
one device per worker.

    python -m benchmarks.spb [--workers 4] [--rounds 3] [--iterations 10] [--no-target]
                             [--plot docs/spb-tradeoff.png] [--json | --markdown]
    python -m benchmarks.spb --device cuda [--workers 4] [--rounds 3] [--small]
                             [--json | --markdown]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from benchmarks.harness import add_output_options, emit
from benchmarks.spb_device import one_device_rows
from jigsaw import spb
from jigsaw.jobspec import Hyperparameters, SPBConfig, TargetMetric
from worker_agent.runtime.gang import run_local_gang
from worker_agent.runtime.sampling import to_device
from worker_agent.runtime.spb import stages as stage_cuts
from worker_agent.runtime.spb.efficiency import run_to_target, steps_ratios
from worker_agent.runtime.spb.memory import forward_peak_bytes
from worker_agent.runtime.spb.partial import PartialBackprop
from worker_agent.runtime.timing import CommMeter, DeviceClock
from worker_agent.runtime.trial import Trial, TrialContext
from worker_agent.runtime.workloads import load_trial

CONFIGS: dict[str, SPBConfig | None] = {
    "off": None,
    "0.75/0.5": SPBConfig(full_fraction=0.75, partial_depth=0.5),
    "0.5/0.25": SPBConfig(full_fraction=0.5, partial_depth=0.25),
    "0.25/0.25": SPBConfig(full_fraction=0.25, partial_depth=0.25),
}
WORKLOADS = {"resnet-synthetic": 128, "transformer-synthetic": 64}  # global batch sizes
_CPU = torch.device("cpu")


# ------------------------------------------------------------------ part 1: one rank


def _trial(workload: str, rank: int, world_size: int, batch_size: int) -> Trial:
    context = TrialContext(
        hyperparameters=Hyperparameters(batch_size=batch_size),
        rank=rank,
        world_size=world_size,
        device=_CPU,
        seed=0,
    )
    return load_trial(workload)(context)


def _measure_rank(
    rank: int, world_size: int, workload: str, batch_size: int, rounds: int, iterations: int
) -> dict[str, dict[str, Any]]:
    trial = _trial(workload, rank, world_size, batch_size)
    loader = DataLoader(trial.train_data(), batch_size=trial.context.per_rank_batch_size)
    batches = iter(loader)
    for _ in range(rank + 1):  # each rank its own batch
        batch = to_device(next(batches), _CPU)
    samples: dict[str, dict[str, list[float]]] = {}
    for _ in range(rounds):
        for name in ["ddp", *(n for n in CONFIGS if n != "off")]:
            measured = _measure_config(trial, batch, name, rank, world_size, iterations)
            for key, value in measured.items():
                samples.setdefault(name, {}).setdefault(key, []).append(value)
    return {
        name: {key: statistics.median(values) for key, values in by_key.items()}
        for name, by_key in samples.items()
    }


def _measure_config(
    trial: Trial, batch: Any, name: str, rank: int, world_size: int, iterations: int
) -> dict[str, float]:
    torch.manual_seed(0)
    model = trial.build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    clock = DeviceClock(_CPU)
    meter = CommMeter(clock, world_size)
    partial: PartialBackprop | None = None
    if name == "ddp":
        ddp = DistributedDataParallel(model)
        ddp.register_comm_hook(meter, CommMeter.hook)
        trained: torch.nn.Module = ddp
        depth = 1.0
    else:
        partial = PartialBackprop(
            stage_cuts.build(model, trial.stages(model), None),
            model,
            rank=rank,
            world_size=world_size,
            config=CONFIGS[name],
        )
        depths = partial.begin(0)
        depth = depths[rank] / len(partial.stages)
        trained = model

    def loss() -> torch.Tensor:
        return trial.loss(trained, batch)

    def local_loss() -> torch.Tensor:
        # The bare model: DDP's forward would broadcast buffers, a collective.
        return trial.loss(model, batch)

    forwards, backwards = [], []
    # Compute alone: one rank at a time, so that no rank's compute competes with
    # another's for the cores, and no exchange; the fastest of five passes after a
    # warm-up (other work only ever adds time).
    for turn in range(world_size):
        if turn == rank:
            for _ in range(6):
                optimizer.zero_grad()
                start = time.perf_counter()
                value = local_loss()
                middle = time.perf_counter()
                value.backward()
                end = time.perf_counter()
                forwards.append(middle - start)
                backwards.append(end - middle)
        dist.barrier()
    forward_seconds, backward_seconds = min(forwards[1:]), min(backwards[1:])
    optimizer.zero_grad(set_to_none=True)
    activations = forward_peak_bytes(local_loss, _CPU)
    optimizer.step()  # creates the optimizer state, so that it is counted
    static = sum(p.numel() * p.element_size() * 2 for p in model.parameters()) + sum(
        t.numel() * t.element_size()
        for state in optimizer.state.values()
        for t in state.values()
        if isinstance(t, torch.Tensor)
    )
    # Whole iterations, exchange included.
    dist.barrier()
    wire = 0
    start = time.perf_counter()
    for _ in range(iterations):
        optimizer.zero_grad()
        meter.reset()
        loss().backward()
        wire = meter.bytes if partial is None else partial.synchronize()
        optimizer.step()
        if partial is not None:
            partial.after_step()
    dist.barrier()
    iteration_seconds = (time.perf_counter() - start) / iterations
    return {
        "depth": depth,
        "forward_s": forward_seconds,
        "backward_s": backward_seconds,
        "peak_bytes": float(static + activations),
        "wire_bytes": float(wire),
        "iteration_s": iteration_seconds,
    }


# ------------------------------------------------------------------ part 1: the table


def _iteration_rows(workers: int, rounds: int, iterations: int) -> list[dict[str, Any]]:
    rows = []
    for workload, batch_size in WORKLOADS.items():
        ranks = run_local_gang(_measure_rank, workers, workload, batch_size, rounds, iterations)
        base = _summary(ranks, "ddp")
        for name in ["ddp", *(n for n in CONFIGS if n != "off")]:
            this = _summary(ranks, name)
            rows.append(
                {
                    "workload": workload,
                    "config": "off" if name == "ddp" else name,
                    "compute_ratio": this["compute"] / base["compute"],
                    "partial_backward_ratio": this["partial_backward"] / base["partial_backward"],
                    "partial_peak_memory_ratio": this["partial_peak"] / base["partial_peak"],
                    "bytes_ratio": this["wire"] / base["wire"],
                    "iteration_time_ratio": this["iteration"] / base["iteration"],
                    "iteration_ms": this["iteration"] * 1000,
                    "partial_depth": this["partial_depth"],
                }
            )
    return rows


def _summary(ranks: list[dict[str, dict[str, float]]], name: str) -> dict[str, float]:
    per_rank = [rank[name] for rank in ranks]
    lowest = min(per_rank, key=lambda r: r["depth"])
    return {
        "compute": sum(r["forward_s"] + r["backward_s"] for r in per_rank),
        "partial_backward": lowest["backward_s"],
        "partial_peak": lowest["peak_bytes"],
        "partial_depth": lowest["depth"],
        "wire": sum(r["wire_bytes"] for r in per_rank),
        "iteration": per_rank[0]["iteration_s"],
    }


# ------------------------------------------------------------------ part 2


# Targets full backprop reaches in about 100 (digits) and 180 (characters) steps.
TARGETS: dict[str, tuple[Hyperparameters, TargetMetric, int]] = {
    "digits-cnn": (
        Hyperparameters(batch_size=64, learning_rate=0.05),
        TargetMetric(name="accuracy", value=0.96),
        600,
    ),
    "text-transformer": (
        Hyperparameters(batch_size=64, learning_rate=0.003, optimizer="adam"),
        TargetMetric(name="loss", value=1.9, mode="min"),
        800,
    ),
}


def _target_rows(workers: int) -> list[dict[str, Any]]:
    rows = []
    variants: dict[str, SPBConfig | None] = {
        **CONFIGS,
        "0.5/0.25 rotating": SPBConfig(full_fraction=0.5, partial_depth=0.25, rotation_period=10),
    }
    for workload, (hyperparameters, target, limit) in TARGETS.items():
        runs = {
            name: run_to_target(
                workload,
                config,
                workers=workers,
                hyperparameters=hyperparameters,
                target=target,
                max_iterations=limit,
                eval_every=10,
            )
            for name, config in variants.items()
        }
        ratios = steps_ratios(list(runs.values()))
        full = runs["off"]
        for name, run in runs.items():
            rows.append(
                {
                    "workload": workload,
                    "config": name,
                    "reached": run.reached,
                    "steps_to_target": run.steps,
                    "time_to_target_s": run.train_seconds,
                    "steps_ratio": ratios.get(spb.config_key(run.config), 1.0)
                    if run.reached
                    else None,
                    "time_to_target_ratio": run.train_seconds / full.train_seconds
                    if run.reached and full.reached
                    else None,
                }
            )
    return rows


def _plot(
    iteration_rows: list[dict[str, Any]], target_rows: list[dict[str, Any]], path: Path
) -> None:
    """One panel per workload: each configuration's ratios to DDP, side by side."""
    import matplotlib

    matplotlib.use("Agg")  # no display: files only
    from matplotlib import pyplot

    measures = [
        ("compute_ratio", "compute (all workers)"),
        ("partial_backward_ratio", "partial worker backward"),
        ("partial_peak_memory_ratio", "partial worker peak memory"),
        ("bytes_ratio", "bytes exchanged"),
        ("iteration_time_ratio", "iteration time"),
    ]
    workloads = list(dict.fromkeys(row["workload"] for row in iteration_rows))
    figure, axes = pyplot.subplots(
        1, len(workloads) + 1, figsize=(6 * (len(workloads) + 1), 4.5), squeeze=False
    )
    for axis, workload in zip(axes[0], workloads, strict=False):
        rows = [r for r in iteration_rows if r["workload"] == workload and r["config"] != "off"]
        width = 0.8 / len(measures)
        for index, (key, label) in enumerate(measures):
            axis.bar(
                [i + index * width for i in range(len(rows))],
                [r[key] for r in rows],
                width,
                label=label,
            )
        axis.set_xticks([i + 0.4 - width / 2 for i in range(len(rows))])
        axis.set_xticklabels([r["config"] for r in rows])
        axis.axhline(1.0, color="black", linewidth=0.8)
        axis.set_title(f"{workload}: ratio to DDP")
        axis.set_xlabel("full fraction / partial depth")
    axes[0][0].legend(fontsize=8)
    axis = axes[0][-1]
    for workload in dict.fromkeys(row["workload"] for row in target_rows):
        rows = [r for r in target_rows if r["workload"] == workload and r["steps_ratio"]]
        axis.plot(
            [r["config"] for r in rows], [r["steps_ratio"] for r in rows], "o-", label=workload
        )
    axis.axhline(1.0, color="black", linewidth=0.8)
    axis.set_title("steps to target: ratio to full backprop")
    axis.tick_params(axis="x", labelrotation=20)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per config")
    parser.add_argument("--iterations", type=int, default=10, help="timed iterations a round")
    parser.add_argument("--no-target", action="store_true", help="skip the time-to-target part")
    parser.add_argument("--plot", type=Path, help="also draw the trade-off into this PNG")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument(
        "--one-device", action="store_true", help="one process, no gang (implied by cuda)"
    )
    parser.add_argument(
        "--small", action="store_true", help="one device: the CPU workloads, not the large ones"
    )
    add_output_options(parser)
    args = parser.parse_args()
    if args.device == "cuda" or args.one_device:
        if args.device == "cuda" and not torch.cuda.is_available():
            parser.error("--device cuda: torch sees no CUDA device here")
        device = torch.device("cuda", 0) if args.device == "cuda" else _CPU
        rows = one_device_rows(CONFIGS, device, args.workers, args.rounds, args.small)
        emit(rows, f"SPB's partial worker vs a full one, on {device}", args.output)
        return
    rows = _iteration_rows(args.workers, args.rounds, args.iterations)
    emit(rows, f"SPB vs DDP per iteration, {args.workers} gloo workers on CPU", args.output)
    targets = [] if args.no_target else _target_rows(args.workers)
    if targets:
        emit(targets, "Time to target vs full backprop", args.output)
    if args.plot is not None:
        _plot(rows, targets, args.plot)


if __name__ == "__main__":
    main()
