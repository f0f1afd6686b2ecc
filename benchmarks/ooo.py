"""Out-of-order backprop against its baselines, side by side in one run.

  * single-device: standard backward vs the deferred-dW schedule (one process, on the
    CPU or, with `--device cuda`, on cuda:0: what one GPU can show);
  * data-parallel: DDP vs reverse first-k on `--workers` gloo processes, on a
    communication-heavy MLP (large layers, small per-rank batch);
  * pipeline: GPipe vs 1F1B vs zero-bubble on `--pipeline-stages` (4) gloo pipeline
    stages of a transformer.

Schedules alternate within each repetition (the order flips every repetition, so drift
hits all alike) and every process runs the same iterations. Figures are medians over
repetitions of time per iteration; `speedup` is the baseline's median over the
schedule's, `speedup_min` / `speedup_max` the range of the per-repetition ratios.
`bubble_fraction` is measured, not modelled: for the pipeline, one minus the time each
stage spent inside its forward / input-backward / weight-backward calls over the step's
wall time (timestamps around each call), averaged over stages; elsewhere, one minus the
training thread's CPU time over wall time (idle = waiting on communication or
descheduled), averaged over ranks. `cpu ms/it` is the CPU time of all processes
(gloo's threads included) per iteration: the work a schedule costs, whatever overlaps;
set against the machine's cores x `ms/it` it shows whether idle time could be used.

With `--device cuda` only the single-device setting runs here: the data-parallel and
pipeline settings need a GPU per process and NCCL, which this benchmark's gangs (gloo on
CPU processes) do not set up; their CUDA paths are exercised by the GPU test lane.

    python -m benchmarks.ooo [--workers 4] [--pipeline-stages 4] [--repeats 3]
                             [--device cpu|cuda] [--json | --markdown]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from benchmarks.harness import add_output_options, emit
from worker_agent.runtime.gang import run_local_gang
from worker_agent.runtime.ooo.reverse_first_k import ReverseFirstK
from worker_agent.runtime.ooo.schedules import DeferredWeightBackprop
from worker_agent.runtime.schedules.base import BackpropSchedule
from worker_agent.runtime.schedules.pipeline import PIPELINE_SCHEDULES, BusyTime, PipelineTrainer
from worker_agent.runtime.schedules.standard import StandardBackprop
from worker_agent.runtime.workloads.common import next_token_loss
from worker_agent.runtime.workloads.nets import TransformerLM, TransformerPart

VOCAB, SEQ = 512, 64
_CPU = torch.device("cpu")


class Sample(NamedTuple):
    """One repetition of one schedule."""

    seconds: float  # per iteration
    bubble: float  # idle fraction
    cpu_seconds: float  # per iteration, all threads (gloo's too) of all processes


# setting -> schedule -> one sample per repetition
Timings = dict[str, list[Sample]]


def _transformer(layers: int) -> TransformerLM:
    torch.manual_seed(0)
    return TransformerLM(VOCAB, SEQ, d_model=128, n_heads=4, n_layers=layers)


def _tokens(batch: int, device: torch.device = _CPU) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.randint(VOCAB, (batch, SEQ + 1), generator=torch.Generator().manual_seed(1))
    return tokens[:, :-1].to(device), tokens[:, 1:].to(device)


def _lm_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    inputs, targets = batch
    return next_token_loss(model(inputs), targets)


def _mlp(width: int, layers: int) -> nn.Sequential:
    torch.manual_seed(0)
    blocks: list[nn.Module] = []
    for _ in range(layers):
        blocks += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*blocks, nn.Linear(width, 10))


def _timed(iterations: int, step: Callable[[], None], finish: Callable[[], None]) -> Sample:
    """This process's sample over `iterations` steps: idle is the training thread not
    on a CPU."""
    wall, thread, cpu = time.perf_counter(), time.thread_time(), time.process_time()
    for _ in range(iterations):
        step()
    finish()
    wall, thread = time.perf_counter() - wall, time.thread_time() - thread
    cpu = time.process_time() - cpu
    return Sample(wall / iterations, max(0.0, 1 - thread / wall), cpu / iterations)


def _single_device(args: argparse.Namespace) -> Timings:
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    batch = _tokens(args.single_batch, device)
    timings: Timings = {"standard": [], "ooo": []}
    for repeat in range(args.repeats):
        order = ["standard", "ooo"] if repeat % 2 == 0 else ["ooo", "standard"]
        for name in order:
            model = _transformer(4).to(device)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
            schedule: BackpropSchedule = (
                StandardBackprop(optimizer)
                if name == "standard"
                else DeferredWeightBackprop(model, optimizer)
            )

            def step(model: nn.Module = model, schedule: BackpropSchedule = schedule) -> None:
                schedule.zero_grad()
                schedule.backward(_lm_loss(model, batch))
                schedule.step()

            def finish(schedule: BackpropSchedule = schedule) -> None:
                schedule.flush()
                if device.type == "cuda":  # the host only queued the GPU's work
                    torch.cuda.synchronize(device)

            for _ in range(args.warmup):
                step()
            finish()
            timings[name].append(_timed(args.iterations, step, finish))
    return timings


def _data_parallel(args: argparse.Namespace) -> Timings:
    rank = dist.get_rank()
    generator = torch.Generator().manual_seed(rank)
    batch = (
        torch.randn(args.dp_batch, args.dp_width, generator=generator),
        torch.randint(10, (args.dp_batch,), generator=generator),
    )
    names = ["ddp", *(f"reverse first-k (k={k or 'all'})" for k in args.first_k)]
    timings: Timings = {name: [] for name in names}
    for repeat in range(args.repeats):
        for name in names if repeat % 2 == 0 else reversed(names):
            model: nn.Module = _mlp(args.dp_width, args.dp_layers)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
            schedule: BackpropSchedule
            if name == "ddp":
                model = DistributedDataParallel(model)
                schedule = StandardBackprop(optimizer)
            else:
                k = args.first_k[names.index(name) - 1]
                schedule = ReverseFirstK(model, optimizer, k if k > 0 else None)

            def step(model: nn.Module = model, schedule: BackpropSchedule = schedule) -> None:
                schedule.zero_grad()
                inputs, targets = batch
                schedule.backward(F.cross_entropy(model(inputs), targets))
                schedule.step()

            def finish(schedule: BackpropSchedule = schedule) -> None:
                schedule.flush()
                dist.barrier()

            for _ in range(args.warmup):
                step()
            finish()
            timings[name].append(_over_ranks(_timed(args.iterations, step, finish)))
    return timings


def _pipeline(args: argparse.Namespace) -> Timings:
    inputs, targets = _tokens(args.pipeline_batch)
    timings: Timings = {name: [] for name in PIPELINE_SCHEDULES}
    for repeat in range(args.repeats):
        order = PIPELINE_SCHEDULES if repeat % 2 == 0 else tuple(reversed(PIPELINE_SCHEDULES))
        for name in order:
            part = TransformerPart(
                _transformer(args.pipeline_layers), dist.get_rank(), dist.get_world_size()
            )
            busy = BusyTime()
            trainer = PipelineTrainer(
                part,
                name,
                args.microbatches,
                next_token_loss,
                torch.optim.SGD(part.parameters(), lr=0.01),
                torch.device("cpu"),
                busy=busy,
            )
            for _ in range(args.warmup):
                trainer.train(inputs, targets)
            dist.barrier()
            busy.reset()
            start, cpu = time.perf_counter(), time.process_time()
            for _ in range(args.iterations):
                trainer.train(inputs, targets)
            dist.barrier()
            wall, cpu = time.perf_counter() - start, time.process_time() - cpu
            # Idle here is time outside the stage's compute calls, from their timestamps.
            sample = Sample(wall / args.iterations, 1 - busy.seconds / wall, cpu / args.iterations)
            timings[name].append(_over_ranks(sample))
    return timings


def _over_ranks(sample: Sample) -> Sample:
    """Time and idle fraction averaged over the ranks, CPU time summed."""
    summed = torch.tensor(sample, dtype=torch.float64)
    dist.all_reduce(summed)
    world_size = dist.get_world_size()
    return Sample(float(summed[0]) / world_size, float(summed[1]) / world_size, float(summed[2]))


def _gang(
    world_size: int, function: Callable[[argparse.Namespace], Timings], args: argparse.Namespace
) -> Timings:
    """`function(args)` on every rank of a fresh gloo group; rank 0's timings."""
    timings: Timings = run_local_gang(_on_rank, world_size, function, args)[0]
    return timings


