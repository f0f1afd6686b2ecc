"""How long one scheduling round of a policy takes, JigSaw against Tiresias.

A realistic snapshot comes from the simulator: the jobs of Pollux workload-6 (resampled
to the wanted count) are all submitted at time 0 on the wanted cluster, and the
snapshot of the second round is kept (jobs running, SPB configured, guests packed,
the rest waiting). Each policy then plans that same snapshot `--repeat` times: the
first call is cold (nothing derived yet), the rest warm (what a policy memoizes per
job, as it does round after round). JigSaw is timed twice: as the snapshot is, and
told that the last job was submitted two hours ago, when it also computes the
backlog's least makespan and paces the jobs that would set it (its costliest round).
The `adaptive` cases run the jobs with adaptive batches (`SimOptions.adaptive_batch`)
and few enough of them that JigSaw sizes them by the fluid sum (light load): `fluid`
says how, by its exact program over every job's sizes and the GPUs or, past
`fluid_max_cells` jobs x GPUs, its Lagrangian relaxation. Targets: JigSaw <= 20 ms at
64 GPUs, <= 1 s at 8,192 GPUs.

    python -m benchmarks.policy_round [--repeat 5] [--json | --markdown]
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

from benchmarks.harness import add_output_options, emit
from scheduler.core.plan import Plan
from scheduler.core.snapshot import ClusterSnapshot
from scheduler.policies import Policy, get_policy, jigsaw
from scheduler.policies.jigsaw import fluid
from scheduler.policies.placement import candidates
from scheduler.sim.engine import ClusterShape, SimOptions, Simulator
from scheduler.sim.trace import TraceJob, load_workload

WORKLOAD = Path(__file__).resolve().parents[2] / "shared/traces/pollux/workloads/workload-6.csv"


@dataclass(frozen=True)
class Case:
    cluster: str
    jobs: int
    target_ms: float
    adaptive: bool = False


CASES = (
    Case("16x4", 160, 20.0),
    Case("2048x4", 10_000, 1000.0),
    Case("16x4", 20, 20.0, adaptive=True),
    Case("2048x4", 1000, 1000.0, adaptive=True),
    Case("2048x4", 3000, 1000.0, adaptive=True),
)


class _Captured(Exception):
    def __init__(self, snapshot: ClusterSnapshot) -> None:
        self.snapshot = snapshot


def snapshot_at_round(
    jobs: list[TraceJob], cluster: str, rounds: int, adaptive: bool = False
) -> ClusterSnapshot:
    """The snapshot JigSaw sees at round `rounds` of a simulated run."""
    seen = 0
    jigsaw = get_policy("jigsaw")

    def recorder(snapshot: ClusterSnapshot) -> Plan:
        nonlocal seen
        seen += 1
        if seen == rounds:
            raise _Captured(snapshot)
        return jigsaw(snapshot)

    simulator = Simulator(
        jobs,
        ClusterShape.parse(cluster),
        recorder,
        options=SimOptions(zero_arrivals=True, adaptive_batch=adaptive),
    )
    try:
        simulator.run()
    except _Captured as captured:
        return captured.snapshot
    raise RuntimeError(f"the run ended before round {rounds}")


def time_policy(policy: Policy, snapshot: ClusterSnapshot, repeat: int) -> tuple[float, float]:
    """Milliseconds of the first call and the median of the others."""
    # The garbage of the simulations that made the snapshots is not the round's to
    # collect: left, a collection of it during the cold call doubled that call's time.
    gc.collect()
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        policy(snapshot)
        times.append((time.perf_counter() - started) * 1000)
    return times[0], statistics.median(times[1:] or times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    add_output_options(parser)
    args = parser.parse_args()
    if not WORKLOAD.exists():
        parser.error(f"{WORKLOAD} not found: the Pollux traces live in ../shared/traces")
    base = load_workload(WORKLOAD).jobs
    rows: list[dict[str, Any]] = []
    for case in CASES:
        rng = random.Random(0)
        jobs = base if case.jobs == len(base) else [rng.choice(base) for _ in range(case.jobs)]
        snapshot = snapshot_at_round(jobs, case.cluster, 2, case.adaptive)
        running = sum(1 for job in snapshot.jobs if job.holding)
        measured = {}
        for name in ("tiresias", "jigsaw", "jigsaw paced"):
            # A fresh snapshot's models have nothing memoized: each policy starts cold.
            fresh = snapshot_at_round(jobs, case.cluster, 2, case.adaptive)
            if name == "jigsaw paced":
                fresh = replace(fresh, last_submitted_at=fresh.now - timedelta(hours=2))
            measured[name] = time_policy(get_policy(name.split()[0]), fresh, args.repeat)
        gpus = ClusterShape.parse(case.cluster).gpus
        kind = ", adaptive" if case.adaptive else ""
        rows.append(
            {
                "case": f"{gpus} GPUs, {len(snapshot.jobs)} jobs{kind} ({running} running)",
                "fluid": _fluid(snapshot),
                "tiresias_ms": measured["tiresias"][1],
                "jigsaw_cold_ms": measured["jigsaw"][0],
                "jigsaw_ms": measured["jigsaw"][1],
                "jigsaw_over_tiresias": measured["jigsaw"][1] / measured["tiresias"][1],
                "jigsaw_paced_cold_ms": measured["jigsaw paced"][0],
                "jigsaw_paced_ms": measured["jigsaw paced"][1],
                "target_ms": case.target_ms,
                "met_warm": max(measured["jigsaw"][1], measured["jigsaw paced"][1])
                <= case.target_ms,
                "met_cold": max(measured["jigsaw"][0], measured["jigsaw paced"][0])
                <= case.target_ms,
            }
        )
    emit(rows, "One scheduling round (ms; jigsaw_ms and tiresias_ms warm medians)", args.output)


def _fluid(snapshot: ClusterSnapshot) -> str:
    """How JigSaw's (unpaced) round sizes the snapshot's adaptive jobs by the fluid sum:
    `exact` (the dynamic program), `relaxed` (past `fluid_max_cells` jobs x GPUs: the
    Lagrangian relaxation), or `no` (no adaptive job, or not at light load)."""
    params = jigsaw.DEFAULTS
    jobs = candidates(snapshot)
    gpus = snapshot.alive_gpu_count()
    adaptive = [job for job in jobs if fluid.adaptive(job)]
    if not adaptive or not fluid.applies(snapshot, jobs, gpus, {}, params):
        return "no"
    return "exact" if fluid.exact(len(adaptive), gpus, params) else "relaxed"


if __name__ == "__main__":
    main()
