"""JigSaw moves a running elastic job by the plan's `Resize` (the live cluster's
checkpoint-restart), charges the move's measured cost, and gives an adaptive job the
batch its model chose, changing a running one's where it is once that is far enough from
the batch it reports; other moved jobs are suspended and started again."""

from __future__ import annotations

from dataclasses import replace

from scheduler.core.jobmodel import JobModel
from scheduler.core.plan import Placement, Resize
from scheduler.core.states import JobState
from scheduler.policies import jigsaw
from scheduler.policies.jigsaw import JigsawParams
from tests.test_policy_jigsaw import job, model, nodes, snap

NO_MARGIN = JigsawParams(min_grow_saving=0.0)


def running(job_id: int, job_model: JobModel, gpus: tuple[int, ...], *, elastic: bool):
    view = job(job_id, 2, job_model, state=JobState.RUNNING, gpus=gpus)
    return replace(view, sizes=(4, 2, 1) if elastic else ())


def test_a_grown_elastic_job_shrinks_for_a_newcomer_by_a_resize() -> None:
    grown = running(1, model(2, 100_000, sizes={4: 0.6}), (100, 101, 102, 103), elastic=True)
    newcomer = job(2, 2, model(2, 10))
    cluster = nodes(1, 4, held=dict.fromkeys(range(100, 104), 1))
    plan = jigsaw.schedule(snap(cluster, grown, newcomer))
    assert plan.suspend == ()
    assert [(r.job_id, len(r.gpu_ids)) for r in plan.resize] == [(1, 2)]
    assert [(p.job_id, len(p.gpu_ids)) for p in plan.start] == [(2, 2)]
    # Not elastic: the same move is a suspension and a start on 2.
    fixed = replace(grown, sizes=())
    plan = jigsaw.schedule(snap(cluster, fixed, newcomer))
    assert (plan.resize, plan.suspend) == ((), (1,))


def test_an_elastic_job_grows_into_idle_gpus_only_for_more_than_the_move_costs() -> None:
    # 600 iterations left: 600 s on 2 GPUs, 300 s on 4; the move saves 300 s.
    small = running(1, model(2, 1000, sizes={4: 0.5}), (100, 101), elastic=True)
    small = replace(small, iterations_done=400)
    cluster = nodes(1, 4, held={100: 1, 101: 1})
    for cost, grows in ((30.0, True), (299.0, True), (301.0, False), (None, True)):
        plan = jigsaw.schedule(snap(cluster, replace(small, resize_seconds=cost)), NO_MARGIN)
        assert [len(r.gpu_ids) for r in plan.resize] == ([4] if grows else []), cost
        assert (plan.start, plan.suspend) == ((), ())
    # No resize measured yet: a start stands for it (a resize restarts the gang).
    unmeasured = replace(small, resize_seconds=None)
    for start, grows in ((30.0, True), (301.0, False)):
        plan = jigsaw.schedule(snap(cluster, replace(unmeasured, start_seconds=start)), NO_MARGIN)
        assert [len(r.gpu_ids) for r in plan.resize] == ([4] if grows else []), start
    # The margin still holds beside the cost: 300 s saved is not 600.
    plan = jigsaw.schedule(snap(cluster, replace(small, resize_seconds=30.0)))
    assert plan.resize == ()


def test_an_adaptive_job_starts_and_resizes_at_the_batch_its_model_chose() -> None:
    adaptive = JobModel(
        iterations_total=10_000,
        workers=2,
        steps={1: {1: (2.0, 0.0)}, 2: {1: (1.0, 0.1)}, 4: {1: (0.5, 0.1)}},
        batches={1: {1: 64}, 2: {1: 128}, 4: {1: 512}},
    )
    plan = jigsaw.schedule(snap(nodes(1, 2), replace(job(1, 2, adaptive), sizes=(4, 2, 1))))
    assert plan.start == (Placement(1, (100, 101), {}, 128),)
    grown = running(1, adaptive, (100, 101), elastic=True)
    plan = jigsaw.schedule(snap(nodes(1, 4, held={100: 1, 101: 1}), grown))
    assert plan.resize == (Resize(1, plan.resize[0].gpu_ids, 512),)
    assert len(plan.resize[0].gpu_ids) == 4


def test_a_running_adaptive_job_changes_its_batch_where_it_is_for_enough_goodput() -> None:
    """The batch with the most goodput grows with the gradient noise as a job trains:
    a job that stays on its GPUs gets a `Resize` to them at that batch (in place on the
    cluster) once it makes `rebatch_gain` more goodput than its own; below that (goodput
    flat in the batch), or with the gain not known (the simulator's), nothing moves."""

    def adaptive(gain: float) -> JobModel:
        return JobModel(
            iterations_total=10_000,
            workers=2,
            steps={1: {1: (2.0, 0.0)}, 2: {1: (1.0, 0.1)}},
            batches={1: {1: 128}, 2: {1: 256}},
            batch_gain=gain,
        )

    cluster = nodes(1, 2, held={100: 1, 101: 1})
    for gain, rebatched in ((0.5, True), (0.1, True), (0.09, False), (0.0, False)):
        stays = running(1, adaptive(gain), (100, 101), elastic=False)
        plan = jigsaw.schedule(snap(cluster, stays))
        wanted = (Resize(1, (100, 101), 256),) if rebatched else ()
        assert (plan.resize, plan.start, plan.suspend) == (wanted, (), ()), gain
    stays = running(1, adaptive(0.5), (100, 101), elastic=False)
    assert jigsaw.schedule(snap(cluster, stays), JigsawParams(rebatch_gain=0.0)).resize == ()
