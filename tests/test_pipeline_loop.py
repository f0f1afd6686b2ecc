"""Pipeline-parallel jobs (`pipeline` in the spec) in the platform's training loop.

A pipeline computes what one process computes on the whole model: same batches, the
loss a mean over equal microbatches, each stage's update its own. So every schedule on
2 or 4 stages must report the losses and evaluations of the same job on one worker,
and a pipeline suspended and resumed must end where an uninterrupted one ends.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from jigsaw.jobspec import BUILTIN_PIPELINE_STAGES, BUILTIN_WORKLOADS, Hyperparameters
from tests.runtime_helpers import run_gang, worker_configs
from worker_agent.runtime.checkpoint import CHECKPOINT_FILE
from worker_agent.runtime.control import LocalController
from worker_agent.runtime.protocol import Outcome
from worker_agent.runtime.schedules.pipeline import PIPELINE_SCHEDULES
from worker_agent.runtime.trial import TrialContext
from worker_agent.runtime.workloads import BUILTIN_TRIALS

ITERATIONS = 6
_FIELDS: dict[str, Any] = {
    "workload": "text-transformer",
    "hyperparameters": {"batch_size": 16, "learning_rate": 0.003, "optimizer": "adam"},
    "max_iterations": ITERATIONS,
    "eval_every": 4,  # one evaluation in the middle, one at the end
    "seed": 3,
}


def _pipeline(stages: int, schedule: str) -> dict[str, Any]:
    return {"stages": stages, "schedule": schedule, "microbatches": 4}


def _losses(controller: LocalController) -> list[float]:
    assert [r.iteration for r in controller.records] == list(range(1, ITERATIONS + 1))
    return [record.loss for record in controller.records]


def _assert_same_run(pipelined: list[LocalController], one: LocalController) -> None:
    expected = _losses(one)
    assert expected[-1] < expected[0] - 0.5  # it learns: equal losses are not constant ones
    assert _losses(pipelined[0]) == [pytest.approx(x, rel=1e-4) for x in expected]
    # Rank 0 reports for the gang (it receives the last stage's loss).
    assert all(not controller.records for controller in pipelined[1:])
    assert [at for at, _ in pipelined[0].evaluations] == [at for at, _ in one.evaluations]
    for (_, metrics), (_, reference) in zip(pipelined[0].evaluations, one.evaluations, strict=True):
        assert metrics["loss"] == pytest.approx(reference["loss"], rel=1e-4)
    for controller in pipelined:
        assert controller.status is not None and controller.status.outcome is Outcome.SUCCEEDED


@pytest.fixture(scope="module")
def one_worker() -> LocalController:
    return run_gang(worker_configs(1, **_FIELDS))[0]


@pytest.mark.parametrize("schedule", PIPELINE_SCHEDULES)
def test_two_stage_pipeline_job_trains_like_one_worker(
    schedule: str, one_worker: LocalController
) -> None:
    pipelined = run_gang(worker_configs(2, pipeline=_pipeline(2, schedule), **_FIELDS))
    _assert_same_run(pipelined, one_worker)


def test_four_stage_zero_bubble_job_trains_like_one_worker() -> None:
    deep = {**_FIELDS, "workload": "tests.runtime_helpers:DeepTextTransformer"}
    one = run_gang(worker_configs(1, **deep))[0]
    pipelined = run_gang(worker_configs(4, pipeline=_pipeline(4, "zero-bubble"), **deep))
    _assert_same_run(pipelined, one)


def test_suspended_pipeline_resumes_where_an_uninterrupted_one_ends(tmp_path: Path) -> None:
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    fields = {**_FIELDS, "pipeline": _pipeline(2, "zero-bubble")}
    run_gang(worker_configs(2, checkpoint_dir=straight, **fields))

    suspended = run_gang(
        worker_configs(2, checkpoint_dir=interrupted, **fields),
        [LocalController(suspend_at=3), LocalController()],
    )
    assert all(c.status is not None and c.status.outcome is Outcome.SUSPENDED for c in suspended)
    resumed = run_gang(
        worker_configs(2, checkpoint_dir=interrupted, **fields), reverse_spawn_order=True
    )
    assert resumed[0].checks[0] == 3
    assert [r.iteration for r in resumed[0].records] == list(range(4, ITERATIONS + 1))

    expected = torch.load(straight / CHECKPOINT_FILE, weights_only=True)
    actual = torch.load(interrupted / CHECKPOINT_FILE, weights_only=True)
    assert actual["iteration"] == expected["iteration"] == ITERATIONS
    assert "model" not in actual and len(actual["stages"]) == 2
    # Each stage's own parameters and Adam moments, continued exactly.
    for want, got in zip(expected["stages"], actual["stages"], strict=True):
        assert want["model"] and want["model"].keys() == got["model"].keys()
        for name, value in want["model"].items():
            torch.testing.assert_close(got["model"][name], value, rtol=0, atol=0, msg=name)
        for index, moments in want["optimizer"]["state"].items():
            torch.testing.assert_close(
                got["optimizer"]["state"][index]["exp_avg"], moments["exp_avg"], rtol=0, atol=0
            )


def test_a_data_parallel_checkpoint_is_refused_by_a_pipeline(tmp_path: Path) -> None:
    run_gang(worker_configs(2, checkpoint_dir=tmp_path, **{**_FIELDS, "max_iterations": 1}))
    with pytest.raises(AssertionError, match="written by a data-parallel run, this is a pipeline"):
        run_gang(
            worker_configs(2, checkpoint_dir=tmp_path, pipeline=_pipeline(2, "gpipe"), **_FIELDS)
        )


def test_a_trial_without_pipeline_support_fails_with_the_reason() -> None:
    with pytest.raises(AssertionError, match="TinyTrial does not support pipeline parallelism"):
        run_gang(
            worker_configs(
                2,
                workload="tests.runtime_helpers:TinyTrial",
                max_iterations=1,
                pipeline=_pipeline(2, "gpipe"),
            )
        )


def test_builtin_pipeline_stages_match_the_trials() -> None:
    context = TrialContext(Hyperparameters(), 0, 1, torch.device("cpu"), 0)
    for workload in sorted(BUILTIN_WORKLOADS):
        trial = BUILTIN_TRIALS[workload](context)
        model = trial.build_model()
        most = BUILTIN_PIPELINE_STAGES.get(workload)
        if most is None:
            with pytest.raises(NotImplementedError):
                trial.pipeline(model, 2)
            continue
        assert len(trial.pipeline(model, most).parts) == most
        with pytest.raises(ValueError, match="a stage needs at least one block"):
            trial.pipeline(model, most + 1)
