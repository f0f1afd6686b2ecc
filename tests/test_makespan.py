"""The makespan lower bound: exact on small cases, for work partly done, and no policy's
run beats it; JigSaw's pacing by it when submissions stop."""

from __future__ import annotations

import json
import subprocess
from functools import partial
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.core.jobmodel import JobModel
from scheduler.core.makespan import (
    cost_curve,
    hull,
    least_cost,
    makespan_lower_bound,
    shortest_makespan,
)
from scheduler.policies import Policy, fifo, jigsaw, srtf, tiresias
from scheduler.policies.jigsaw import JigsawParams
from scheduler.sim.engine import ClusterShape, SimOptions, Simulator
from scheduler.sim.metrics import summarize
from scheduler.sim.trace import load_workload
from tests.servers import JIGSAW, clean_env

WORKLOAD_6 = Path(__file__).resolve().parents[2] / "shared/traces/pollux/workloads/workload-6.csv"


def job(seconds_by_size: dict[int, float], iterations: int = 100) -> JobModel:
    """A job of `iterations` that finishes in these seconds on these GPUs (one node)."""
    steps = {w: {1: (seconds / iterations, 0.0)} for w, seconds in seconds_by_size.items()}
    return JobModel(iterations_total=iterations, workers=min(seconds_by_size), steps=steps)


def test_jobs_of_one_size_are_bounded_by_their_longest_and_by_their_total_work() -> None:
    one_gpu_100_s = job({1: 100.0})
    assert makespan_lower_bound([one_gpu_100_s] * 2, gpus=2) == pytest.approx(100.0)
    # Three on two GPUs: 300 GPU-seconds need 150 s, though whole jobs would need 200.
    assert makespan_lower_bound([one_gpu_100_s] * 3, gpus=2) == pytest.approx(150.0)
    assert makespan_lower_bound([], gpus=2) == 0.0


def test_a_job_may_mix_sizes_and_never_runs_a_way_that_is_slower_and_dearer() -> None:
    # 1 GPU: 100 s (100 GPU-s); 2 GPUs: 80 s (160); 4 GPUs: 30 s (120). Two GPUs lie
    # above the chord between the others: half the work wide, half narrow is cheaper.
    curve = cost_curve(job({1: 100.0, 2: 80.0, 4: 30.0}), (None,))
    assert curve == [(pytest.approx(30.0), pytest.approx(120.0)), (100.0, 100.0)]
    assert least_cost(curve, 80.0) == pytest.approx(120.0 - 20.0 * 50.0 / 70.0)
    assert least_cost(curve, 20.0) == float("inf")
    assert least_cost(curve, 500.0) == pytest.approx(100.0)
    # Alone on four GPUs it finishes in 30 s; four of them need 400 GPU-seconds at best.
    assert makespan_lower_bound([job({1: 100.0, 4: 30.0})], gpus=4) == pytest.approx(30.0)
    assert makespan_lower_bound([job({1: 100.0, 4: 30.0})] * 4, gpus=4) == pytest.approx(100.0)


def test_work_partly_done_scales_its_curve() -> None:
    # 1 GPU: 100 s; 4 GPUs: 30 s (120 GPU-s); 2 GPUs: 80 s lies above their chord.
    curve = hull([(100.0, 100.0), (30.0, 120.0), (80.0, 160.0)])
    assert curve == [(30.0, 120.0), (100.0, 100.0)]
    # With a fifth of it left, a fifth of the time and of the GPU-seconds.
    assert least_cost(curve, 6.0, 0.2) == pytest.approx(24.0)
    assert least_cost(curve, 5.0, 0.2) == float("inf")
    assert least_cost(curve, 1000.0, 0.0) == 0.0
    # Half of it left: 15 s at best on 4 GPUs; two such halves on 2 GPUs need their
    # cheapest 50 GPU-s each, 50 s.
    assert shortest_makespan([(curve, 0.5)], 4) == pytest.approx(15.0)
    assert shortest_makespan([(curve, 0.5)] * 2, 2) == pytest.approx(50.0)
    # A fifth and a half on 4 GPUs: the least T where their least costs fit in 4 x T.
    work = [(curve, 0.2), (curve, 0.5)]
    bound = shortest_makespan(work, 4)
    assert sum(least_cost(c, bound, f) for c, f in work) <= 4 * bound * (1 + 1e-6)
    assert sum(least_cost(c, 0.99 * bound, f) for c, f in work) > 4 * 0.99 * bound
    assert shortest_makespan([], 4) == 0.0


def _by_bisection(work: list[tuple[list[tuple[float, float]], float]], gpus: int) -> float:
    """The bound's definition, searched plainly: the least T where least costs fit."""
    low = max(f * curve[0][0] for curve, f in work)
    high = max(low, max(f * c[-1][0] for c, f in work), sum(f * c[-1][1] for c, f in work) / gpus)
    while high - low > 1e-12 * high:
        middle = (low + high) / 2
        if sum(least_cost(curve, middle, f) for curve, f in work) <= gpus * middle:
            high = middle
        else:
            low = middle
    return high


