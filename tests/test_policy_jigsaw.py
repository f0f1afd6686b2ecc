"""The JigSaw policy as a pure function: SPB choice, packing, starvation, resizing."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from jigsaw.jobspec import SPBConfig
from jigsaw.spb import SPBProfile, StageProfile, as_json, config_key
from scheduler.core.interference import Sharing, fitted
from scheduler.core.jobmodel import JobModel, colocation_stretch, stretched_step
from scheduler.core.plan import Placement, Plan, Reconfigure, Resize
from scheduler.core.snapshot import ClusterSnapshot, JobView, NodeView
from scheduler.core.states import JobState
from scheduler.policies import get_policy, jigsaw, policy_params
from scheduler.policies.jigsaw import JigsawParams, sizing
from scheduler.settings import SchedulerSettings
from tests.test_policy_baselines import nodes as baseline_nodes

T0 = datetime(2024, 1, 1, tzinfo=UTC)
NOW = T0 + timedelta(hours=1)
GIB = 1 << 30
HALF = SPBConfig(full_fraction=0.5, partial_depth=0.5)
QUARTER = SPBConfig(full_fraction=0.5, partial_depth=0.25)


def profile(bottom_parameters: int = 1 << 20, price: float = 1.02) -> SPBProfile:
    """Four equal stages; the bottom two hold `bottom_parameters` bytes each."""
    return SPBProfile(
        workload="test",
        per_worker_batch=32,
        stages=tuple(
            StageProfile(
                forward_seconds=1.0,
                backward_input_seconds=1.0,
                backward_weight_seconds=1.0,
                activation_bytes=1 << 30,
                parameter_bytes=bottom_parameters if stage < 2 else 1 << 20,
            )
            for stage in range(4)
        ),
        steps_ratio={config_key(c): price for c in jigsaw.CONFIGS},
    )


def model(
    workers: int,
    iterations: int,
    *,
    step: float = 1.0,
    sync: float = 0.0,
    memory: int = 4 * GIB,
    spb: SPBProfile | None = None,
    sizes: dict[int, float] | None = None,
    utilization: float | None = None,
) -> JobModel:
    steps = {workers: {1: (step, sync)}}
    for size, seconds in (sizes or {}).items():
        steps[size] = {1: (seconds, 0.0)}
    return JobModel(
        iterations_total=iterations,
        workers=workers,
        steps=steps,
        memory_bytes=memory,
        activation_fraction=0.5,
        spb_profile=spb,
        utilization=utilization,
    )


def nodes(count: int, size: int, held: dict[int, int] | None = None) -> tuple[NodeView, ...]:
    return baseline_nodes(count, size, held, memory=16 * GIB)


def job(
    job_id: int,
    workers: int,
    job_model: JobModel | None,
    *,
    state: JobState = JobState.QUEUED,
    gpus: tuple[int, ...] = (),
    spb: dict[str, object] | None = None,
    arrived: float = 60.0,
) -> JobView:
    return JobView(
        id=job_id,
        state=state,
        priority=0,
        workers=workers,
        created_at=NOW - timedelta(seconds=arrived),
        allocated_gpu_ids=gpus,
        spb=spb or {},
        attained_gpu_seconds=workers * arrived if gpus else 0.0,
        held_since=NOW - timedelta(seconds=arrived) if gpus else None,
        model=job_model,
    )


def snap(cluster: tuple[NodeView, ...], *jobs: JobView) -> ClusterSnapshot:
    return ClusterSnapshot(nodes=cluster, jobs=jobs, now=NOW)


def test_registered_for_the_real_loop() -> None:
    assert get_policy("jigsaw") is jigsaw.schedule


def test_spb_is_chosen_when_fewer_bytes_outweigh_its_price() -> None:
    # Synchronisation is most of the step and the bottom stages hold most parameters:
    # partial workers skip their gradients, so SPB pays for its 2% price.
    heavy = model(2, 1000, step=2.0, sync=1.5, spb=profile(bottom_parameters=1 << 28))
    plan = jigsaw.schedule(snap(nodes(1, 2), job(1, 2, heavy)))
    assert plan.start == (Placement(1, (100, 101), as_json(HALF)),)
    # With nothing to save it stays off.
    light = model(2, 1000, step=2.0, sync=0.0, spb=profile())
    assert jigsaw.schedule(snap(nodes(1, 2), job(1, 2, light))).start[0].spb == {}


def test_a_waiting_job_is_packed_on_partial_workers_without_slowing_the_host() -> None:
    host_model = model(2, 10_000, step=3.0, spb=profile(), utilization=0.3)
    # It could run faster on two GPUs: on one only, it would outlast the host by so
    # much that it had to start first (the test of jobs that set the makespan).
    guest_model = model(1, 100_000, sizes={2: 0.4}, utilization=0.3)
    host = job(1, 2, host_model, state=JobState.RUNNING, gpus=(100, 101))
    guest = job(2, 1, guest_model)
    plan = jigsaw.schedule(snap(nodes(1, 2, held={100: 1, 101: 1}), host, guest))
    # The host turns SPB on, its partial worker (rank 1, GPU 101) training only the top
    # stage (the most room for the same price), and hosts the guest there.
    assert plan.reconfigure == (Reconfigure(1, as_json(QUARTER)),)
    assert plan.start == (Placement(2, (101,), {}),)
    assert plan.suspend == ()
    # As the simulator will charge it: the host's pace is its full worker's.
    shape = host_model.shape(QUARTER, 2)
    guest_shape = guest_model.shape(None, 1)
    assert shape.utilizations is not None and guest_shape.utilizations is not None
    factors = colocation_stretch(
        [(1, shape.utilizations[1]), (2, guest_shape.utilizations[0])], fitted().get("v100")
    )
    assert factors[1] > 1.0  # the partial worker is slowed, within its slack
    assert stretched_step(shape, [1.0, factors[1]]) == shape.step_seconds


def test_a_job_that_will_run_until_the_cluster_drains_hosts_only_such_guests() -> None:
    # As above, but the host has 60,000 s to go, most of the 100,000 s the cluster
    # needs for all its work: it will still run at the end, and what a guest that ends
    # sooner anyway (40,000 s at its fastest) costs it (its SPB price, here) delays
    # the last finish.
    host_model = model(2, 20_000, step=3.0, spb=profile(), utilization=0.3)
    host = job(1, 2, host_model, state=JobState.RUNNING, gpus=(100, 101))
    guest = job(2, 1, model(1, 100_000, sizes={2: 0.4}, utilization=0.3))
    cluster = nodes(1, 2, held={100: 1, 101: 1})
    assert jigsaw.schedule(snap(cluster, host, guest)) == Plan()
    packed = jigsaw.schedule(snap(cluster, host, guest), JigsawParams(tail_share=0.0))
    assert packed.start == (Placement(2, (101,), {}),)
    # A guest that will run until the end too (60,000 s at its fastest) ends sooner
    # beside the host than after it.
    longer = job(2, 1, model(1, 150_000, sizes={2: 0.4}, utilization=0.3))
    assert jigsaw.schedule(snap(cluster, host, longer)).start == (Placement(2, (101,), {}),)


def test_a_host_keeps_the_configuration_its_guest_was_packed_under() -> None:
    # The round after packing: the host runs at QUARTER with the guest on its partial
    # worker. Switched back to full backprop (its best alone) that worker would
    # time-slice with the guest and slow the host, so nothing changes.
    host = job(
        1,
        2,
        model(2, 10_000, step=3.0, spb=profile(), utilization=0.3),
        state=JobState.RUNNING,
        gpus=(100, 101),
        spb=as_json(QUARTER),
        arrived=600,
    )
    guest = job(
        2,
        1,
        model(1, 100_000, sizes={2: 0.4}, utilization=0.3),
        state=JobState.RUNNING,
        gpus=(101,),
    )
    (node,) = nodes(1, 2, held={100: 1, 101: 1})
    shared = replace(node, gpus=(node.gpus[0], replace(node.gpus[1], holders=(1, 2))))
    assert jigsaw.schedule(snap((shared,), host, guest)) == Plan()


def test_packing_never_over_commits_gpu_memory() -> None:
    host = job(
        1,
        2,
        model(2, 10_000, step=3.0, spb=profile(), utilization=0.3),
        state=JobState.RUNNING,
        gpus=(100, 101),
    )
    guest = job(2, 1, model(1, 100_000, memory=15 * GIB, sizes={2: 0.4}, utilization=0.3))
    plan = jigsaw.schedule(snap(nodes(1, 2, held={100: 1, 101: 1}), host, guest))
    assert plan == Plan()


def test_shorter_jobs_first_but_a_starving_job_goes_ahead() -> None:
    cluster = nodes(1, 1)
    short = job(1, 1, model(1, 10))
    long_fresh = job(2, 1, model(1, 10_000))
    assert [p.job_id for p in jigsaw.schedule(snap(cluster, short, long_fresh)).start] == [1]
    starving = job(2, 1, model(1, 10_000), arrived=JigsawParams().starvation_seconds + 1)
    assert [p.job_id for p in jigsaw.schedule(snap(cluster, short, starving)).start] == [2]


def test_a_waiting_job_displaces_a_running_one_only_by_more_than_both_starts() -> None:
    """Jobs of seconds: 0.5 s shorter than a running job's 7 s (10 s, discounted by
    `stickiness`) displaces it while a start is free, not once starts cost 2 s; then
    it takes a waiting job shorter by more than its own start and the running job's
    second one."""
    cluster = nodes(1, 1, {100: 1})
    running = job(1, 1, model(1, 10, step=1.0), state=JobState.RUNNING, gpus=(100,))

    def displaces(waiting_seconds: float, start: float | None) -> bool:
        waiting = job(2, 1, model(1, round(waiting_seconds * 10), step=0.1))
        jobs = [replace(j, start_seconds=start) for j in (running, waiting)]
        plan = jigsaw.schedule(snap(cluster, *jobs))
        if plan == Plan():
            return False
        assert (plan.suspend, [p.job_id for p in plan.start]) == ((1,), [2])
        return True

    assert displaces(6.5, None)
    assert not displaces(6.5, 2.0)
    assert not displaces(4.5, 2.0)  # 4.5 + 2 < 7, but the running job starts again
    assert displaces(2.5, 2.0)  # 2.5 + 2 < 7 - 2


def test_a_wasteful_job_is_shrunk_only_while_the_cluster_is_crowded() -> None:
    # Asked for 4 GPUs but runs barely faster than on 2: 1 s on 4 vs 1.5 s on 2 GPUs,
    # so 2 GPUs give 33% more progress per GPU.
    wasteful = model(4, 1000, sizes={2: 1.5})
    alone = jigsaw.schedule(snap(nodes(1, 4), job(1, 4, wasteful)))
    assert [len(p.gpu_ids) for p in alone.start] == [4]
    crowded = jigsaw.schedule(snap(nodes(1, 4), job(1, 4, wasteful), job(2, 2, model(2, 5000))))
    assert sorted(len(p.gpu_ids) for p in crowded.start) == [2, 2]


def test_at_light_load_adaptive_jobs_spread_over_the_gpus_by_the_fluid_sum() -> None:
    # Two adaptive jobs ask for 1 GPU of 8, speed up as w^0.6 and have 1,000 and 8,000
    # iterations to go. Their sizes maximise the sum of (1 / T)^0.5, T a job's time to
    # go there plus the 90 s margin (a start costs nothing here): the short one wider.
    speedup = {w: round(w**-0.6, 4) for w in range(1, 9)}

    def adaptive(iterations: int, batches: bool = True) -> JobModel:
        return JobModel(
            iterations_total=iterations,
            workers=1,
            steps={w: {1: (step, 0.0)} for w, step in speedup.items()},
            batches={w: {1: 64 * w} for w in speedup} if batches else {},
        )

    def rate_sum(split: tuple[int, int]) -> float:
        return sum(
            (1 / (iterations * speedup[w] + 90.0)) ** 0.5
            for iterations, w in zip((1000, 8000), split, strict=True)
        )

    def sizes(
        *jobs: JobView, params: JigsawParams = jigsaw.DEFAULTS, gpus: int = 8
    ) -> list[tuple[int, int]]:
        plan = jigsaw.schedule(snap(nodes(1, gpus), *jobs), params)
        return [(p.job_id, len(p.gpu_ids)) for p in plan.start]

    short, long = job(1, 1, adaptive(1000)), job(2, 1, adaptive(8000))
    assert max(((a, 8 - a) for a in range(1, 8)), key=rate_sum) == (6, 2)
    assert sizes(short, long) == [(1, 6), (2, 2)]
    # Past `fluid_max_cells` jobs x GPUs (2 x 8) the relaxation finds the same sizes.
    assert sizes(short, long, params=JigsawParams(fluid_max_cells=15)) == [(1, 6), (2, 2)]
    # Otherwise the order decides: the short job grows to its fastest size beside the
    # long one's request. So under load (`fluid_load` 0 here), where the jobs'
    # priorities differ, and for jobs of a fixed batch.
    grown = [(1, 7), (2, 1)]
    assert sizes(short, long, params=JigsawParams(fluid_load=0)) == grown
    assert sizes(short, replace(long, priority=-1)) == grown
    fixed = job(1, 1, adaptive(1000, batches=False)), job(2, 1, adaptive(8000, batches=False))
    assert sizes(*fixed) == grown
    # The sum is myopic about the jobs it leaves waiting, so its sizes must end the
    # jobs no later on average: two that ask for 4 GPUs of 4 and take 1,000 s there
    # and 1,560 s on 2 end at 1,000 and 2,000 s one after the other, sooner than both
    # at 1,560 s on 2 (the sum's choice); at 1,400 s on 2, both start at once.
    for on_two, started in ((1.56, [(1, 4)]), (1.4, [(1, 2), (2, 2)])):
        steps = {4: {1: (1.0, 0.0)}, 2: {1: (on_two, 0.0)}}
        burst = [
            job(i, 4, JobModel(1000, 4, steps, batches={4: {1: 256}, 2: {1: 128}})) for i in (1, 2)
        ]
        assert sizes(*burst, gpus=4) == started


def test_at_light_load_a_long_job_lends_gpus_to_a_short_one_for_the_round() -> None:
    # Two adaptive jobs run on 4 GPUs each of 8: a short one (5,000 iterations at
    # w^-0.9 s: 1,436 s to go on 4, 997 on 6) and a long one (50,000 at w^-0.6: 21,765 s
    # on 4, 32,990 on 2). The fluid sum prefers 6 and 2 (a move charged the 90 s
    # margin: 0.0303 + 0.0055 against 0.0264 + 0.0068). Held to their ends those sizes
    # would end the two later on average (997 + 32,990 s against 1,436 + 21,765), which
    # the completion sum used to refuse them for; but the same jobs run either way and
    # every round sizes them again: the long job has its GPUs back once the short one
    # ends.
    def adaptive(iterations: int, exponent: float) -> JobModel:
        speedup = {w: round(w**-exponent, 4) for w in (1, 2, 4, 6, 8)}
        return JobModel(
            iterations_total=iterations,
            workers=4,
            steps={w: {1: (step, 0.0)} for w, step in speedup.items()},
            batches={w: {1: 64 * w} for w in speedup},
        )

    short = job(1, 4, adaptive(5000, 0.9), state=JobState.RUNNING, gpus=(100, 101, 102, 103))
    long = job(2, 4, adaptive(50_000, 0.6), state=JobState.RUNNING, gpus=(104, 105, 106, 107))
    plan = jigsaw.schedule(snap(nodes(1, 8, held={100 + i: 1 for i in range(8)}), short, long))
    assert sorted((p.job_id, len(p.gpu_ids)) for p in plan.start) == [(1, 6), (2, 2)]
    # The short job keeps its GPUs and grows around them.
    grown = next(p for p in plan.start if p.job_id == 1)
    assert set(short.allocated_gpu_ids) <= set(grown.gpu_ids)


def test_a_crowded_cluster_queues_jobs_when_shrinking_all_would_end_them_later() -> None:
    # Two jobs ask for 4 GPUs of 4 and run 1,000 iterations at 1 s on 4, 1.56 s on 2
    # (78% of 2's progress per GPU on 4). Shrinking both to 2 (the 0.8 floor, the only
    # one under which both fit) ends both at 1,560 s; one after the other on 4 they
    # end at 1,000 and 2,000 s: sooner on average, so one waits.
    jobs = [job(i, 4, model(4, 1000, sizes={2: 1.56})) for i in (1, 2)]
    plan = jigsaw.schedule(snap(nodes(1, 4), *jobs))
    assert [(p.job_id, len(p.gpu_ids)) for p in plan.start] == [(1, 4)]
    # At 1.4 s on 2 GPUs (89% per GPU on 4), both at once end at 1,400 s: both start.
    jobs = [job(i, 4, model(4, 1000, sizes={2: 1.4})) for i in (1, 2)]
    plan = jigsaw.schedule(snap(nodes(1, 4), *jobs))
    assert [(p.job_id, len(p.gpu_ids)) for p in plan.start] == [(1, 2), (2, 2)]


def test_a_burst_that_scales_poorly_per_gpu_but_well_in_time_runs_one_after_another() -> None:
    # Two jobs ask for 4 GPUs of 4 and run 1,000 iterations at 1 s on 1 GPU, 0.95 s
    # on 2 (53% of 1's progress per GPU) and 0.55 s on 4 (45%): an adaptive job whose
    # batch grows with its GPUs. Both at once on 2 end at 950 s, on 1 at 1,000 s; one
    # after the other on 4 at 550 and 1,100 s, sooner on average: the low floor's
    # choice, which a floor of 0.5 (sizes of 2) would not offer.
    jobs = [job(i, 4, model(4, 1000, step=0.55, sizes={1: 1.0, 2: 0.95})) for i in (1, 2)]
    plan = jigsaw.schedule(snap(nodes(1, 4), *jobs))
    assert [(p.job_id, len(p.gpu_ids)) for p in plan.start] == [(1, 4)]
    floored = JigsawParams(efficiency_floors=(0.5, 0.7, 0.8))
    plan = jigsaw.schedule(snap(nodes(1, 4), *jobs), floored)
    assert [(p.job_id, len(p.gpu_ids)) for p in plan.start] == [(1, 2), (2, 2)]


def test_the_predicted_completion_sum_starts_jobs_in_order_as_gpus_free() -> None:
    # 4 GPUs: two 2-GPU jobs of 100 s end at 100. The 4-GPU job of 50 s is next but
    # does not fit until all 4 are free; the 1-GPU job behind it fills in at 100 (as
    # admission lets a later job fill in), ends at 110, and the 4-GPU job runs 110-160.
    rule = sizing.Sizing(per_node=4, floor=0.0, long_seconds=3600.0, long_floor=0.0)
    ordered = [
        job(1, 2, model(2, 100)),
        job(2, 2, model(2, 100)),
        job(3, 4, model(4, 50)),
        job(4, 1, model(1, 10)),
    ]
    assert sizing.completion_sum(ordered, rule, capacity=4) == 100 + 100 + 110 + 160
    # With 5 GPUs the 1-GPU job starts at once beside the first two.
    assert sizing.completion_sum(ordered, rule, capacity=5) == 100 + 100 + 10 + 150


def test_a_long_job_is_sized_for_efficiency_when_the_cluster_is_crowded() -> None:
    # Both ask for 4 GPUs and run 1.7 s per iteration on 2 (85% of 4's progress per
    # GPU: above the 0.8 floor). The short one (1,000 s to go) keeps 4; the long one
    # (10,000 s) gets the 2 GPUs it uses best, which lets it start beside the others
    # instead of waiting for 4.
    short = job(1, 4, model(4, 1000, sizes={2: 1.7}))
    long = job(2, 4, model(4, 10_000, sizes={2: 1.7}))
    small = job(3, 2, model(2, 100))
    cluster = nodes(1, 8)
    plan = jigsaw.schedule(snap(cluster, short, long, small))
    assert {p.job_id: len(p.gpu_ids) for p in plan.start} == {1: 4, 2: 2, 3: 2}
    # Without the long-job floor it asks for 4 like the short one and waits.
    plan = jigsaw.schedule(snap(cluster, short, long, small), JigsawParams(long_job_floor=0.0))
    assert {p.job_id: len(p.gpu_ids) for p in plan.start} == {1: 4, 3: 2}


def test_the_job_that_costs_the_cluster_least_to_finish_goes_first() -> None:
    # 60 s on all 8 GPUs against 100 s on one: the narrow job needs 100 GPU-seconds,
    # the wide one 480, so the narrow one goes first (shortest time first would not).
    wide = job(1, 8, model(8, 60))
    narrow = job(2, 1, model(1, 100))
    plan = jigsaw.schedule(snap(nodes(1, 8), wide, narrow))
    assert [p.job_id for p in plan.start] == [2]


def test_a_job_that_would_set_the_makespan_starts_ahead_of_longer_queues() -> None:
    # Two GPUs; a 4,000 s job that runs on one GPU only, and three 1,200 s jobs. The
    # cluster needs 3,800 s at least for all of them, which the long job cannot beat:
    # started last (least GPU-time first) it ends at 5,200 s, started now at 4,000 s.
    long = job(1, 1, model(1, 4000))
    shorts = [job(i, 1, model(1, 1200)) for i in (2, 3, 4)]
    cluster = nodes(1, 2)
    plan = jigsaw.schedule(snap(cluster, long, *shorts))
    assert sorted(p.job_id for p in plan.start) == [1, 2]
    plan = jigsaw.schedule(snap(cluster, long, *shorts), JigsawParams(straggler_drain=0.0))
    assert sorted(p.job_id for p in plan.start) == [2, 3]
    # With more short work queued the cluster needs longer than the job: no hurry.
    more = [*shorts, job(5, 1, model(1, 1200))]
    assert sorted(p.job_id for p in jigsaw.schedule(snap(cluster, long, *more)).start) == [2, 3]


def _long(job_id: int, iterations: int, gpus: tuple[int, ...] = ()) -> JobView:
    """The pacing tests' long job: 0.45 s an iteration on 8 GPUs, 0.6 on 4, 1.0 on 2."""
    state = JobState.RUNNING if gpus else JobState.QUEUED
    return job(
        job_id, 8, model(8, iterations, step=0.45, sizes={2: 1.0, 4: 0.6}), state=state, gpus=gpus
    )


