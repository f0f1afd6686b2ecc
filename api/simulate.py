"""`jigsaw simulate`: replay workloads through the scheduler's policies, offline."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.measure import Measurement
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from api.specfile import SpecFileError, read_spec_file
from scheduler.core.interference import Sharing
from scheduler.core.makespan import makespan_lower_bound
from scheduler.core.quota import with_quotas
from scheduler.policies import POLICIES, get_policy, policy_params
from scheduler.policies.jigsaw.params import CONFIGS
from scheduler.sim.engine import ClusterShape, SimOptions, SimResult, SimulationStuck, Simulator
from scheduler.sim.gpus import MEMORY_GIB, SimGPU
from scheduler.sim.metrics import summarize
from scheduler.sim.profiles import load_profiles
from scheduler.sim.queues import SimQueues
from scheduler.sim.trace import PhillyFilter, TraceError, Workload, load_workloads

out = Console(highlight=False)
err = Console(stderr=True, highlight=False)

EXIT_BAD_INPUT = 2

_COLUMNS = (
    ("avg_jct_s", "JCT avg", "{:,.0f}"),
    ("p50_jct_s", "p50", "{:,.0f}"),
    ("p99_jct_s", "p99", "{:,.0f}"),
    ("makespan_s", "makespan", "{:,.0f}"),
    ("gpu_utilization", "util", "{:.0%}"),
    ("cluster_efficiency", "eff", "{:.0%}"),
    ("avg_queueing_delay_s", "wait", "{:,.0f}"),
    ("avg_finish_time_fairness", "FTF", "{:.1f}"),
    ("max_finish_time_fairness", "FTF max", "{:.0f}"),
    ("suspensions", "susp", "{:,}"),
    ("reconfigurations", "reconf", "{:,}"),
)


class Arrivals(StrEnum):
    trace = "trace"
    zero = "zero"


def _bad(message: str) -> typer.Exit:
    err.print(f"[red]error:[/red] {message}")
    return typer.Exit(EXIT_BAD_INPUT)


def _when(value: str | None, flag: str) -> datetime | None:
    if value is None:
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        raise _bad(f"{flag} must be a date or time like 2017-10-01 or 2017-10-01T12:00") from None


def simulate(
    workload: Annotated[
        Path,
        typer.Option(
            help="A workload CSV (Pollux, Philly or project format) or a directory of them."
        ),
    ],
    policy: Annotated[str | None, typer.Option(help="One policy to run.")] = None,
    policies: Annotated[
        str | None, typer.Option(help="Comma-separated policies, compared side by side.")
    ] = None,
    cluster: Annotated[str, typer.Option(help="NODESxGPUS, e.g. 16x4.")] = "16x4",
    gpu: Annotated[
        SimGPU,
        typer.Option(
            help="t4: the applications as profiled; h100: imagenet, cifar10 and bert at "
            "their measured H100 step time, utilization and memory (docs/results/packing.md)."
        ),
    ] = SimGPU.T4,
    gpu_memory_gib: Annotated[
        float | None, typer.Option(help="Memory of every GPU (default: the GPU's, 16 or 80).")
    ] = None,
    arrivals: Annotated[
        Arrivals, typer.Option(help="trace: submission times of the trace; zero: all at time 0.")
    ] = Arrivals.trace,
    apps: Annotated[
        Path | None,
        typer.Option(help="Pollux application profiles (default: ../apps beside the workloads)."),
    ] = None,
    spb_profiles: Annotated[
        Path | None,
        typer.Option(
            help="Directory of measured SPB profile JSON files (default: built-in, assumed)."
        ),
    ] = None,
    round_seconds: Annotated[float, typer.Option(min=1.0, help="Lease length, simulated.")] = 60.0,
    restart_seconds: Annotated[
        float, typer.Option(min=0.0, help="Cost of every (re)start of a job.")
    ] = 30.0,
    sharing: Annotated[
        Sharing,
        typer.Option(help="How co-located jobs share a GPU: time-slicing or mps (CUDA MPS)."),
    ] = Sharing.TIME_SLICING,
    strict: Annotated[
        bool, typer.Option("--strict", help="Refuse a workload with any malformed row.")
    ] = False,
    adaptive_batch: Annotated[
        bool,
        typer.Option(
            "--adaptive-batch",
            help="Pollux jobs adapt their batch size and progress by goodput (as Pollux's).",
        ),
    ] = False,
    philly_cluster: Annotated[str | None, typer.Option(help="Philly: only this cluster.")] = None,
    philly_start: Annotated[str | None, typer.Option(help="Philly: submitted at or after.")] = None,
    philly_end: Annotated[str | None, typer.Option(help="Philly: submitted before.")] = None,
    philly_sample: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="Philly: fraction of jobs kept.")
    ] = 1.0,
    philly_limit: Annotated[int | None, typer.Option(min=1, help="Philly: first N jobs.")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the Philly sample.")] = 0,
    as_json: Annotated[
        bool, typer.Option("--json", help="One JSON object per (workload, policy).")
    ] = False,
    plots: Annotated[
        Path | None, typer.Option(help="Write JCT CDF, utilization and queue PNGs here.")
    ] = None,
    queues: Annotated[
        Path | None,
        typer.Option(
            help="YAML/JSON file of queues (quota, borrowing_limit, weight, parent, and a "
            "`jobs` regex on job names); every policy runs inside the quota layer."
        ),
    ] = None,
) -> None:
    """Replay workloads through scheduling policies on a simulated cluster."""
    names = [n.strip() for n in (policies or policy or "fifo").split(",") if n.strip()]
    if policy and policies:
        raise _bad("give --policy or --policies, not both")
    for name in names:
        if name not in POLICIES:
            raise _bad(f"unknown policy {name!r}: known policies are {', '.join(sorted(POLICIES))}")
    try:
        shape = ClusterShape.parse(cluster, gpu_memory_gib or MEMORY_GIB[gpu])
        measured = load_profiles(spb_profiles) if spb_profiles else {}
        workloads = load_workloads(
            workload,
            apps_dir=apps,
            strict=strict,
            philly=PhillyFilter(
                cluster=philly_cluster,
                start=_when(philly_start, "--philly-start"),
                end=_when(philly_end, "--philly-end"),
                sample=philly_sample,
                seed=seed,
                limit=philly_limit,
            ),
        )
        sim_queues = None if queues is None else SimQueues(read_spec_file(queues))
        if sim_queues is not None:
            workloads = [replace(w, jobs=sim_queues.assign(w.jobs)) for w in workloads]
    except (ValueError, TraceError, SpecFileError) as exc:
        raise _bad(str(exc)) from None
    options = SimOptions(
        round_seconds=round_seconds,
        restart_seconds=restart_seconds,
        gpu=gpu,
        sharing=sharing,
        zero_arrivals=arrivals is Arrivals.zero,
        spb_profiles=measured,
        adaptive_batch=adaptive_batch,
    )
    _report_skipped(workloads)
    for load in workloads:
        if not load.jobs:
            raise _bad(f"{load.name}: no job to simulate ({len(load.skipped)} row(s) skipped)")
    results: list[SimResult] = []
    rows: list[dict[str, Any]] = []
    bounds: dict[str, float] = {}
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=True,
        disable=as_json,
    ) as progress:
        for load in workloads:
            for name in names:
                task = progress.add_task(f"{load.name} / {name}", total=len(load.jobs))
                chosen = get_policy(name, policy_params(name, sharing=sharing))
                simulator = Simulator(
                    load.jobs,
                    shape,
                    chosen if sim_queues is None else with_quotas(chosen, sim_queues.quotas),
                    workload=load.name,
                    policy_name=name,
                    options=options,
                    on_progress=_advance(progress, task),
                )
                try:
                    result = simulator.run()
                except SimulationStuck as exc:
                    raise _bad(f"{load.name}: {exc}") from None
                progress.remove_task(task)
                for job_name, why in result.rejected:
                    err.print(f"[yellow]rejected[/yellow] {load.name}: job {job_name}: {why}")
                results.append(result)
                row = summarize(result)
                if options.zero_arrivals:
                    # Submitted together, a workload has a makespan no schedule beats.
                    if load.name not in bounds:
                        configs = (None, *CONFIGS)
                        bounds[load.name] = makespan_lower_bound(
                            simulator.models, shape.gpus, configs
                        )
                    row["makespan_lower_bound_s"] = bounds[load.name]
                rows.append(row)
                if as_json:
                    typer.echo(json.dumps(row))
    if not as_json:
        for table in fitted_tables(rows, out):
            out.print(table)
        for load_name, bound in bounds.items():
            out.print(
                f"{load_name}: no schedule that runs one job per GPU at a time finishes "
                f"before {bound:,.0f} s (makespan lower bound)"
            )
    if plots is not None:
        from scheduler.sim.plots import write_plots  # matplotlib only when asked

        for path in write_plots(results, plots):
            err.print(f"wrote {path}")


def _advance(progress: Progress, task: TaskID) -> Callable[[int, int], None]:
    def update(done: int, total: int) -> None:
        progress.update(task, completed=done)

    return update


def _report_skipped(workloads: list[Workload]) -> None:
    for load in workloads:
        for skipped in load.skipped[:20]:
            err.print(f"[yellow]skipped[/yellow] {load.name} line {skipped.line}: {skipped.reason}")
        if len(load.skipped) > 20:
            err.print(f"[yellow]skipped[/yellow] {load.name}: {len(load.skipped) - 20} more rows")


_TITLE = "simulation (times in seconds; FTF: JCT over run time alone)"


def fitted_tables(rows: list[dict[str, Any]], console: Console) -> list[Table]:
    """The results as one table, or split into several (each repeating workload and policy)
    where one would not fit the console's width (80 columns when piped): never squeezed."""
    groups: list[list[tuple[str, str, str]]] = [[]]
    for column in _COLUMNS:
        widened = _table(rows, [*groups[-1], column], _TITLE)
        if groups[-1] and _width(widened, console) > console.width:
            groups.append([column])
        else:
            groups[-1].append(column)
    titles = [_TITLE] + ["simulation, continued" for _ in groups[1:]]
    return [_table(rows, group, title) for group, title in zip(groups, titles, strict=True)]


def _width(table: Table, console: Console) -> int:
    """What `table` needs to show every cell whole (measured without the console's limit)."""
    return Measurement.get(console, console.options.update_width(10_000), table).maximum


def _table(rows: list[dict[str, Any]], columns: list[tuple[str, str, str]], title: str) -> Table:
    table = Table(title=title, padding=(0, 1))
    table.add_column("workload", no_wrap=True)
    table.add_column("policy", no_wrap=True)
    table.add_column("jobs", justify="right")
    for _, heading, _ in columns:
        table.add_column(heading, justify="right", no_wrap=True)
    for row in rows:
        table.add_row(
            row["workload"],
            row["policy"],
            str(row["jobs"]),
            *(fmt.format(row[key]) for key, _, fmt in columns),
        )
    return table