def _on_rank(
    rank: int,
    world_size: int,
    function: Callable[[argparse.Namespace], Timings],
    args: argparse.Namespace,
) -> Timings:
    return function(args)


def _rows(setting: str, baseline: str, timings: Timings, workers: int) -> list[dict[str, Any]]:
    base = statistics.median(sample.seconds for sample in timings[baseline])
    rows = []
    for schedule, values in timings.items():
        seconds = statistics.median(sample.seconds for sample in values)
        # Within a repetition the schedules ran back to back: their ratio is the least
        # disturbed by other load on the machine, and its spread shows that load.
        paired = sorted(
            b.seconds / s.seconds for b, s in zip(timings[baseline], values, strict=True)
        )
        rows.append(
            {
                "setting": setting,
                "schedule": schedule,
                "baseline": baseline,
                "processes": workers,
                "ms/it": 1000 * seconds,
                "speedup": base / seconds,
                "speedup_min": paired[0],
                "speedup_max": paired[-1],
                "bubble_fraction": statistics.median(sample.bubble for sample in values),
                "cpu ms/it": 1000 * statistics.median(sample.cpu_seconds for sample in values),
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4, help="data-parallel processes")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=10, help="timed per repetition")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--single-batch", type=int, default=16)
    parser.add_argument("--dp-width", type=int, default=1024)
    parser.add_argument("--dp-layers", type=int, default=6)
    parser.add_argument("--dp-batch", type=int, default=8, help="per rank")
    parser.add_argument(
        "--first-k", type=int, nargs="+", default=[0, 2], help="k values; 0 means all layers"
    )
    parser.add_argument("--pipeline-stages", type=int, default=4, help="processes")
    parser.add_argument("--pipeline-layers", type=int, default=8)
    parser.add_argument("--pipeline-batch", type=int, default=64)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument(
        "--settings",
        nargs="+",
        default=["single-device", "data-parallel", "pipeline"],
        choices=["single-device", "data-parallel", "pipeline"],
    )
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    add_output_options(parser)
    args = parser.parse_args()
    if args.device == "cuda":
        if not torch.cuda.is_available():
            parser.error("--device cuda: torch sees no CUDA device here")
        if set(args.settings) != {"single-device"}:
            parser.error("--device cuda runs --settings single-device only (see the docstring)")
    if args.workers < 2 or args.repeats < 1 or args.iterations < 1:
        parser.error("need --workers >= 2, --repeats >= 1 and --iterations >= 1")
    if not 2 <= args.pipeline_stages <= args.pipeline_layers:
        parser.error("need 2 <= --pipeline-stages <= --pipeline-layers")

    rows: list[dict[str, Any]] = []
    if "single-device" in args.settings:
        torch.set_num_threads(1)
        setting = f"single-device ({'cuda:0' if args.device == 'cuda' else 'cpu'})"
        rows += _rows(setting, "standard", _single_device(args), 1)
    if "data-parallel" in args.settings:
        rows += _rows(
            "data-parallel", "ddp", _gang(args.workers, _data_parallel, args), args.workers
        )
    if "pipeline" in args.settings:
        stages = args.pipeline_stages
        rows += _rows("pipeline", "gpipe", _gang(stages, _pipeline, args), stages)
    emit(rows, "Out-of-order backprop vs baselines (medians)", args.output)


if __name__ == "__main__":
    main()