# The slack the paced widths in these tests are worked out at (the default is larger).
PACED_AT_10 = JigsawParams(pace_slack=0.1)
# Long enough without submissions for pacing to start (`pace_after_seconds`).
QUIET = timedelta(seconds=JigsawParams().pace_after_seconds + 60)


def test_once_submissions_stop_the_job_that_would_set_the_makespan_is_paced() -> None:
    # Eight GPUs; eight 3,000 s one-GPU jobs and a 20,000-iteration job that scales
    # badly (9,000 s on 8 GPUs, 12,000 s on 4, 20,000 s on 2). Short jobs first ends
    # at 12,000 s: the long job starts when they are done. No schedule ends before
    # 10,500 s (`scheduler.core.makespan`), which the long job meets only if it starts now,
    # on 5.7 GPUs on average: it is paced on 4 (its largest size below that), the short
    # jobs share the rest, and it grows to 8 once they are done (10,500 s). Paced to
    # 10% past the bound, it needs 4.5 on average: 4 still.
    shorts = [job(i, 1, model(1, 3000)) for i in range(2, 10)]
    batch = snap(nodes(1, 8), _long(1, 20_000), *shorts)
    quiet = replace(batch, last_submitted_at=NOW - QUIET)
    on_four = {1: 4, 2: 1, 3: 1, 4: 1, 5: 1}
    for params in (JigsawParams(pace_slack=0.0), PACED_AT_10):
        plan = jigsaw.schedule(quiet, params)
        assert {p.job_id: len(p.gpu_ids) for p in plan.start} == on_four
    # 20% past it (12,600 s; the default slack), 3.8 on average: it is paced on 2, six
    # short jobs beside.
    plan = jigsaw.schedule(quiet)
    assert {p.job_id: len(p.gpu_ids) for p in plan.start} == {1: 2} | {i: 1 for i in range(2, 8)}
    # While jobs are still being submitted, or when the snapshot does not say, shorter
    # jobs first: a stream of them would otherwise wait behind every long job.
    shortest_first = {i: 1 for i in range(2, 10)}
    recent = replace(quiet, last_submitted_at=NOW - QUIET + timedelta(minutes=2))
    for unknown_or_recent in (batch, recent):
        plan = jigsaw.schedule(unknown_or_recent)
        assert {p.job_id: len(p.gpu_ids) for p in plan.start} == shortest_first
    plan = jigsaw.schedule(quiet, JigsawParams(pace_after_seconds=float("inf")))
    assert {p.job_id: len(p.gpu_ids) for p in plan.start} == shortest_first


