"""The trace-driven simulator: workload files in, the real policies over simulated time."""

from __future__ import annotations

import json
import subprocess
from datetime import datetime
from pathlib import Path

import pytest

from scheduler.core.interference import fitted
from scheduler.core.jobmodel import JobModel
from scheduler.core.plan import Placement, Plan
from scheduler.core.snapshot import ClusterSnapshot
from scheduler.policies import get_policy, jigsaw
from scheduler.sim.engine import EPOCH, ClusterShape, SimOptions, SimulationStuck, Simulator
from scheduler.sim.gpus import SimGPU, h100_sweeps
from scheduler.sim.metrics import summarize
from scheduler.sim.profiles import default_profile, load_profiles, profile_for
from scheduler.sim.trace import PhillyFilter, TraceError, load_workload
from tests.servers import JIGSAW, clean_env

POLLUX = Path(__file__).resolve().parents[2] / "shared" / "traces" / "pollux"
HEADER = "name,submit_seconds,workers,iterations,step_seconds\n"


def write(tmp_path: Path, text: str, name: str = "jobs.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def run(path: Path, policy: str, cluster: str = "1x2", **options: object) -> dict[str, object]:
    workload = load_workload(path)
    simulator = Simulator(
        workload.jobs,
        ClusterShape.parse(cluster),
        get_policy(policy),
        policy_name=policy,
        options=SimOptions(**options),  # type: ignore[arg-type]
    )
    return summarize(simulator.run())


def test_malformed_rows_are_reported_by_line_and_skipped(tmp_path: Path) -> None:
    path = write(
        tmp_path, HEADER + "a,0,1,10,1\nb,0,zero,10,1\nc,0,1,10,-1\nd,0,0,10,1\ne,5,2,10,0.5\n"
    )
    workload = load_workload(path)
    assert [job.name for job in workload.jobs] == ["a", "e"]
    assert [(s.line, s.reason) for s in workload.skipped] == [
        (3, "invalid literal for int() with base 10: 'zero'"),
        (4, "step_seconds must be a positive number"),
        (5, "workers must be at least 1, got 0"),
    ]
    with pytest.raises(TraceError, match=r"jobs.csv:3: invalid literal"):
        load_workload(path, strict=True)


def test_unknown_format_is_refused_with_the_expected_columns(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="unknown columns"):
        load_workload(write(tmp_path, "x,y\n1,2\n"))


def test_a_job_larger_than_the_cluster_is_rejected_not_left_to_starve(tmp_path: Path) -> None:
    path = write(tmp_path, HEADER + "small,0,2,10,1\nhuge,0,3,10,1\n")
    workload = load_workload(path)
    simulator = Simulator(workload.jobs, ClusterShape.parse("1x2"), get_policy("fifo"))
    result = simulator.run()
    assert result.rejected == [("huge", "needs 3 GPUs; the cluster has 2")]
    assert [r.trace.name for r in result.jobs if r.finish is not None] == ["small"]


def test_fifo_times_are_exact_at_lease_granularity(tmp_path: Path) -> None:
    # a holds both GPUs for 100 s; b arrives at 5 s and waits; the round after a's end
    # (t=100, a lease boundary) starts b, which runs 50 s.
    path = write(tmp_path, HEADER + "a,0,2,100,1\nb,5,1,50,1\n")
    metrics = run(path, "fifo", round_seconds=10.0, restart_seconds=0.0)
    assert metrics["avg_jct_s"] == pytest.approx((100 + 145) / 2)
    assert metrics["makespan_s"] == pytest.approx(150)
    assert metrics["avg_queueing_delay_s"] == pytest.approx(95 / 2)
    # 2 GPUs x 100 s + 1 GPU x 50 s of 2 GPUs x 150 s.
    assert metrics["gpu_utilization"] == pytest.approx(250 / 300)
    assert metrics["cluster_efficiency"] == pytest.approx(250 / 300)


def test_restarts_cost_time_and_preemption_is_counted(tmp_path: Path) -> None:
    # SRTF suspends the long job for the short one; both pay the restart.
    path = write(tmp_path, HEADER + "long,0,1,1000,1\nshort,30,1,100,1\n")
    metrics = run(path, "srtf", cluster="1x1", round_seconds=60.0, restart_seconds=10.0)
    assert metrics["suspensions"] == 1
    # short: placed at 60, ready at 70, done at 170 -> JCT 140.
    # long: ran 0..60 (50 iterations after setup), resumed at 180 (the round after 170),
    # ready at 190, 950 left -> done at 1140.
    assert metrics["p50_jct_s"] == pytest.approx((140 + 1140) / 2)
    assert metrics["makespan_s"] == pytest.approx(1140)


def test_the_simulated_store_applies_plans_under_the_state_machine(tmp_path: Path) -> None:
    # A policy that starts job 1 on GPU 0 every round: the second start of a RUNNING job
    # is an illegal transition and is refused, as the real loop refuses it.
    rounds: list[ClusterSnapshot] = []

    def stubborn(snapshot: ClusterSnapshot) -> Plan:
        rounds.append(snapshot)
        return Plan(start=(Placement(1, (0,)),))

    workload = load_workload(write(tmp_path, HEADER + "a,0,1,200,1\nb,10,1,10,1\n"))
    simulator = Simulator(workload.jobs, ClusterShape.parse("1x2"), stubborn)
    # It never places job 2 either: once job 1 is done, the run stops with a reason.
    with pytest.raises(SimulationStuck, match="runs none of the 1 waiting job"):
        simulator.run()
    assert simulator.conflicts == len(rounds) - 1
    held = [j.allocated_gpu_ids for j in rounds[1].jobs if j.id == 1]
    assert held == [(0,)]


@pytest.mark.skipif(not POLLUX.is_dir(), reason="the Pollux traces live in ../shared/traces")
def test_a_growth_in_place_costs_what_the_options_say_and_any_other_move_a_restart(
    tmp_path: Path,
) -> None:
    # A cifar10 job on GPU 0, moved at 60 s (the round a second job's arrival brings;
    # that one runs once the first is done): onto GPUs 0 and 1 (a growth in place),
    # onto GPU 1 alone or onto GPUs 1 and 0 (rank 0 moved: restarts). The move's setup is
    # the restart's 30 s but for a growth in place under `grow_seconds`: the job ends
    # that much sooner.
    rows = "name,time,application,num_replicas,batch_size\na,0,cifar10,1,128\nb,60,ncf,1,256\n"
    workload = load_workload(write(tmp_path, rows), apps_dir=POLLUX / "apps")

    def finish(to: tuple[int, ...], grow_seconds: float | None) -> float | None:
        def mover(snapshot: ClusterSnapshot) -> Plan:
            if not snapshot.jobs:
                return Plan()
            first, *rest = sorted(snapshot.jobs, key=lambda job: job.id)
            if snapshot.now == EPOCH:
                return Plan(start=(Placement(first.id, (0,)),))
            if first.allocated_gpu_ids == (0,) and rest:
                return Plan(suspend=(first.id,), start=(Placement(first.id, to),))
            if not first.holding and not rest:  # the second job, once the first is done
                return Plan(start=(Placement(first.id, (0,)),))
            return Plan()

        options = SimOptions(round_seconds=60.0, grow_seconds=grow_seconds)
        simulator = Simulator(workload.jobs, ClusterShape.parse("1x2"), mover, options=options)
        return simulator.run().jobs[0].finish

    grown, moved = finish((0, 1), None), finish((1,), None)
    assert grown is not None and moved is not None
    assert finish((0, 1), 5.0) == pytest.approx(grown - 25.0)
    assert finish((1,), 5.0) == pytest.approx(moved)
    assert finish((1, 0), 5.0) == pytest.approx(finish((1, 0), None))


@pytest.mark.skipif(not POLLUX.is_dir(), reason="the Pollux traces live in ../shared/traces")
def test_tiresias_matches_the_published_workload_6_figure() -> None:
    # Pollux (OSDI'21) reports Tiresias at 3,469.7 s average JCT on workload-6, 16x4.
    metrics = run(POLLUX / "workloads" / "workload-6.csv", "tiresias", cluster="16x4")
    assert metrics["jobs"] == 160
    assert abs(metrics["avg_jct_s"] - 3469.7) / 3469.7 < 0.10  # type: ignore[operator]
    fifo = run(POLLUX / "workloads" / "workload-6.csv", "fifo", cluster="16x4")
    srtf = run(POLLUX / "workloads" / "workload-6.csv", "srtf", cluster="16x4")
    # Sane against it: head-of-line FIFO is far worse, SRTF (knowing durations) better.
    assert fifo["avg_jct_s"] > 2 * metrics["avg_jct_s"]  # type: ignore[operator]
    assert srtf["avg_jct_s"] < metrics["avg_jct_s"]  # type: ignore[operator]


@pytest.mark.skipif(not POLLUX.is_dir(), reason="the Pollux traces live in ../shared/traces")
def test_jigsaw_never_restarts_a_job_on_the_gpus_it_holds() -> None:
    """A running job sized below what it holds in admission (a guest ahead of it was
    admitted but found too few GPUs of its own), then grown back into the same GPUs,
    the only ones free, stays where it runs: restarted there, it paid a start every
    lease for nothing (workload-8 on T4s, submitted at once: 15 times, one job 11
    leases in a row)."""
    workload = load_workload(POLLUX / "workloads" / "workload-8.csv")
    moves: list[int] = []
    in_place: list[tuple[datetime, int]] = []

    def policy(snapshot: ClusterSnapshot) -> Plan:
        plan = jigsaw.schedule(snapshot)
        held = {job.id: set(job.allocated_gpu_ids) for job in snapshot.jobs if job.holding}
        for placement in plan.start:
            if placement.job_id in plan.suspend:
                moves.append(placement.job_id)
                if set(placement.gpu_ids) == held[placement.job_id]:
                    in_place.append((snapshot.now, placement.job_id))
        return plan

    options = SimOptions(zero_arrivals=True)
    Simulator(workload.jobs, ClusterShape.parse("16x4"), policy, options=options).run()
    assert len(moves) > 50  # it does move jobs, onto other GPUs
    assert in_place == []


def test_cli_compares_policies_as_json_and_writes_plots(tmp_path: Path) -> None:
    path = write(tmp_path, HEADER + "a,0,2,100,1\nb,5,1,50,1\nc,7,1,500,1\n")
    result = subprocess.run(
        [*JIGSAW, "simulate", "--workload", str(path), "--policies", "fifo,tiresias",
         "--cluster", "1x2", "--json", "--plots", str(tmp_path / "plots")],
        env=clean_env(tmp_path), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(r["workload"], r["policy"], r["jobs"]) for r in rows] == [
        ("jobs", "fifo", 3),
        ("jobs", "tiresias", 3),
    ]
    for row in rows:
        assert {"avg_jct_s", "p99_jct_s", "makespan_s", "gpu_utilization"} <= row.keys()
        assert "cluster_efficiency" in row
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == [
        "jobs-jct-cdf.png",
        "jobs-queue.png",
        "jobs-utilization.png",
    ]


def test_cli_table_fits_80_columns_when_piped(tmp_path: Path) -> None:
    path = write(tmp_path, HEADER + "a,0,2,100,1\nb,5,1,50,1\nc,7,1,500,1\n")
    result = subprocess.run(
        [*JIGSAW, "simulate", "--workload", str(path), "--policies", "fifo,jigsaw",
         "--cluster", "1x2"],
        env=clean_env(tmp_path, COLUMNS="80"), capture_output=True, text=True, timeout=120,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert max(map(len, lines)) <= 80 and "…" not in result.stdout, result.stdout
    headings = " ".join(line for line in lines if line.startswith("┃"))
    for heading in ("JCT avg", "p99", "makespan", "util", "eff", "wait", "FTF max", "reconf"):
        assert f" {heading} " in headings, result.stdout
    # Every split repeats who the row is.
    assert sum(line.startswith("│ jobs") and " fifo " in line for line in lines) >= 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cluster", "16by4"], "cluster shape must look like 16x4"),
        (["--policy", "lottery"], "unknown policy 'lottery'"),
        (["--workload", "/nonexistent.csv"], "no such file or directory"),
        (["--spb-profiles", "/nonexistent"], "not a directory of SPB profiles"),
    ],
)
def test_cli_bad_input_is_a_message_not_a_traceback(
    tmp_path: Path, args: list[str], message: str
) -> None:
    path = write(tmp_path, HEADER + "a,0,1,10,1\n")
    command = [*JIGSAW, "simulate", "--workload", str(path), *args]
    result = subprocess.run(
        command, env=clean_env(tmp_path), capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_reports_rows_it_could_not_read_and_refuses_an_empty_workload(
    tmp_path: Path,
) -> None:
    path = write(tmp_path, "name,time,application,num_replicas,batch_size\nx,0,cifar10,1,128\n")
    result = subprocess.run(
        [*JIGSAW, "simulate", "--workload", str(path), "--apps", str(tmp_path / "none")],
        env=clean_env(tmp_path), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert "line 2" in result.stderr and "no job to simulate (1 row(s) skipped)" in result.stderr
    assert "Traceback" not in result.stderr


def test_jobs_sharing_a_gpu_are_charged_the_measured_interference(tmp_path: Path) -> None:
    # Both 1-GPU jobs keep their GPU busy all the time (no synchronisation): saturated,
    # on one simulated T4 (the V100 fit, capacity 0.8) each runs at 0.8 / 2 of its speed,
    # a loss against running them one after the other.
    def share(snapshot: ClusterSnapshot) -> Plan:
        return Plan(start=tuple(Placement(j.id, (0,)) for j in snapshot.jobs if j.waiting))

    workload = load_workload(write(tmp_path, HEADER + "a,0,1,100,1\nb,0,1,100,1\n"))
    options = SimOptions(round_seconds=1000.0, restart_seconds=0.0)
    result = Simulator(workload.jobs, ClusterShape.parse("1x2"), share, options=options).run()
    assert fitted().get("t4").capacity == pytest.approx(0.8)
    assert [r.finish for r in result.jobs] == [pytest.approx(250.0)] * 2
    metrics = summarize(result)
    assert metrics["gpu_utilization"] == pytest.approx(0.5)
    assert metrics["packings"] == 1  # the second placed joined the first's GPU
    assert metrics["packed_gpu_seconds"] == pytest.approx(250.0)


def test_jigsaw_runs_in_the_simulator_with_spb_and_packing(tmp_path: Path) -> None:
    # Two-GPU jobs that synchronise for most of their step: JigSaw turns SPB on.
    rows = "".join(f"j{i},{i * 30},2,400,2.0,1.5,bert\n" for i in range(4))
    path = write(
        tmp_path,
        "name,submit_seconds,workers,iterations,step_seconds,sync_seconds,workload\n" + rows,
    )
    metrics = run(path, "jigsaw", cluster="1x4")
    assert metrics["jobs"] == 4
    assert metrics["spb_jobs"] >= 1
    assert metrics["conflicts"] == 0


def test_a_pollux_job_alone_grows_past_what_it_asked_for(tmp_path: Path) -> None:
    # The profiles measure deepspeech2 at batch 640 on up to 64 GPUs, and it still
    # speeds up past the 12 it asks for: alone on 16x4, JigSaw grows it to the size
    # that finishes it soonest, well before its run alone on 12; Tiresias runs it as
    # asked.
    path = write(
        tmp_path, "name,time,application,num_replicas,batch_size\nd,0,deepspeech2,12,640\n"
    )
    workload = load_workload(path, apps_dir=POLLUX / "apps")
    results = {
        name: Simulator(workload.jobs, ClusterShape.parse("16x4"), get_policy(name)).run()
        for name in ("jigsaw", "tiresias")
    }
    grown, asked = (results[name].jobs[0] for name in ("jigsaw", "tiresias"))
    assert asked.finish == pytest.approx(asked.alone_seconds + 30.0)  # one restart
    assert grown.finish is not None and grown.finish < 0.8 * asked.alone_seconds


def test_measured_spb_profiles_replace_the_assumed_defaults(tmp_path: Path) -> None:
    measured = default_profile("resnet").to_json() | {"workload": "resnet-synthetic"}
    measured["steps_ratio"] = {"0.5/0.5": 1.3}
    (tmp_path / "resnet.json").write_text(json.dumps(measured))
    profiles = load_profiles(tmp_path)
    # cifar10 is a ResNet: the measured family profile applies, with its own price.
    chosen = profile_for("cifar10", profiles)
    assert chosen.workload == "resnet-synthetic"
    assert chosen.steps_ratio == {"0.5/0.5": 1.3}
    # Nothing measured for a transformer: the labelled first-principles default.
    assert profile_for("bert", profiles).workload == "default-transformer"
    (tmp_path / "broken.json").write_text("{}")
    with pytest.raises(ValueError, match="broken.json: not an SPB profile"):
        load_profiles(tmp_path)


def test_philly_rows_are_filtered_windowed_sampled_and_rebased(tmp_path: Path) -> None:
    rows = [
        "2017-10-01 00:00:10,100.0,1,100.0,aa",
        "2017-10-01 00:00:00,50.0,2,100.0,aa",
        "2017-10-01 00:01:00,70.0,4,280.0,bb",
        "2017-10-02 00:00:00,30.0,1,30.0,aa",
        "2017-10-01 00:02:00,-5,1,0,aa",
    ]
    path = write(tmp_path, "timestamp,duration,num_gpus,gpu_time,cluster\n" + "\n".join(rows))
    workload = load_workload(
        path,
        philly=PhillyFilter(cluster="aa", start=datetime(2017, 10, 1), end=datetime(2017, 10, 2)),
    )
    # Sorted by submission, times from the first kept one, 1 s per iteration.
    assert [(j.submit_seconds, j.workers, j.iterations) for j in workload.jobs] == [
        (0.0, 2, 50),
        (10.0, 1, 100),
    ]
    assert [s.line for s in workload.skipped] == [6]
    assert len(load_workload(path, philly=PhillyFilter(limit=2)).jobs) == 2
    sampled = load_workload(path, philly=PhillyFilter(sample=0.5, seed=1)).jobs
    assert sampled == load_workload(path, philly=PhillyFilter(sample=0.5, seed=1)).jobs
    assert len(sampled) < 4


@pytest.mark.skipif(not POLLUX.is_dir(), reason="the Pollux traces live in ../shared/traces")
def test_the_h100_option_runs_stand_ins_at_their_measured_speed(tmp_path: Path) -> None:
    """imagenet stands for ResNet-50 measured on an H100: at 4 x 64 its workers compute
    for the measured solo step at batch 64 and keep the GPU as busy as measured while
    they do; deepspeech2, not measured there, keeps its profile and the T4 rule."""

    def model_of(application: str, batch: int, gpu: SimGPU) -> JobModel:
        path = write(
            tmp_path,
            f"name,time,application,num_replicas,batch_size\nj,0,{application},4,{batch}\n",
        )
        jobs = load_workload(path, apps_dir=POLLUX / "apps").jobs
        cluster = ClusterShape.parse("1x4", 80)
        options = SimOptions(gpu=gpu)
        (model,) = Simulator(jobs, cluster, get_policy("fifo"), options=options).models
        return model

    resnet = h100_sweeps()["resnet50"].at(64)
    t4, h100 = (model_of("imagenet", 256, gpu) for gpu in (SimGPU.T4, SimGPU.H100))
    (_, sync), (h100_step, h100_sync) = t4.step_at(4, 1), h100.step_at(4, 1)
    assert h100_sync == sync and h100_step == pytest.approx(resnet.step_seconds + sync)
    assert h100.memory_bytes == resnet.memory_bytes
    assert h100.intensity == pytest.approx(resnet.utilization)
    assert t4.intensity == pytest.approx(1.0)  # saturated while computing
    speech_t4, speech_h100 = (model_of("deepspeech2", 80, gpu) for gpu in SimGPU)
    assert speech_h100.steps == speech_t4.steps
    assert speech_h100.intensity == pytest.approx(1.0)


@pytest.mark.skipif(not POLLUX.is_dir(), reason="the Pollux traces live in ../shared/traces")
def test_simulate_json_reports_packing_and_spb(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "name,time,application,num_replicas,batch_size\n"
        + "".join(f"c{i},0,cifar10,1,128\n" for i in range(4)),
    )
    result = subprocess.run(
        [*JIGSAW, "simulate", "--workload", str(path), "--apps", str(POLLUX / "apps"),
         "--policy", "jigsaw", "--gpu", "h100", "--cluster", "1x2", "--json"],
        env=clean_env(tmp_path), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    row = json.loads(result.stdout)
    # ResNet-18-CIFAR at batch 128 keeps an H100 22% busy: four such jobs on two GPUs
    # are packed two to a GPU.
    assert row["packings"] >= 2 and row["packed_gpu_seconds"] > 0
    assert {"spb_jobs", "reconfigurations"} <= set(row)


@pytest.mark.parametrize(
    ("event_rounds", "starts"), [(False, [0, 120, 300]), (True, [0, 100, 250])]
)
def test_event_rounds_start_jobs_at_an_arrival_or_an_end_not_the_next_boundary(
    tmp_path: Path, event_rounds: bool, starts: list[float]
) -> None:
    # One GPU: b waits for a, which ends at 100 s; c arrives at 250 s to a free GPU.
    workload = load_workload(write(tmp_path, HEADER + "a,0,1,100,1\nb,30,1,10,1\nc,250,1,10,1\n"))
    options = SimOptions(round_seconds=60.0, restart_seconds=0.0, event_rounds=event_rounds)
    result = Simulator(
        workload.jobs, ClusterShape.parse("1x1"), get_policy("fifo"), options=options
    ).run()
    assert [r.first_start for r in result.jobs] == starts
    assert [r.finish for r in result.jobs] == [100, starts[1] + 10, starts[2] + 10]
