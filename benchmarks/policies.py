"""Every policy on Pollux workload-6 (16 x 4 GPUs, the trace's arrivals), Tiresias
against the figure the Pollux paper (OSDI 2021) published for it.

The simulator's fidelity check: Tiresias's average JCT should come within 10% of the
published 3,469.7 s (`tests/test_simulator.py` asserts it); FIFO, SRTF, Gandiva and
JigSaw run the same jobs for comparison. Deterministic; a few seconds.

    python -m benchmarks.policies [--json | --markdown]
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from benchmarks.harness import add_output_options, emit
from scheduler.policies import get_policy
from scheduler.sim.engine import ClusterShape, Simulator
from scheduler.sim.metrics import summarize
from scheduler.sim.trace import load_workload

WORKLOAD = Path(__file__).resolve().parents[2] / "shared/traces/pollux/workloads/workload-6.csv"
POLICIES = ("fifo", "srtf", "gandiva", "tiresias", "jigsaw")
PUBLISHED_TIRESIAS_JCT_S = 3469.7
COLUMNS = {
    "avg_jct_s": "{:,.0f}",
    "p50_jct_s": "{:,.0f}",
    "p99_jct_s": "{:,.0f}",
    "makespan_s": "{:,.0f}",
    "gpu_utilization": "{:.1%}",
    "avg_queueing_delay_s": "{:,.0f}",
    "avg_finish_time_fairness": "{:.2f}",
    "max_finish_time_fairness": "{:.1f}",
    "suspensions": "{}",
    "reconfigurations": "{}",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_output_options(parser)
    args = parser.parse_args()
    if not WORKLOAD.exists():
        parser.error(f"{WORKLOAD} not found: the Pollux traces live in ../shared/traces")
    jobs = load_workload(WORKLOAD).jobs
    rows: list[dict[str, Any]] = []
    for name in POLICIES:
        metrics = summarize(Simulator(jobs, ClusterShape.parse("16x4"), get_policy(name)).run())
        rows.append({"case": name, **{column: metrics[column] for column in COLUMNS}})
    published = {column: float("nan") for column in COLUMNS}
    rows.append(
        {"case": "tiresias (published)", **published, "avg_jct_s": PUBLISHED_TIRESIAS_JCT_S}
    )
    emit(rows, "Policies on Pollux workload-6, 16x4 (seconds)", args.output, COLUMNS)


if __name__ == "__main__":
    main()