def test_a_paced_job_keeps_a_size_between_the_sizes_around_its_width() -> None:
    # The paced test's batch with the long job already running on all 8 GPUs: it needs
    # 5.7 on average, between its sizes 4 and 8, so it stays (moved down to 4 it would
    # be moved up again as soon as it fell behind: a restart every few leases).
    busy = nodes(1, 8, held={100 + g: 1 for g in range(8)})
    running = _long(1, 20_000, gpus=tuple(range(100, 108)))
    shorts = [job(i, 1, model(1, 3000)) for i in range(2, 10)]
    quiet = replace(snap(busy, running, *shorts), last_submitted_at=NOW - QUIET)
    plan = jigsaw.schedule(quiet, PACED_AT_10)
    assert (plan.start, plan.suspend) == ((), ())


def test_paced_jobs_keep_their_sizes_only_as_far_as_the_gpus_go() -> None:
    # Twelve GPUs; three long jobs run on 4 each, a fourth waits, and four short ones.
    # Finishing everything takes 16,875 s at least, by which each long job needs 2.6 to
    # 3.1 GPUs on average: each is paced on 2 and may keep 4. Their 2 each leave 4
    # GPUs, for the two with the most to go to keep 4; the third moves to 2, and the
    # fourth starts on 2, rather than the three keeping 12 and the fourth waiting.
    busy = nodes(1, 12, held={100 + g: 1 for g in range(12)})
    held = [tuple(range(100 + 4 * k, 104 + 4 * k)) for k in range(3)]
    longs = [_long(k + 1, 20_000 + 1000 * k, gpus=held[k]) for k in range(3)]
    waiting = _long(4, 23_000)
    shorts = [job(i, 1, model(1, 3000)) for i in range(5, 9)]
    batch = snap(busy, *longs, waiting, *shorts)
    plan = jigsaw.schedule(replace(batch, last_submitted_at=NOW - QUIET), PACED_AT_10)
    assert plan.suspend == (1,)
    assert {p.job_id: len(p.gpu_ids) for p in plan.start} == {1: 2, 4: 2}


