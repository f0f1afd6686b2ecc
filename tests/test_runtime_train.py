"""The training runtime trains: real gloo process groups on localhost."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from jigsaw.jobspec import BUILTIN_WORKLOADS, Hyperparameters
from tests.runtime_helpers import run_gang, worker_configs
from worker_agent.runtime.control import LocalController
from worker_agent.runtime.loop import run_worker
from worker_agent.runtime.protocol import IterationRecord, Outcome
from worker_agent.runtime.trial import TrialContext
from worker_agent.runtime.workloads import BUILTIN_TRIALS, WorkloadError, load_trial


def _assert_sane(records: list[IterationRecord], iterations: int, world_size: int = 1) -> None:
    assert [r.iteration for r in records] == list(range(1, iterations + 1))
    for record in records:
        assert math.isfinite(record.loss)
        assert record.step_seconds > 0 and record.samples_per_second > 0
        assert record.comm_seconds >= 0 and record.compute_seconds >= 0
        assert record.compute_seconds + record.comm_seconds == pytest.approx(record.step_seconds)
        # Wire bytes: a lone worker sends nothing.
        assert (record.bytes_communicated > 0) is (world_size > 1)
        assert record.peak_memory_bytes > 0
        assert record.utilization is not None and record.utilization > 0


def test_builtin_registry_matches_the_job_spec() -> None:
    assert set(BUILTIN_TRIALS) == BUILTIN_WORKLOADS


def test_digits_mlp_on_two_workers_reaches_the_target_accuracy() -> None:
    configs = worker_configs(
        2,
        workload="digits-mlp",
        hyperparameters={"batch_size": 64, "learning_rate": 0.05},
        max_iterations=600,
        target_metric={"name": "accuracy", "value": 0.9},
        eval_every=25,
    )
    rank0, rank1 = run_gang(configs)
    assert rank0.status is not None and rank1.status is not None
    assert rank0.status.outcome is rank1.status.outcome is Outcome.SUCCEEDED
    # The target, not the iteration limit, ended it, at the same boundary on both ranks.
    assert rank0.status.iteration == rank1.status.iteration < 600
    assert rank0.status.metrics["accuracy"] >= 0.9
    _assert_sane(rank0.records, rank0.status.iteration, world_size=2)
    # Control is rank 0's alone: it asked at every boundary, its peer never did.
    assert rank0.checks == list(range(rank0.status.iteration + 1))
    assert rank1.checks == [] and rank1.records == [] and rank1.evaluations == []


def _run_in_process(workload: str, iterations: int, tmp_path: Path) -> LocalController:
    (config,) = worker_configs(
        1,
        workload=workload,
        hyperparameters={"batch_size": 16},
        max_iterations=iterations,
        checkpoint_dir=tmp_path,
    )
    controller = LocalController()
    status = run_worker(config, controller)
    assert status.outcome is Outcome.SUCCEEDED and status.iteration == iterations
    return controller


@pytest.mark.parametrize("workload", sorted(BUILTIN_TRIALS))
def test_every_builtin_workload_trains_and_reports(workload: str, tmp_path: Path) -> None:
    controller = _run_in_process(workload, 3, tmp_path)
    _assert_sane(controller.records, 3)
    # The final evaluation ran and the final checkpoint was written.
    assert controller.evaluations and controller.evaluations[-1][0] == 3
    assert all(math.isfinite(value) for value in controller.evaluations[-1][1].values())
    assert (tmp_path / "checkpoint.pt").exists()


def test_stages_partition_the_model() -> None:
    context = TrialContext(Hyperparameters(), 0, 1, torch.device("cpu"), seed=0)
    for name, trial_class in BUILTIN_TRIALS.items():
        trial = trial_class(context)
        model = trial.build_model()
        staged = {id(p) for stage in trial.stages(model) for p in stage.parameters()}
        assert staged == {id(p) for p in model.parameters()}, name


def test_a_user_trial_runs_by_module_reference(tmp_path: Path) -> None:
    controller = _run_in_process("tests.runtime_helpers:TinyTrial", 5, tmp_path)
    _assert_sane(controller.records, 5)
    assert "mse" in controller.evaluations[-1][1]


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("no-such-workload", "unknown workload"),
        (
            "no_such_package.trials:Trial",
            r"No module named 'no_such_package' .*upload your code with `jigsaw submit --code DIR`",
        ),
        ("tests.runtime_helpers:Missing", "has no attribute 'Missing'"),
        ("tests.runtime_helpers:NotATrial", "not a subclass"),
    ],
)
def test_a_bad_workload_reference_is_a_clear_error(ref: str, message: str) -> None:
    with pytest.raises(WorkloadError, match=message):
        load_trial(ref)


def test_a_failing_worker_tells_its_controller_why(tmp_path: Path) -> None:
    (config,) = worker_configs(1, workload="tests.runtime_helpers:NotATrial", max_iterations=1)
    controller = LocalController()
    with pytest.raises(WorkloadError):
        run_worker(config, controller)
    assert controller.status is not None and controller.status.outcome is Outcome.FAILED
    assert controller.status.error_tail and "not a subclass" in controller.status.error_tail


def test_kfac_is_built_by_the_runtime_not_the_trial() -> None:
    context = TrialContext(Hyperparameters(optimizer="kfac"), 0, 1, torch.device("cpu"), seed=0)
    trial = BUILTIN_TRIALS["digits-mlp"](context)
    with pytest.raises(ValueError, match="needs the model"):
        trial.build_optimizer(trial.build_model().parameters())
