"""JigSaw with and without packing and SPB on the eight Pollux workloads (16 x 4 GPUs,
the whole workload at time 0), on simulated T4s (the applications as profiled) and on
simulated H100s (imagenet, cifar10 and bert at their measured H100 step time,
utilization and memory; `scheduler.sim.gpus`).

Four variants in the same run, the last the baseline of the ratios: JigSaw as it ships,
without packing (`max_guests=0`), without SPB (`spb_enabled=False`), and without both.
`makespan_vs_neither` and `efficiency_vs_neither` compare each with the last on the same
workload and GPU. `median_utilization` is the median solo utilization the interference
model reads for the workload's jobs (at the size they asked for): a GPU whose job keeps
it busier than about 0.6 predicts a loss for any guest, so little is packed there.
`--sharing mps` runs both the simulator's charge and the policy's prediction with the
interference fits of GPUs shared under CUDA MPS instead of time slicing.
`--max-jobs-per-gpu N` lets a GPU run N jobs at once (default 2, a pair: the case the
interference fits were measured on; more extrapolates them).
Deterministic; under a minute on 2 cores.

    python -m benchmarks.packing_sim [--sharing time-slicing|mps] [--max-jobs-per-gpu N]
                                     [--json | --markdown]
"""

from __future__ import annotations

import argparse
import statistics
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks.harness import add_output_options, emit
from jigsaw.gpus import PAIR
from scheduler.core.interference import Sharing
from scheduler.policies import jigsaw
from scheduler.policies.jigsaw import JigsawParams
from scheduler.sim.engine import ClusterShape, SimOptions, Simulator
from scheduler.sim.gpus import MEMORY_GIB, SimGPU
from scheduler.sim.metrics import summarize
from scheduler.sim.trace import load_workloads

WORKLOADS = Path(__file__).resolve().parents[2] / "shared/traces/pollux/workloads"
VARIANTS: dict[str, JigsawParams] = {
    "jigsaw": JigsawParams(),
    "no packing": JigsawParams(max_guests=0),
    "no SPB": JigsawParams(spb_enabled=False),
    "neither": JigsawParams(max_guests=0, spb_enabled=False),
}
COLUMNS = {
    "makespan_s": "{:,.0f}",
    "makespan_vs_neither": "{:.3f}",
    "cluster_efficiency": "{:.3f}",
    "efficiency_vs_neither": "{:.3f}",
    "avg_jct_s": "{:,.0f}",
    "packings": "{}",
    "packed_gpu_seconds": "{:,.0f}",
    "spb_jobs": "{}",
    "reconfigurations": "{}",
    "median_utilization": "{:.2f}",
}


def run(
    gpu: SimGPU, sharing: Sharing = Sharing.TIME_SLICING, max_jobs_per_gpu: int = PAIR
) -> list[dict[str, Any]]:
    """Every variant on every workload on `gpu`, co-located jobs sharing it by `sharing`,
    up to `max_jobs_per_gpu` on one."""
    cluster = ClusterShape.parse("16x4", MEMORY_GIB[gpu])
    options = SimOptions(
        zero_arrivals=True, gpu=gpu, sharing=sharing, max_jobs_per_gpu=max_jobs_per_gpu
    )
    rows = []
    for workload in load_workloads(WORKLOADS):
        by_variant = {}
        utilization = 0.0
        for name, params in VARIANTS.items():
            policy = partial(jigsaw.schedule, params=params.model_copy(update={"sharing": sharing}))
            simulator = Simulator(workload.jobs, cluster, policy, options=options)
            by_variant[name] = summarize(simulator.run())
            utilization = statistics.median(
                m.utilization for m in simulator.models if m.utilization is not None
            )
        base = by_variant["neither"]
        for name, metrics in by_variant.items():
            rows.append(
                {
                    "case": f"{workload.name} {gpu} {name}",
                    "makespan_s": metrics["makespan_s"],
                    "makespan_vs_neither": metrics["makespan_s"] / base["makespan_s"],
                    "cluster_efficiency": metrics["cluster_efficiency"],
                    "efficiency_vs_neither": metrics["cluster_efficiency"]
                    / base["cluster_efficiency"],
                    "avg_jct_s": metrics["avg_jct_s"],
                    "packings": metrics["packings"],
                    "packed_gpu_seconds": metrics["packed_gpu_seconds"],
                    "spb_jobs": metrics["spb_jobs"],
                    "reconfigurations": metrics["reconfigurations"],
                    "median_utilization": utilization,
                }
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sharing",
        type=Sharing,
        choices=list(Sharing),
        default=Sharing.TIME_SLICING,
        help="how co-located jobs share a GPU (default: time-slicing)",
    )
    parser.add_argument(
        "--max-jobs-per-gpu",
        type=int,
        choices=range(1, 65),
        default=PAIR,
        metavar="N",
        help=f"jobs a GPU runs at once (default {PAIR})",
    )
    add_output_options(parser)
    args = parser.parse_args()
    if not WORKLOADS.is_dir():
        parser.error(f"{WORKLOADS} not found: the Pollux traces live in ../shared/traces")
    for gpu in SimGPU:
        title = f"JigSaw's packing and SPB ablation, 16x4 {gpu}, {args.sharing}"
        if args.max_jobs_per_gpu != PAIR:
            title += f", up to {args.max_jobs_per_gpu} jobs a GPU"
        rows = run(gpu, args.sharing, args.max_jobs_per_gpu)
        emit(rows, title, args.output, COLUMNS)


if __name__ == "__main__":
    main()