def test_idle_gpus_grow_a_job_to_the_size_that_finishes_it_soonest() -> None:
    # Asked for 2 GPUs; on 4 it is faster, on 8 slower again (synchronisation-bound):
    # alone on a node of 8 it starts on 4.
    growable = model(2, 1000, sizes={1: 1.8, 4: 0.6, 8: 0.7})
    plan = jigsaw.schedule(snap(nodes(1, 8), job(1, 2, growable)))
    assert [len(p.gpu_ids) for p in plan.start] == [4]


def test_a_long_job_grows_only_as_far_as_it_uses_gpus_well_before_others_grow() -> None:
    # Six idle GPUs. The long job (20,000 s to go on 2) goes first and would finish
    # soonest on 8, at 62% of its best progress per GPU; it takes 4 (91%) and the short
    # job (12,000 s on 4, 83% of its best on 8) grows into the rest.
    long = job(1, 2, model(2, 20_000, sizes={4: 0.55, 8: 0.4}))
    short = job(2, 4, model(4, 12_000, sizes={8: 0.6}))
    plan = jigsaw.schedule(snap(nodes(1, 12), long, short))
    assert {p.job_id: len(p.gpu_ids) for p in plan.start} == {1: 4, 2: 8}
    # Without the floor the long job takes every idle GPU.
    plan = jigsaw.schedule(snap(nodes(1, 12), long, short), JigsawParams(grow_floor=0.0))
    assert {p.job_id: len(p.gpu_ids) for p in plan.start} == {1: 8, 2: 4}
    # Alone, it still grows as far as finishing sooner goes.
    plan = jigsaw.schedule(snap(nodes(1, 12), long))
    assert [len(p.gpu_ids) for p in plan.start] == [8]


