"""What a simulation measured, as one flat dict per (workload, policy)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from scheduler.sim.engine import JobRecord, SimResult


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100), linear between the nearest ranks."""
    if not values:
        return 0.0
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarize(result: SimResult) -> dict[str, Any]:
    """The metrics of one run.

    - JCT: finish minus submission; queueing delay: first start minus submission.
    - makespan: from the first submission to the last finish.
    - gpu_utilization: GPU-seconds with at least one job on the GPU over GPUs x makespan.
    - cluster_efficiency: useful GPU-seconds over GPUs x makespan, where a job's useful
      GPU-seconds are what it needs alone at its cheapest size (full backprop; an
      adaptive job at each epoch's best batch), so no schedule that runs one job per
      GPU exceeds 1 (crediting each job its requested size, as before, reached 1.5 by
      shrinking jobs that asked for more than they use well). Meaningful with
      `--arrivals zero`; compare makespan with its lower bound too.
    - finish-time fairness: each job's JCT over its run time alone (1 = as if it had
      the GPUs it asked for to itself from submission); mean and worst.
    - spb_jobs: jobs that ran under an SPB configuration at some time; packings: guest
      placements (a job started on GPUs another job held); packed_gpu_seconds:
      GPU-seconds with more than one job on the GPU.
    """
    done = [r for r in result.jobs if r.finish is not None]
    jct = [r.finish - r.submit for r in done if r.finish is not None]
    delay = [r.first_start - r.submit for r in done if r.first_start is not None]
    ratio = [(r.finish - r.submit) / r.alone_seconds for r in done if r.finish is not None]
    start = min((r.submit for r in result.jobs), default=0.0)
    makespan = max((r.finish for r in done if r.finish is not None), default=start) - start
    capacity = result.cluster.gpus * makespan
    useful = sum(r.least_gpu_seconds for r in done)
    return {
        "policy": result.policy,
        "workload": result.workload,
        "cluster": f"{result.cluster.nodes}x{result.cluster.gpus_per_node}",
        "jobs": len(done),
        "rejected": len(result.rejected),
        "avg_jct_s": sum(jct) / len(jct) if jct else 0.0,
        "p50_jct_s": percentile(jct, 50),
        "p99_jct_s": percentile(jct, 99),
        "makespan_s": makespan,
        "gpu_utilization": result.busy_gpu_seconds / capacity if capacity else 0.0,
        "cluster_efficiency": useful / capacity if capacity else 0.0,
        "avg_queueing_delay_s": sum(delay) / len(delay) if delay else 0.0,
        "avg_finish_time_fairness": sum(ratio) / len(ratio) if ratio else 0.0,
        "max_finish_time_fairness": max(ratio, default=0.0),
        "suspensions": sum(r.suspensions for r in result.jobs),
        "reconfigurations": sum(r.reconfigurations for r in result.jobs),
        "spb_jobs": sum(1 for r in result.jobs if r.ran_spb),
        "packings": sum(r.packings for r in result.jobs),
        "packed_gpu_seconds": result.packed_gpu_seconds,
        "packed_job_rounds": sum(r.packed_rounds for r in result.jobs),
        "rounds": result.rounds,
        "conflicts": result.conflicts,
    }


def by_application(result: SimResult) -> list[dict[str, Any]]:
    """Where the average JCT goes, one row per application (the trace's workload
    column), most first: its finished jobs, `jct_share_s` (their JCTs summed over all
    finished jobs: the rows add up to the run's avg_jct_s), their mean JCT, mean run
    time alone at the size asked for, mean GPUs held while running (restarts
    included), and suspensions per job."""
    # (record, JCT, seconds from its first start) of each finished job, by application
    groups: dict[str, list[tuple[JobRecord, float, float]]] = defaultdict(list)
    for r in result.jobs:
        if r.finish is not None and r.first_start is not None:
            groups[r.trace.workload].append((r, r.finish - r.submit, r.finish - r.first_start))
    finished = sum(len(jobs) for jobs in groups.values())
    rows = []
    for application, jobs in groups.items():
        count = len(jobs)
        rows.append(
            {
                "application": application,
                "jobs": count,
                "jct_share_s": sum(jct for _, jct, _ in jobs) / finished,
                "avg_jct_s": sum(jct for _, jct, _ in jobs) / count,
                "avg_alone_s": sum(r.alone_seconds for r, _, _ in jobs) / count,
                "avg_gpus_running": sum(r.attained for r, _, _ in jobs)
                / max(sum(ran for _, _, ran in jobs), 1e-9),
                "suspensions_per_job": sum(r.suspensions for r, _, _ in jobs) / count,
            }
        )
    return sorted(rows, key=lambda row: -row["jct_share_s"])
