"""JigSaw against Tiresias on the eight Pollux workloads (16 x 4 GPUs), with ablations.

For every workload: average JCT with the trace's arrivals, and cluster efficiency with
the whole workload submitted at time 0 (the issue's definition), for Tiresias, JigSaw,
and JigSaw without one of its levers (shrinking crowded jobs, growing jobs into idle
GPUs, holding long jobs to widths they use well while others grow, starting jobs that
would set the makespan ahead of longer queued work, growing the jobs that will run until
the cluster drains longest first, pacing the jobs that would set the makespan once
submissions stop, SPB and packing), all in the same run. `batch_jct_change` is the
average JCT of the time-0 run against Tiresias's: what a batch's users pay for its
efficiency (pacing starts the long jobs beside the short ones, which then wait longer).
`ideal_efficiency_change` is what the
least makespan any schedule could reach (`scheduler.makespan`, a relaxation that knows
every job's length and resizes for free) would gain over Tiresias: the headroom.
Targets (median over workloads): average JCT -25% or better, efficiency +28% or better.

    python -m benchmarks.jigsaw_workloads [--spb-profiles DIR] [--json | --markdown]

`--spb-profiles`: measured SPB profiles (`jigsaw profile WORKLOAD --json`) instead of
the assumed defaults, matched as `jigsaw simulate` matches them. The tables show JigSaw
workload by workload and every variant's medians (docs/results/simulation.md); `--json`
gives every variant on every workload.
"""

from __future__ import annotations

import argparse
import math
import statistics
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks.harness import add_output_options, emit
from jigsaw.spb import SPBProfile
from scheduler.makespan import makespan_lower_bound
from scheduler.policies import Policy, jigsaw, tiresias
from scheduler.policies.jigsaw import JigsawParams
from scheduler.sim.engine import ClusterShape, SimOptions, Simulator
from scheduler.sim.metrics import summarize
from scheduler.sim.profiles import load_profiles
from scheduler.sim.trace import load_workloads

WORKLOADS = Path(__file__).resolve().parents[2] / "shared/traces/pollux/workloads"
CLUSTER = ClusterShape.parse("16x4")
VARIANTS: dict[str, Policy] = {
    "jigsaw": jigsaw.schedule,
    "jigsaw, no shrinking": partial(jigsaw.schedule, params=JigsawParams(efficiency_floors=())),
    "jigsaw, no growing": partial(jigsaw.schedule, params=JigsawParams(grow=False)),
    "jigsaw, long jobs grow freely": partial(jigsaw.schedule, params=JigsawParams(grow_floor=0.0)),
    "jigsaw, makespan setters not ahead": partial(
        jigsaw.schedule, params=JigsawParams(straggler_drain=0.0)
    ),
    "jigsaw, tail jobs grow in order": partial(
        jigsaw.schedule, params=JigsawParams(tail_share=0.0)
    ),
    "jigsaw, no pacing": partial(jigsaw.schedule, params=JigsawParams(pace_after_seconds=math.inf)),
    "jigsaw, no SPB/packing": partial(
        jigsaw.schedule, params=JigsawParams(max_guests=0, spb_enabled=False)
    ),
}

FORMATS = {
    "tiresias_avg_jct_s": "{:,.0f}",
    "avg_jct_s": "{:,.0f}",
    "tiresias_efficiency": "{:.3f}",
    "efficiency": "{:.3f}",
    "jct_change": "{:+.1%}",
    "efficiency_change": "{:+.1%}",
    "ideal_efficiency_change": "{:+.1%}",
    "batch_jct_change": "{:+.1%}",
}


def _simulator(jobs: Any, policy: Policy, zero: bool, profiles: dict[str, SPBProfile]) -> Simulator:
    options = SimOptions(zero_arrivals=zero, spb_profiles=profiles)
    return Simulator(jobs, CLUSTER, policy, options=options)


def _run(jobs: Any, policy: Policy, zero: bool, profiles: dict[str, SPBProfile]) -> dict[str, Any]:
    return summarize(_simulator(jobs, policy, zero, profiles).run())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--spb-profiles", type=Path)
    add_output_options(parser)
    args = parser.parse_args()
    if not WORKLOADS.is_dir():
        parser.error(f"{WORKLOADS} not found: the Pollux traces live in ../shared/traces")
    try:
        profiles = load_profiles(args.spb_profiles) if args.spb_profiles else {}
    except ValueError as exc:
        parser.error(str(exc))
    changes: dict[str, tuple[list[float], list[float], list[float]]] = {
        name: ([], [], []) for name in VARIANTS
    }
    ideals: list[float] = []
    rows: list[dict[str, Any]] = []
    for workload in load_workloads(WORKLOADS):
        base_jct = _run(workload.jobs, tiresias.schedule, False, profiles)["avg_jct_s"]
        base = _simulator(workload.jobs, tiresias.schedule, True, profiles)
        bound = makespan_lower_bound(base.models, CLUSTER.gpus, (None, *jigsaw.CONFIGS))
        zero = summarize(base.run())
        base_eff, base_batch_jct = zero["cluster_efficiency"], zero["avg_jct_s"]
        ideals.append(zero["makespan_s"] / bound - 1)
        for name, policy in VARIANTS.items():
            jct = _run(workload.jobs, policy, False, profiles)["avg_jct_s"]
            batch = _run(workload.jobs, policy, True, profiles)
            eff = batch["cluster_efficiency"]
            changes[name][0].append(jct / base_jct - 1)
            changes[name][1].append(eff / base_eff - 1)
            changes[name][2].append(batch["avg_jct_s"] / base_batch_jct - 1)
            rows.append(
                {
                    "case": f"{workload.name} {name}",
                    "tiresias_avg_jct_s": base_jct,
                    "avg_jct_s": jct,
                    "jct_change": jct / base_jct - 1,
                    "tiresias_efficiency": base_eff,
                    "efficiency": eff,
                    "efficiency_change": eff / base_eff - 1,
                    "ideal_efficiency_change": ideals[-1],
                    "batch_jct_change": batch["avg_jct_s"] / base_batch_jct - 1,
                }
            )
    for name, (jct_changes, eff_changes, batch_changes) in changes.items():
        nan = float("nan")
        rows.append(
            {
                "case": f"median {name}",
                "tiresias_avg_jct_s": nan,
                "avg_jct_s": nan,
                "jct_change": statistics.median(jct_changes),
                "tiresias_efficiency": nan,
                "efficiency": nan,
                "efficiency_change": statistics.median(eff_changes),
                "ideal_efficiency_change": statistics.median(ideals),
                "batch_jct_change": statistics.median(batch_changes),
            }
        )
    if args.output == "json":
        emit(rows, "", "json")
        return
    # For people: JigSaw workload by workload, then every variant's medians.
    title = "JigSaw vs Tiresias, Pollux workloads on 16x4"
    emit([row for row in rows if row["case"].endswith(" jigsaw")], title, args.output, FORMATS)
    medians = [
        {key: row[key] for key in ("case", "jct_change", "efficiency_change", "batch_jct_change")}
        for row in rows
        if row["case"].startswith("median ")
    ]
    emit(medians, "Ablations: medians over the workloads", args.output, FORMATS)


if __name__ == "__main__":
    main()