def test_jobs_that_will_run_until_the_cluster_drains_grow_longest_first() -> None:
    # Six GPUs, two jobs on 2 each that run twice as fast on 4 (20,000 and 30,000 s to
    # go on 2), room for one to grow. Both need a large share of the 16,700 s the
    # cluster needs for all its work, so they run to the end: the longer grows and
    # they end at 15,000 and 17,500 s. Least GPU-time first would grow the shorter
    # and leave the longer alone at the end (10,000 and 20,000 s).
    shorter = job(1, 2, model(2, 20_000, sizes={4: 0.5}))
    longer = job(2, 2, model(2, 30_000, sizes={4: 0.5}))
    plan = jigsaw.schedule(snap(nodes(1, 6), shorter, longer))
    assert {p.job_id: len(p.gpu_ids) for p in plan.start} == {1: 2, 2: 4}
    plan = jigsaw.schedule(snap(nodes(1, 6), shorter, longer), JigsawParams(tail_share=0.0))
    assert {p.job_id: len(p.gpu_ids) for p in plan.start} == {1: 4, 2: 2}


def test_a_job_does_not_grow_onto_gpus_spread_over_nodes_that_slow_it() -> None:
    # One GPU free on each of two nodes: 2 GPUs on one node would be faster than 1,
    # across the two nodes slower, so the job stays on one.
    spread = JobModel(
        iterations_total=1000,
        workers=1,
        steps={1: {1: (1.0, 0.0)}, 2: {1: (0.6, 0.0), 2: (1.5, 0.0)}},
    )
    busy = {g: 3 for g in (100, 101, 102)} | {g: 4 for g in (200, 201, 202)}
    plan = jigsaw.schedule(
        snap(
            nodes(2, 4, held=busy),
            job(3, 3, model(3, 100_000), state=JobState.RUNNING, gpus=(100, 101, 102)),
            job(4, 3, model(3, 100_000), state=JobState.RUNNING, gpus=(200, 201, 202)),
            job(5, 1, spread),
        )
    )
    assert [(p.job_id, len(p.gpu_ids)) for p in plan.start] == [(5, 1)]
    assert plan.suspend == ()


