"""PNG figures of simulation runs: JCT CDF, GPU utilization and queue length over time."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display
import matplotlib.pyplot as plt  # noqa: E402

from scheduler.sim.engine import SimResult  # noqa: E402


def write_plots(results: list[SimResult], directory: Path) -> list[Path]:
    """One set of figures per workload, every policy's line on each; returns the files."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    by_workload: dict[str, list[SimResult]] = {}
    for result in results:
        by_workload.setdefault(result.workload, []).append(result)
    for workload, runs in by_workload.items():
        written.append(_jct_cdf(workload, runs, directory))
        written.append(_over_time(workload, runs, directory, "utilization"))
        written.append(_over_time(workload, runs, directory, "queue"))
    return written


def _jct_cdf(workload: str, runs: list[SimResult], directory: Path) -> Path:
    figure, axes = plt.subplots(figsize=(6, 4))
    for run in runs:
        jct = sorted(r.finish - r.submit for r in run.jobs if r.finish is not None)
        axes.plot(jct, [(i + 1) / len(jct) for i in range(len(jct))], label=run.policy)
    axes.set_xscale("log")
    axes.set_xlabel("job completion time (s)")
    axes.set_ylabel("fraction of jobs")
    axes.set_title(f"JCT CDF, {workload}")
    axes.grid(alpha=0.3)
    axes.legend()
    return _save(figure, directory / f"{workload}-jct-cdf.png")


def _over_time(workload: str, runs: list[SimResult], directory: Path, what: str) -> Path:
    figure, axes = plt.subplots(figsize=(6, 4))
    for run in runs:
        hours = [s.time / 3600 for s in run.samples]
        if what == "utilization":
            values = [s.busy_gpus / run.cluster.gpus for s in run.samples]
        else:
            values = [float(s.queued) for s in run.samples]
        axes.step(hours, values, where="post", label=run.policy)
    axes.set_xlabel("time (h)")
    axes.set_ylabel("GPUs busy (fraction)" if what == "utilization" else "jobs waiting")
    axes.set_title(f"{'GPU utilization' if what == 'utilization' else 'Queue length'}, {workload}")
    axes.grid(alpha=0.3)
    axes.legend()
    return _save(figure, directory / f"{workload}-{what}.png")


def _save(figure: plt.Figure, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