# A job's ways to run: (seconds per unit of work, GPUs), any number of them.
_WAYS = st.lists(st.tuples(st.floats(0.01, 1000.0), st.integers(1, 64)), min_size=1, max_size=6)


@given(
    jobs=st.lists(st.tuples(_WAYS, st.floats(1e-3, 1e4)), min_size=1, max_size=8),
    gpus=st.integers(1, 128),
)
def test_the_corner_walk_finds_the_bound_a_bisection_finds(
    jobs: list[tuple[list[tuple[float, int]], float]], gpus: int
) -> None:
    # Shares left far from 1 make the job that sets the start land a rounding error
    # before its own first corner (a bug the walk once had).
    work = [(hull((t, t * w) for t, w in ways), share) for ways, share in jobs]
    assert shortest_makespan(work, gpus) == pytest.approx(_by_bisection(work, gpus), rel=1e-9)


def test_no_policy_finishes_a_pollux_workload_before_the_bound() -> None:
    workload = load_workload(WORKLOAD_6)
    jobs = workload.jobs[:60]
    cluster = ClusterShape.parse("4x4")
    options = SimOptions(zero_arrivals=True)
    bound = makespan_lower_bound(
        Simulator(jobs, cluster, fifo.schedule, options=options).models,
        cluster.gpus,
        (None, *jigsaw.CONFIGS),
    )
    # Policies that give each GPU to one job at a time (the bound's assumption).
    policies: dict[str, Policy] = {
        "fifo": fifo.schedule,
        "srtf": srtf.schedule,
        "tiresias": tiresias.schedule,
        "jigsaw without packing": partial(jigsaw.schedule, params=JigsawParams(max_guests=0)),
    }
    makespans = {}
    for name, policy in policies.items():
        result = Simulator(jobs, cluster, policy, options=options).run()
        makespans[name] = summarize(result)["makespan_s"]
    assert all(makespan >= bound for makespan in makespans.values()), (bound, makespans)
    # Close enough to a good schedule to be worth quoting (JigSaw within 40% of it).
    assert makespans["jigsaw without packing"] < 1.4 * bound, (bound, makespans)


def test_simulate_reports_the_bound_of_a_workload_submitted_at_time_0(tmp_path: Path) -> None:
    # Three one-GPU jobs of 100 s on two GPUs: 300 GPU-seconds bound it at 150 s.
    path = tmp_path / "three.csv"
    path.write_text(
        "name,submit_seconds,workers,iterations,step_seconds\n"
        + "".join(f"j{i},{i * 10},1,100,1\n" for i in range(3))
    )
    command = [*JIGSAW, "simulate", "--workload", str(path), "--policies", "fifo,jigsaw",
               "--cluster", "1x2", "--arrivals", "zero"]  # fmt: skip
    run = partial(
        subprocess.run, env=clean_env(tmp_path), capture_output=True, text=True, timeout=120
    )
    result = run([*command, "--json"], check=True)
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [row["makespan_lower_bound_s"] for row in rows] == [pytest.approx(150.0)] * 2
    assert all(row["makespan_s"] >= 200.0 for row in rows)  # whole jobs: two rounds
    table = run(command, check=True).stdout
    assert "finishes before 150 s (makespan lower bound)" in " ".join(table.split())
    # With the trace's arrivals there is no such bound to report.
    traced = run([*command[:-2], "--json"], check=True).stdout
    assert all("makespan_lower_bound_s" not in json.loads(line) for line in traced.splitlines())


def test_pacing_shortens_a_batch_and_leaves_a_trace_with_arrivals_alone() -> None:
    """Workload-6 on 16x4: submitted at once, three hours without submissions start JigSaw
    pacing its ImageNet jobs beside the short ones, and the batch ends sooner, though
    never before the bound. With the trace's arrivals the cluster drains with nothing
    but long jobs left, so pacing never starts and every job ends when it would
    without it (pacing equalises finishes only while short jobs wait)."""
    workload = load_workload(WORKLOAD_6)
    cluster = ClusterShape.parse("16x4")
    unpaced = partial(jigsaw.schedule, params=JigsawParams(pace_after_seconds=float("inf")))
    finishes = {}
    for zero in (True, False):
        for name, policy in (("paced", jigsaw.schedule), ("unpaced", unpaced)):
            options = SimOptions(zero_arrivals=zero)
            result = Simulator(workload.jobs, cluster, policy, options=options).run()
            finishes[zero, name] = [job.finish or 0.0 for job in result.jobs]
    models = Simulator(workload.jobs, cluster, unpaced).models
    bound = makespan_lower_bound(models, cluster.gpus, (None, *jigsaw.CONFIGS))
    paced_end, unpaced_end = max(finishes[True, "paced"]), max(finishes[True, "unpaced"])
    assert bound <= paced_end < 0.99 * unpaced_end, (bound, paced_end, unpaced_end)
    assert finishes[False, "paced"] == finishes[False, "unpaced"]
