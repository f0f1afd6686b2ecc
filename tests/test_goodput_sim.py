"""Jobs that adapt their batch size in the simulator, JigSaw sizing them by goodput,
the redefined efficiency, the SPB job count, and load variants of the Pollux workloads."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import goodput_sim
from jigsaw import spb
from scheduler.core.goodput import GoodputModel, efficiency
from scheduler.core.plan import Placement, Plan
from scheduler.core.snapshot import ClusterSnapshot
from scheduler.policies import get_policy, jigsaw
from scheduler.policies.jigsaw import CONFIGS
from scheduler.policies.jigsaw.params import JigsawParams
from scheduler.sim import adaptive
from scheduler.sim.apps import load_application
from scheduler.sim.engine import ClusterShape, SimOptions, Simulator
from scheduler.sim.loads import SAMPLERS, load_variant
from scheduler.sim.metrics import by_application, summarize
from scheduler.sim.trace import TraceError, TraceJob, load_workload, load_workloads
from tests.servers import JIGSAW, clean_env

POLLUX = Path(__file__).resolve().parents[2] / "shared" / "traces" / "pollux"
POLLUX_HEADER = "name,time,application,num_replicas,batch_size\n"

pytestmark = pytest.mark.skipif(not POLLUX.is_dir(), reason="the Pollux traces live in ../shared")


def _one_job(tmp_path: Path, row: str) -> list:  # type: ignore[type-arg]
    path = tmp_path / "one.csv"
    path.write_text(POLLUX_HEADER + row + "\n")
    return load_workload(path, apps_dir=POLLUX / "apps").jobs


def test_each_size_runs_the_batch_the_goodput_model_chooses() -> None:
    app = load_application(POLLUX / "apps" / "cifar10")
    epoch, measured_at = 30, 512
    model = GoodputModel(app.perf, app.grad_params(measured_at, epoch), adaptive.limits(app))
    for placement in ((1,), (4,), (4, 4), (2, 2, 2, 2)):
        choice = model.best_batch(sum(placement), len(placement))
        assert choice is not None
        base_step, _, batch = adaptive.size_step(app, epoch, measured_at, placement)
        assert batch == choice.batch
        assert app.base_batch <= batch <= app.max_batch
        # One step at that batch makes batch / B0 x E(batch) base steps of progress.
        step, _ = app.step_time(placement, batch)
        made = batch / app.base_batch * efficiency(app.grad_params(batch, epoch), 128, batch)
        assert base_step == pytest.approx(step / made)
    # More GPUs: the chooser takes a larger batch (throughput grows, efficiency falls).
    small = adaptive.size_step(app, epoch, measured_at, (1,))
    large = adaptive.size_step(app, epoch, measured_at, (4, 4, 4, 4))
    assert small is not None and large is not None and large[2] > small[2]


def test_an_adaptive_job_progresses_by_goodput_at_the_batch_of_its_size(tmp_path: Path) -> None:
    jobs = _one_job(tmp_path, "c,0,cifar10,4,512")
    chosen: list[int] = []

    def four_gpus(snapshot: ClusterSnapshot) -> Plan:
        for job in snapshot.jobs:
            if job.holding and job.model is not None:
                chosen.append(job.model.batch_at(4, 1))
        waiting = [j for j in snapshot.jobs if j.waiting]
        return Plan(start=tuple(Placement(j.id, (0, 1, 2, 3)) for j in waiting))

    options = SimOptions(adaptive_batch=True, restart_seconds=0.0)
    simulator = Simulator(jobs, ClusterShape.parse("1x4"), four_gpus, options=options)
    result = simulator.run()
    record = result.jobs[0]
    app = load_application(POLLUX / "apps" / "cifar10")
    assert record.model.iterations_total == math.ceil(app.target_progress)
    # Run alone on the GPUs it asked for from time 0, it takes its alone time (to a
    # round, as its model changes at round boundaries after each epoch).
    assert record.finish == pytest.approx(record.alone_seconds, rel=0.05)
    assert chosen and set(chosen) == {b for b in chosen if b >= app.base_batch}
    assert record.batch == record.model.batch_at(4, 1) > 0


def test_jigsaw_sizes_an_adaptive_job_where_its_goodput_finishes_it_soonest(
    tmp_path: Path,
) -> None:
    jobs = _one_job(tmp_path, "d,0,deepspeech2,4,80")
    plans: list[tuple[int, int]] = []

    def watch(snapshot: ClusterSnapshot) -> Plan:
        plan = jigsaw.schedule(snapshot)
        for placement in plan.start:
            job = next(j for j in snapshot.jobs if j.id == placement.job_id)
            assert job.model is not None
            steps = {w: job.model.step_at(w, -(-w // 4))[0] for w in job.model.sizes}
            plans.append((len(placement.gpu_ids), min(steps, key=steps.__getitem__)))
        return plan

    Simulator(jobs, ClusterShape.parse("4x4"), watch, options=SimOptions(adaptive_batch=True)).run()
    assert plans and plans[0][0] == plans[0][1]


@pytest.mark.parametrize(("node_sizes", "held"), [(False, 8), (True, 12)])
def test_node_sizes_offer_every_whole_number_of_nodes(
    tmp_path: Path, node_sizes: bool, held: int
) -> None:
    # Three nodes: powers of two reach 8 GPUs of the 12; whole nodes, all of them.
    jobs = _one_job(tmp_path, "i,0,imagenet,8,400")
    sizes: set[tuple[int, ...]] = set()

    def watch(snapshot: ClusterSnapshot) -> Plan:
        sizes.update(job.model.sizes for job in snapshot.jobs if job.model is not None)
        return jigsaw.schedule(snapshot)

    options = SimOptions(adaptive_batch=True, node_sizes=node_sizes)
    result = Simulator(jobs, ClusterShape.parse("3x4"), watch, options=options).run()
    assert {12 in each for each in sizes} == {node_sizes}
    assert result.jobs[0].attained / (result.jobs[0].finish - result.jobs[0].first_start) > held - 1


def test_jct_by_application_adds_up_to_the_average(tmp_path: Path) -> None:
    path = tmp_path / "two.csv"
    path.write_text(POLLUX_HEADER + "c1,0,cifar10,2,256\nc2,60,cifar10,4,512\nn,0,ncf,1,256\n")
    jobs = load_workload(path, apps_dir=POLLUX / "apps").jobs
    result = Simulator(jobs, ClusterShape.parse("1x4"), get_policy("tiresias")).run()
    rows = by_application(result)
    assert [(row["application"], row["jobs"]) for row in rows] == [("cifar10", 2), ("ncf", 1)]
    assert sum(row["jct_share_s"] for row in rows) == pytest.approx(summarize(result)["avg_jct_s"])
    cifar = [r.finish - r.submit for r in result.jobs if r.trace.workload == "cifar10" if r.finish]
    assert rows[0]["avg_jct_s"] == pytest.approx(sum(cifar) / 2)
    assert rows[0]["suspensions_per_job"] == 0.0
    # Tiresias runs each job on the GPUs it asked for: 2 and 4, restarts aside.
    assert 2.0 <= rows[0]["avg_gpus_running"] <= 4.0


def test_cluster_efficiency_credits_each_job_its_cheapest_size() -> None:
    # Submitted together, JigSaw shrinks jobs that asked for more than they use well:
    # credited at their requested size that read above 1; at their cheapest it cannot.
    workload = load_workload(POLLUX / "workloads" / "workload-6.csv")
    for adaptive_batch in (False, True):
        options = SimOptions(zero_arrivals=True, adaptive_batch=adaptive_batch)
        result = Simulator(
            workload.jobs[:40], ClusterShape.parse("4x4"), get_policy("jigsaw"), options=options
        ).run()
        metrics = summarize(result)
        assert 0.3 < metrics["cluster_efficiency"] <= metrics["gpu_utilization"] <= 1.0
        for record in result.jobs:
            assert record.least_gpu_seconds <= record.trace.workers * record.alone_seconds + 1e-6


def test_spb_jobs_counts_a_job_whose_configuration_was_reset_by_a_suspension(
    tmp_path: Path,
) -> None:
    # `a` runs under SPB, is suspended for `b` (its configuration reset) and then
    # finishes at full backprop.
    path = tmp_path / "jobs.csv"
    path.write_text(
        "name,submit_seconds,workers,iterations,step_seconds,sync_seconds,workload\n"
        "a,0,2,2000,1.0,0.5,bert\nb,100,2,100,1.0,0.5,bert\n"
    )
    config = spb.as_json(CONFIGS[0])
    rounds: list[int] = []

    def spb_then_suspend_then_off(snapshot: ClusterSnapshot) -> Plan:
        rounds.append(len(rounds) + 1)
        if len(rounds) == 1:
            return Plan(start=(Placement(snapshot.jobs[0].id, (0, 1), config),))
        if len(rounds) == 2:
            (b,) = (j for j in snapshot.jobs if j.waiting)
            suspend = tuple(j.id for j in snapshot.jobs if j.holding)
            return Plan(suspend=suspend, start=(Placement(b.id, (0, 1)),))
        waiting = [j for j in snapshot.jobs if j.waiting]
        if any(j.holding for j in snapshot.jobs) or not waiting:
            return Plan()
        return Plan(start=(Placement(waiting[0].id, (0, 1)),))

    workload = load_workload(path)
    result = Simulator(workload.jobs, ClusterShape.parse("1x2"), spb_then_suspend_then_off).run()
    a, b = result.jobs
    assert (a.suspensions, a.reconfigurations, a.config) == (1, 0, {})
    assert summarize(result)["spb_jobs"] == 1  # a, though nothing of it shows SPB now


def test_load_variants_sample_philly_windows_as_the_given_workloads() -> None:
    given = load_workloads(POLLUX / "workloads")
    apps = {job.workload for w in given for job in w.jobs}
    pairs = {(job.workload, job.workers, job.batch_size) for w in given for job in w.jobs}
    for sampler in SAMPLERS:
        half = load_variant(POLLUX / "philly.csv", given, 0.5, 3, POLLUX / "apps", sampler)
        again = load_variant(POLLUX / "philly.csv", given, 0.5, 3, POLLUX / "apps", sampler)
        double = load_variant(POLLUX / "philly.csv", given, 2.0, 3, POLLUX / "apps", sampler)
        assert len(half.jobs) == 80 and len(double.jobs) == 320
        assert [(j.name, j.submit_seconds) for j in half.jobs] == [
            (j.name, j.submit_seconds) for j in again.jobs
        ]
        for workload in (half, double):
            assert min(j.submit_seconds for j in workload.jobs) >= 0
            assert max(j.submit_seconds for j in workload.jobs) < 8 * 3600
            assert {j.workload for j in workload.jobs} <= apps
            assert {(j.workload, j.workers, j.batch_size) for j in workload.jobs} <= pairs
    with pytest.raises(TraceError, match="positive"):
        load_variant(POLLUX / "philly.csv", given, 0.0, 0, POLLUX / "apps")
    with pytest.raises(TraceError, match="in its 8 hours"):
        load_variant(POLLUX / "philly.csv", given, 1000.0, 0, POLLUX / "apps")
    with pytest.raises(TraceError, match="no 8-hour window"):
        load_variant(POLLUX / "philly.csv", given, 1000.0, 0, POLLUX / "apps", "window")
    with pytest.raises(TraceError, match="sampler must be one of"):
        load_variant(POLLUX / "philly.csv", given, 1.0, 0, POLLUX / "apps", "days")


def _mix(jobs: list[TraceJob]) -> tuple[list[float], list[float]]:
    """Shares of the jobs by application class and by hour of submission."""
    classes = (("cifar10", "ncf"), ("deepspeech2", "bert"), ("yolov3",), ("imagenet",))
    by_class = [sum(j.workload in names for j in jobs) / len(jobs) for names in classes]
    by_hour = [sum(h * 3600 <= j.submit_seconds < (h + 1) * 3600 for j in jobs) for h in range(8)]
    return by_class, [count / len(jobs) for count in by_hour]


def test_variants_at_1x_look_like_the_given_workloads() -> None:
    """The default sampler makes jobs as the given eight were made: 1.0x variants
    (as many jobs) share their application mix and their arrivals by hour, which one
    day's window does not (its arrivals are that day's bursts)."""
    given = load_workloads(POLLUX / "workloads")
    classes, hours = _mix([job for w in given for job in w.jobs])
    for sampler, hour_gap in (("hours", 0.03), ("window", 0.05)):
        made = [
            job
            for seed in range(8)
            for job in load_variant(
                POLLUX / "philly.csv", given, 1.0, seed, POLLUX / "apps", sampler
            ).jobs
        ]
        made_classes, made_hours = _mix(made)
        assert max(abs(a - b) for a, b in zip(classes, made_classes, strict=True)) < 0.03
        gap = max(abs(a - b) for a, b in zip(hours, made_hours, strict=True))
        assert (gap < hour_gap) == (sampler == "hours"), (sampler, gap)


def test_cli_simulates_adaptive_batches(tmp_path: Path) -> None:
    path = tmp_path / "one.csv"
    path.write_text(POLLUX_HEADER + "c,0,cifar10,2,256\n")
    fixed, adaptive_run = (
        subprocess.run(
            [
                *JIGSAW,
                "simulate",
                "--workload",
                str(path),
                "--apps",
                str(POLLUX / "apps"),
                "--policy",
                "tiresias",
                "--cluster",
                "1x4",
                "--json",
                *flags,
            ],
            env=clean_env(tmp_path),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )  # fmt: skip
        for flags in ([], ["--adaptive-batch"])
    )
    assert fixed.returncode == 0 and adaptive_run.returncode == 0, adaptive_run.stderr
    rows = [json.loads(r.stdout) for r in (fixed, adaptive_run)]
    assert all(row["jobs"] == 1 for row in rows)
    assert rows[0]["avg_jct_s"] != rows[1]["avg_jct_s"]


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--first-seed", "-1"], "--first-seed must be at least 0"),
        (["--grow-seconds", "-5"], "--grow-seconds must be between 0 and 3600"),
        (["--restart-seconds", "-1"], "--restart-seconds must be between 0 and 3600"),
        (["--seeds", "0"], "--seeds must be at least 1"),
        (["--sampler", "days"], "invalid choice: 'days'"),
        (["--param", "nope=1"], "expected NAME=VALUE with NAME a JigsawParams field"),
        (["--param", "stickiness"], "expected NAME=VALUE with NAME a JigsawParams field"),
        (["--param", "stickiness=-1"], "stickiness: Input should be greater than 0"),
        (["--param", "efficiency_floors=[2]"], "efficiency_floors: Input should be less"),
    ],
)
def test_the_benchmark_refuses_bad_options_with_a_message(
    tmp_path: Path, option: list[str], message: str
) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.goodput_sim", *option],
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(tmp_path),
        cwd=Path(__file__).resolve().parents[1],
    )
    assert run.returncode == 2
    assert message in run.stderr and "Traceback" not in run.stderr


def test_a_param_changes_both_jigsaw_variants_and_no_other_policy() -> None:
    workload = load_workloads(POLLUX / "workloads")[0]
    args = (workload.name, 1.0, workload.jobs, 2000.0, SimOptions())
    shipped, _ = goodput_sim._rows(*args, None)
    no_growth, _ = goodput_sim._rows(*args, JigsawParams(grow=False))
    by_variant = {row["variant"]: row for row in shipped}
    changed = {row["variant"]: row for row in no_growth}
    assert changed["tiresias"] == by_variant["tiresias"]
    for variant in ("jigsaw goodput", "jigsaw fixed batch"):
        assert changed[variant]["avg_jct_s"] != by_variant[variant]["avg_jct_s"], variant


def test_free_restarts_and_event_rounds_reach_every_variant() -> None:
    workload = load_workloads(POLLUX / "workloads")[0]
    args = (workload.name, 1.0, workload.jobs, 2000.0)
    shipped, _ = goodput_sim._rows(*args, SimOptions(), None)
    ideal, _ = goodput_sim._rows(*args, SimOptions(restart_seconds=0, event_rounds=True), None)
    ideal_by_variant = {row["variant"]: row["avg_jct_s"] for row in ideal}
    for row in shipped:
        assert ideal_by_variant[row["variant"]] < row["avg_jct_s"], row["variant"]


def test_each_mean_carries_the_standard_error_of_its_windows() -> None:
    rows = [
        {
            "workload": f"w{i}",
            "load": 0.5,
            "variant": variant,
            **dict.fromkeys(goodput_sim.METRICS, 1.0),
            "avg_jct_s": jct,
            "pollux_avg_jct_s": 1534.0,
        }
        for i, jct in enumerate((1000.0, 2000.0))
        for variant in goodput_sim.VARIANTS
    ]
    [mean, *_] = goodput_sim._means(rows, "mean at 0.5x")
    # stdev 707.1 over the square root of two windows
    assert (mean["avg_jct_s"], mean["jct_se_s"]) == (1500.0, pytest.approx(500.0))
    [single, *_] = goodput_sim._means(rows[: len(goodput_sim.VARIANTS)], "one window")
    assert single["jct_se_s"] == 0.0