def test_a_gang_spread_over_nodes_moves_to_fewer_nodes_where_that_is_faster() -> None:
    # Grown onto scattered GPUs, the job runs 4 workers over two nodes at 1.5 s per
    # iteration; 2 on one node take 0.8 s, 4 on one node 0.5 s.
    gathers = JobModel(
        iterations_total=10_000,
        workers=4,
        steps={4: {1: (0.5, 0.0), 2: (1.5, 0.0)}, 2: {1: (0.8, 0.0), 2: (1.5, 0.0)}},
    )
    # No node has room for all four: it moves to two GPUs of one node.
    plan = jigsaw.schedule(_spread_over_two_nodes(gathers, node_count=2))
    assert plan.suspend == (1,)
    [moved] = plan.start
    assert len(moved.gpu_ids) == 2 and len({g // 100 for g in moved.gpu_ids}) == 1
    # A third node is free: it keeps its four workers, there.
    plan = jigsaw.schedule(_spread_over_two_nodes(gathers, node_count=3))
    assert [p.gpu_ids for p in plan.start] == [(300, 301, 302, 303)]


def test_a_gang_spread_over_nodes_gathers_at_its_size_once_a_node_is_free() -> None:
    # Spread over two nodes when the cluster was full, it runs 4 workers at 1.0 s per
    # iteration; on one node 0.5 s; 2 workers on one node are slower than either (1.2
    # s). A third node has come free: it moves there at its size (before, a gang moved
    # only to another size, and ran spread to its end).
    gathers = JobModel(
        iterations_total=10_000,
        workers=4,
        steps={4: {1: (0.5, 0.0), 2: (1.0, 0.0)}, 2: {1: (1.2, 0.0)}},
    )
    plan = jigsaw.schedule(_spread_over_two_nodes(gathers, node_count=3))
    assert plan.suspend == (1,)
    assert [p.gpu_ids for p in plan.start] == [(300, 301, 302, 303)]
    # With no node free it stays spread: on two nodes it is as few as the free GPUs give.
    assert jigsaw.schedule(_spread_over_two_nodes(gathers, node_count=2)) == Plan()


def _spread_over_two_nodes(gathers: JobModel, node_count: int) -> ClusterSnapshot:
    """Job 1 running 4 workers on two GPUs each of nodes 1 and 2, whose other GPUs two
    long jobs hold; nodes beyond those free."""
    spread = job(1, 4, gathers, state=JobState.RUNNING, gpus=(100, 101, 200, 201))
    others = (
        job(3, 2, model(2, 100_000), state=JobState.RUNNING, gpus=(102, 103)),
        job(4, 2, model(2, 100_000), state=JobState.RUNNING, gpus=(202, 203)),
    )
    held = {100: 1, 101: 1, 200: 1, 201: 1, 102: 3, 103: 3, 202: 4, 203: 4}
    return snap(nodes(node_count, 4, held=held), spread, *others)


def test_a_gang_faster_on_fewer_gpus_shrinks_to_its_first_ones() -> None:
    # It runs on 4 GPUs of one node at 1.0 s per iteration (as measured, say), 0.8 s on
    # 2: its first two GPUs, where the cluster shrinks it in place; an elastic one by a
    # resize; one that would save less than the margin stays.
    narrower = JobModel(
        iterations_total=10_000, workers=4, steps={4: {1: (1.0, 0.0)}, 2: {1: (0.8, 0.0)}}
    )
    compact = job(1, 4, narrower, state=JobState.RUNNING, gpus=(102, 103, 100, 101))
    held = nodes(2, 4, held=dict.fromkeys((100, 101, 102, 103), 1))
    plan = jigsaw.schedule(snap(held, compact))
    assert [(p.job_id, p.gpu_ids) for p in plan.start] == [(1, (102, 103))]
    assert plan.suspend == (1,)
    elastic = replace(compact, sizes=(4, 2, 1))
    assert jigsaw.schedule(snap(held, elastic)).resize == (Resize(1, (102, 103)),)
    close = JobModel(
        iterations_total=10_000, workers=4, steps={4: {1: (1.0, 0.0)}, 2: {1: (0.95, 0.0)}}
    )
    assert jigsaw.schedule(snap(held, replace(compact, model=close))) == Plan()


def test_a_running_job_near_its_end_grows_when_that_saves_a_share_of_what_it_has_left() -> None:
    # 1,000 s to go on 2 GPUs, 450 s on 4: growing saves 550 s, less than the 600 s a
    # long job must save to move, but more than half of what this one has left.
    def running(iterations: int) -> JobView:
        near_end = model(2, iterations, sizes={4: 0.45})
        return job(1, 2, near_end, state=JobState.RUNNING, gpus=(100, 101))

    held = nodes(1, 4, held={100: 1, 101: 1})
    plan = jigsaw.schedule(snap(held, running(1000)))
    assert [(p.job_id, len(p.gpu_ids)) for p in plan.start] == [(1, 4)]
    assert plan.suspend == (1,)
    # With 10,000 s to go the 5,500 s saving is worth the move too; with 1,000 s and
    # the share above 55% (or none), 550 s is not.
    assert [len(p.gpu_ids) for p in jigsaw.schedule(snap(held, running(10_000))).start] == [4]
    for share in (0.6, 1.0):
        strict = JigsawParams(min_grow_share=share)
        assert jigsaw.schedule(snap(held, running(1000)), strict) == Plan()


def test_a_running_job_grows_where_it_runs_when_it_fits_there() -> None:
    # On GPU 100 with three more free on its node; node 2 has two free GPUs, the best
    # fit for a gang of 2, but growing onto its own node is done in place (its process
    # goes on, rank 0's GPU first).
    grows = job(1, 1, model(1, 100_000, sizes={2: 0.5}), state=JobState.RUNNING, gpus=(100,))
    other = job(2, 2, model(2, 100_000), state=JobState.RUNNING, gpus=(200, 201))
    held = nodes(2, 4, held={100: 1, 200: 2, 201: 2})
    plan = jigsaw.schedule(snap(held, grows, other))
    assert [(p.job_id, p.gpu_ids) for p in plan.start] == [(1, (100, 101))]
    assert plan.suspend == (1,)


def test_a_growth_in_place_is_charged_what_growths_in_place_cost() -> None:
    # 60 s to go on 2 GPUs, 27 s on 4: growing saves 33 s, more than half of what is
    # left, but not what a 40 s restart costs; growing in place, measured at 2 s, is
    # worth it where it fits (its own node), not onto another node.
    def running(grow_seconds: float | None) -> JobView:
        near_end = model(2, 60, sizes={4: 0.45})
        view = job(1, 2, near_end, state=JobState.RUNNING, gpus=(100, 101))
        return replace(view, resize_seconds=40.0, grow_seconds=grow_seconds)

    room = nodes(1, 4, held={100: 1, 101: 1})
    assert jigsaw.schedule(snap(room, running(None))) == Plan()
    plan = jigsaw.schedule(snap(room, running(2.0)))
    assert [(p.job_id, p.gpu_ids) for p in plan.start] == [(1, (100, 101, 102, 103))]
    elsewhere = nodes(2, 4, held={100: 1, 101: 1, 102: 2, 103: 2})
    other = job(2, 2, model(2, 100_000), state=JobState.RUNNING, gpus=(102, 103))
    assert jigsaw.schedule(snap(elsewhere, running(2.0), other)).start == ()


def test_a_grown_job_shrinks_back_for_a_newcomer_instead_of_being_suspended() -> None:
    grown = job(
        1,
        2,
        model(2, 100_000, sizes={4: 0.6}),
        state=JobState.RUNNING,
        gpus=(100, 101, 102, 103),
    )
    newcomer = job(2, 2, model(2, 10))
    plan = jigsaw.schedule(
        snap(nodes(1, 4, held=dict.fromkeys(range(100, 104), 1)), grown, newcomer)
    )
    assert sorted((p.job_id, len(p.gpu_ids)) for p in plan.start) == [(1, 2), (2, 2)]
    assert plan.suspend == (1,)  # the loop stops it where it ran and restarts it on 2


def test_without_a_speed_model_it_neither_packs_nor_reconfigures() -> None:
    running = job(1, 2, None, state=JobState.RUNNING, gpus=(100, 101))
    plan = jigsaw.schedule(snap(nodes(1, 2, held={100: 1, 101: 1}), running, job(2, 1, None)))
    assert plan == Plan()


def test_a_spec_that_fixes_spb_or_turns_it_off_is_never_changed() -> None:
    """Only `auto` (or a trace's job, which carries no setting) is the policy's to
    choose: a running job whose spec says off stays off where SPB would pay, and one
    with a fixed configuration keeps it where off would pay."""
    heavy = model(2, 1000, step=2.0, sync=1.5, spb=profile(bottom_parameters=1 << 28))
    light = model(2, 1000, step=2.0, sync=0.0, spb=profile())
    running = {"state": JobState.RUNNING, "gpus": (100, 101)}
    off = replace(job(1, 2, heavy, **running), spb_setting="off")
    fixed = replace(job(1, 2, light, spb=as_json(HALF), **running), spb_setting=HALF)
    for held in (off, fixed):
        assert jigsaw.schedule(snap(nodes(1, 2), held)).reconfigure == ()
    # The same jobs left to the policy are switched.
    auto = replace(off, spb_setting="auto")
    assert jigsaw.schedule(snap(nodes(1, 2), auto)).reconfigure == (Reconfigure(1, as_json(HALF)),)
    chosen = replace(fixed, spb_setting="auto")
    assert jigsaw.schedule(snap(nodes(1, 2), chosen)).reconfigure == (Reconfigure(1, {}),)


def test_its_parameters_reach_it_from_the_settings_and_the_simulator_alike(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One generic path: `get_policy(name, params)`, the params from the live cluster's
    `JIGSAW_SCHEDULER_JIGSAW_*` section or from a simulation's options."""
    short = job(1, 4, model(4, 1000, sizes={2: 1.7}))
    long = job(2, 4, model(4, 10_000, sizes={2: 1.7}))
    crowded = snap(nodes(1, 8), short, long, job(3, 2, model(2, 100)))
    monkeypatch.setenv("JIGSAW_SCHEDULER_JIGSAW_LONG_JOB_FLOOR", "0")
    monkeypatch.setenv("JIGSAW_SCHEDULER_JIGSAW_EFFICIENCY_FLOORS", "[0.5, 0.7, 0.8]")
    settings = SchedulerSettings(policy="jigsaw")
    params = settings.policy_params(settings.policy)
    assert isinstance(params, JigsawParams)
    assert (params.long_job_floor, params.efficiency_floors) == (0.0, (0.5, 0.7, 0.8))
    plan = get_policy("jigsaw", params)(crowded)
    assert {p.job_id: len(p.gpu_ids) for p in plan.start} == {1: 4, 3: 2}  # as unfloored
    assert {p.job_id: len(p.gpu_ids) for p in jigsaw.schedule(crowded).start}[2] == 2

    simulated = policy_params("jigsaw", sharing=Sharing.MPS, round_seconds=60.0)
    assert simulated == JigsawParams(sharing=Sharing.MPS)
    assert policy_params("fifo", sharing=Sharing.MPS) is None
    assert settings.policy_params("fifo") is None


def test_bad_parameters_are_refused_with_the_field_named(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValidationError, match="efficiency_floors"):
        JigsawParams(efficiency_floors=(1.5,))
    with pytest.raises(ValidationError, match="stickiness"):
        JigsawParams(stickiness=0.0)
    with pytest.raises(ValidationError, match="configs"):
        JigsawParams(configs=())
    with pytest.raises(ValueError, match="takes JigsawParams"):
        get_policy("jigsaw", HALF)
    with pytest.raises(ValueError, match="takes no parameters"):
        get_policy("fifo", JigsawParams())
    monkeypatch.setenv("JIGSAW_SCHEDULER_JIGSAW_MAX_GUESTS", "-1")
    with pytest.raises(ValidationError, match="max_guests"):
        SchedulerSettings()


def test_the_co_location_rule_is_the_measured_interference_model() -> None:
    """What JigSaw predicts and the simulator charges for a shared GPU is the fitted
    model's stretch of each job, fed the workers' solo utilizations; two workers of one
    job there are one co-runner at their summed utilization."""
    h100 = fitted().get("h100")
    assert colocation_stretch([(1, 0.3), (2, 0.45)], h100) == dict(
        zip((1, 2), h100.stretch([0.3, 0.45]), strict=True)
    )
    assert colocation_stretch([(1, 0.3), (1, 0.2), (2, 0.45)], h100) == dict(
        zip((1, 2), h100.stretch([0.5, 0.45]), strict=True)
    )
    assert colocation_stretch([(1, 0.9)], h100) == {1: 1.0}
    # Not measured: taken as saturating the GPU.
    assert colocation_stretch([(1, None), (2, 0.2)], h100) == dict(
        zip((1, 2), h100.stretch([1.0, 0.2]), strict=True)
    )
    # A shape's worker utilization is busy-while-computing times its compute share.
    shape = model(1, 10, step=2.0, sync=1.0, utilization=0.3).shape(None, 1)
    assert shape.utilizations == (pytest.approx(0.3),)
    assert shape.intensity == pytest.approx(0.6)


def _one_gpu_pair(
    host_utilization: float | None, guest_utilization: float | None, host_cap: int | None = None
) -> Plan:
    """A 1-GPU job running alone on a 1-GPU cluster (16 GiB; it needs 4, and may use
    `host_cap`), and a 1-GPU job waiting."""
    host = job(
        1,
        1,
        model(1, 10_000, step=1.0, utilization=host_utilization),
        state=JobState.RUNNING,
        gpus=(100,),
        arrived=600,
    )
    guest = job(2, 1, model(1, 10_000, step=1.0, utilization=guest_utilization))
    host = replace(host, memory_cap_bytes=host_cap)
    return jigsaw.schedule(snap(nodes(1, 1, held={100: 1}), host, guest))


def test_jobs_that_underuse_a_gpu_share_it() -> None:
    assert _one_gpu_pair(0.3, 0.3).start == (Placement(2, (100,), {}),)


def test_a_gpu_takes_as_many_jobs_as_its_agent_runs_at_once() -> None:
    """Idle 1-GPU jobs (utilization 0.1, 4 GiB of a 16 GiB GPU): one guest joins a GPU
    each round, up to the jobs its agent runs at once (`GPUView.max_jobs`), which
    memory allows here (4 x 4 GiB)."""

    def rounds(max_jobs: int) -> list[int]:
        """How many jobs share the GPU after each round, from one job running."""
        cluster = nodes(1, 1)
        (node,) = cluster
        jobs = {
            i: job(i, 1, model(1, 10_000, utilization=0.1), arrived=600 - i) for i in range(1, 6)
        }
        jobs[1] = replace(jobs[1], state=JobState.RUNNING, allocated_gpu_ids=(100,))
        counts = []
        for _ in range(4):
            on = tuple(i for i, j in jobs.items() if j.allocated_gpu_ids)
            gpu = replace(node.gpus[0], max_jobs=max_jobs, holders=on)
            view = replace(node, gpus=(gpu,))
            plan = jigsaw.schedule(snap((view,), *jobs.values()))
            for placement in plan.start:
                jobs[placement.job_id] = replace(
                    jobs[placement.job_id],
                    state=JobState.RUNNING,
                    allocated_gpu_ids=placement.gpu_ids,
                )
            counts.append(sum(1 for j in jobs.values() if j.allocated_gpu_ids))
        return counts

    assert rounds(2) == [2, 2, 2, 2]
    assert rounds(3) == [2, 3, 3, 3]
    assert rounds(4) == [2, 3, 4, 4]  # a fifth would not fit in memory


def test_no_guest_joins_a_host_whose_cap_leaves_it_no_room() -> None:
    # Launched before it reported, the host may fill its GPU: its agent would refuse.
    assert _one_gpu_pair(0.3, 0.3, host_cap=16 * GIB).start == ()
    # Lowered to what it has shown it needs, there is room again.
    assert _one_gpu_pair(0.3, 0.3, host_cap=5 * GIB).start == (Placement(2, (100,), {}),)


def test_nothing_is_packed_on_a_gpu_one_job_saturates() -> None:
    # The model predicts a loss for any guest beside a saturated job, however light.
    assert fitted().get("v100").speeds([1.0, 0.1])[0] < 0.5
    assert _one_gpu_pair(1.0, 0.1) == Plan()


def test_a_job_with_no_measured_utilization_is_neither_guest_nor_host() -> None:
    assert _one_gpu_pair(0.3, None) == Plan()
    assert _one_gpu_pair(None, 0.3) == Plan()


def _packed(
    host_utilization: float,
    guest_utilization: float,
    params: JigsawParams,
    measured: float | None = None,
    iterations: int = 10_000,
    start: float | None = None,
) -> Plan:
    """A guest already running beside its host on the host's only GPU, both `iterations`
    of 1 s long; `measured`: the host's slowdown beside it as the cluster measured it;
    `start`: what starting a job costs."""
    host = replace(
        job(
            1,
            1,
            model(1, iterations, utilization=host_utilization),
            state=JobState.RUNNING,
            gpus=(100,),
            arrived=600,
        ),
        colocated_slowdown=measured,
        start_seconds=start,
    )
    guest = replace(
        job(
            2,
            1,
            model(1, iterations, utilization=guest_utilization),
            state=JobState.RUNNING,
            gpus=(100,),
        ),
        start_seconds=start,
    )
    (node,) = nodes(1, 1, held={100: 1})
    shared = replace(node, gpus=(replace(node.gpus[0], holders=(1, 2)),))
    return jigsaw.schedule(snap((shared,), host, guest), params)


def test_a_guest_yields_when_its_host_slows_past_the_bound() -> None:
    # Busier co-runners (say, the measured utilization rose): the host's predicted
    # slowdown on the V100 fit.
    bound = JigsawParams().yield_slowdown
    slowdown = fitted().get("v100").stretch([0.5, 0.5])[0]
    assert bound < slowdown < 1.5
    assert _packed(0.5, 0.5, JigsawParams()).suspend == (2,)
    assert _packed(0.5, 0.5, JigsawParams(yield_slowdown=1.5)) == Plan()
    # Light jobs stay together under the default bound.
    assert fitted().get("v100").stretch([0.1, 0.1])[0] < bound
    assert _packed(0.1, 0.1, JigsawParams()) == Plan()


def test_a_guest_yields_when_its_host_s_measured_slowdown_passes_the_bound() -> None:
    """On the cluster the host's measured slowdown beside the guest decides, where it
    has one: light jobs the model keeps together part when they were measured to slow
    the host past the bound, and busy ones it would part stay when measured not to."""
    bound = JigsawParams().yield_slowdown
    assert _packed(0.1, 0.1, JigsawParams()) == Plan()
    assert _packed(0.1, 0.1, JigsawParams(), measured=bound + 0.05).suspend == (2,)
    assert _packed(0.5, 0.5, JigsawParams()).suspend == (2,)
    assert _packed(0.5, 0.5, JigsawParams(), measured=bound - 0.05) == Plan()


def test_a_guest_stays_where_moving_it_costs_more_than_its_host_loses() -> None:
    """Jobs of seconds: 0.25 s lost per second shared, for 100 s, against a 30 s
    restart (measured on an H200: short jobs each restarted for a 1.2x slowdown)."""
    slowed = JigsawParams().yield_slowdown + 0.1
    assert _packed(0.1, 0.1, JigsawParams(), slowed, iterations=100, start=30.0) == Plan()
    long_pair = _packed(0.1, 0.1, JigsawParams(), slowed, iterations=1000, start=30.0)
    assert long_pair.suspend == (2,)


def test_no_guest_joins_a_host_measured_past_the_bound_beside_its_last_co_runners() -> None:
    """Else a guest that just yielded would be packed there again the next round."""
    bound = JigsawParams().yield_slowdown
    host = job(
        1, 1, model(1, 10_000, utilization=0.3), state=JobState.RUNNING, gpus=(100,), arrived=600
    )
    guest = job(2, 1, model(1, 10_000, utilization=0.3))
    cluster = nodes(1, 1, held={100: 1})
    assert jigsaw.schedule(snap(cluster, host, guest)).start == (Placement(2, (100,), {}),)
    for measured, packed in ((bound + 0.05, False), (bound - 0.05, True)):
        slowed = replace(host, colocated_slowdown=measured)
        assert bool(jigsaw.schedule(snap(cluster, slowed, guest)).start) is packed


def test_jigsaw_is_the_default_policy_of_the_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JIGSAW_SCHEDULER_POLICY", raising=False)
    assert SchedulerSettings().policy == "jigsaw"
