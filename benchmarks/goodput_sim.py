"""JigSaw with goodput (adaptive batch sizes) against the Pollux artifact's published
results and this simulator's Tiresias, on the eight Pollux workloads and load variants.

Every job of the Pollux applications adapts its batch size and progresses by goodput
(`SimOptions.adaptive_batch`, the artifact's setting for Pollux's jobs): JigSaw sizes
jobs by goodput through their step times per base step. Tiresias runs each job at the
GPUs and batch its row asks for (the artifact's "Tiresias+TunedJobs"); JigSaw with
fixed batches (today's setting) runs beside them. Pollux's figures are the artifact's
published per-workload means (16 x 4 GPUs, trace arrivals); the target is JigSaw's
mean JCT at least 10% below Pollux's, with p99 no worse than Tiresias's.

Load variants (`--loads`): 8-hour windows of `philly.csv` at 0.5x, 1.5x and 2x the
jobs (`scheduler.sim.loads`), `--seeds` windows each; Pollux published means at those
loads are for workloads it holds back, so they are a reference, not the same jobs.

    python -m benchmarks.goodput_sim [--loads] [--seeds N] [--json | --markdown]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

from benchmarks.harness import add_output_options, emit
from scheduler.policies import get_policy
from scheduler.sim.engine import ClusterShape, SimOptions, Simulator
from scheduler.sim.loads import load_variant
from scheduler.sim.metrics import summarize
from scheduler.sim.trace import TraceJob, load_workloads

TRACES = Path(__file__).resolve().parents[2] / "shared/traces/pollux"
CLUSTER = ClusterShape.parse("16x4")
# The Pollux artifact's published mean JCT (s): per workload at 1.0x, and per load.
POLLUX = {
    "workload-1": 2089,
    "workload-2": 3323,
    "workload-3": 2189,
    "workload-4": 2721,
    "workload-5": 2674,
    "workload-6": 2446,
    "workload-7": 3616,
    "workload-8": 2952,
}
POLLUX_BY_LOAD = {0.5: 1534, 1.0: 2751, 1.5: 3685, 2.0: 5289}
VARIANTS = {  # name: (policy, adaptive batch)
    "jigsaw goodput": ("jigsaw", True),
    "jigsaw fixed batch": ("jigsaw", False),
    "tiresias": ("tiresias", False),
}
METRICS = (
    "avg_jct_s",
    "p99_jct_s",
    "avg_finish_time_fairness",
    "max_finish_time_fairness",
    "cluster_efficiency",
    "gpu_utilization",
    "makespan_s",
)
FORMATS = {
    "avg_jct_s": "{:,.0f}",
    "p99_jct_s": "{:,.0f}",
    "pollux_avg_jct_s": "{:,.0f}",
    "jct_vs_pollux": "{:+.1%}",
    "p99_vs_tiresias": "{:+.1%}",
    "avg_finish_time_fairness": "{:.2f}",
    "max_finish_time_fairness": "{:.1f}",
    "cluster_efficiency": "{:.3f}",
    "gpu_utilization": "{:.3f}",
    "makespan_s": "{:,.0f}",
}


def _rows(name: str, load: float, jobs: list[TraceJob], pollux: float) -> list[dict[str, Any]]:
    """Every variant on one workload, with the ratios against Pollux and Tiresias."""
    results = {}
    for variant, (policy, adaptive) in VARIANTS.items():
        options = SimOptions(adaptive_batch=adaptive)
        results[variant] = summarize(
            Simulator(jobs, CLUSTER, get_policy(policy), options=options).run()
        )
    tiresias_p99 = results["tiresias"]["p99_jct_s"]
    return [
        {
            "workload": name,
            "load": load,
            "variant": variant,
            **{metric: metrics[metric] for metric in METRICS},
            "pollux_avg_jct_s": pollux,
            "jct_vs_pollux": metrics["avg_jct_s"] / pollux - 1,
            "p99_vs_tiresias": metrics["p99_jct_s"] / tiresias_p99 - 1,
        }
        for variant, metrics in results.items()
    ]


def _means(rows: list[dict[str, Any]], label: str) -> list[dict[str, Any]]:
    """Each variant's means over the workloads of `rows` (ratios of the means)."""
    means = []
    for variant in VARIANTS:
        mine = [row for row in rows if row["variant"] == variant]
        tiresias = [row for row in rows if row["variant"] == "tiresias"]
        mean = {metric: statistics.fmean(row[metric] for row in mine) for metric in METRICS}
        pollux = statistics.fmean(row["pollux_avg_jct_s"] for row in mine)
        tiresias_p99 = statistics.fmean(row["p99_jct_s"] for row in tiresias)
        means.append(
            {
                "workload": label,
                "load": mine[0]["load"],
                "variant": variant,
                **mean,
                "pollux_avg_jct_s": pollux,
                "jct_vs_pollux": mean["avg_jct_s"] / pollux - 1,
                "p99_vs_tiresias": mean["p99_jct_s"] / tiresias_p99 - 1,
            }
        )
    return means


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loads", action="store_true", help="also the 0.5x, 1.5x, 2x variants")
    parser.add_argument("--seeds", type=int, default=2, help="windows per load (with --loads)")
    add_output_options(parser)
    args = parser.parse_args()
    if not (TRACES / "workloads").is_dir():
        parser.error(f"{TRACES} not found: the Pollux traces live in ../shared/traces")
    if args.seeds < 1:
        parser.error("--seeds must be at least 1")
    given = load_workloads(TRACES / "workloads")
    rows: list[dict[str, Any]] = []
    for workload in given:
        rows += _rows(workload.name, 1.0, workload.jobs, POLLUX[workload.name])
    summary = _means(rows, "mean of 8")
    if args.loads:
        for load in (0.5, 1.5, 2.0):
            variant_rows: list[dict[str, Any]] = []
            for seed in range(args.seeds):
                made = load_variant(TRACES / "philly.csv", given, load, seed, TRACES / "apps")
                variant_rows += _rows(made.name, load, made.jobs, POLLUX_BY_LOAD[load])
            rows += variant_rows
            summary += _means(variant_rows, f"mean at {load:g}x")
    if args.output == "json":
        emit(rows + summary, "", "json")
        return
    emit(
        summary,
        "Means: JigSaw with goodput, Pollux published, Tiresias (16x4)",
        args.output,
        FORMATS,
    )
    emit(rows, "Per workload", args.output, FORMATS)


if __name__ == "__main__":
    main()
