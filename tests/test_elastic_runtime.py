"""Elastic jobs in the runtime: a job resized at a boundary keeps its trajectory (global
batch by accumulation, data position, optimizer state), the gradient noise is measured
as AdaptDL measures it, and an adaptive batch's learning rate follows AdaScale's rule."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from jigsaw import elastic
from jigsaw.gpus import GpuSlot
from jigsaw.gradnoise import GradParams, NoiseEstimator, adascale
from jigsaw.jobspec import JobSpec
from jigsaw.proto import convert
from jigsaw.proto.v2 import agent_pb2 as pb
from tests.runtime_helpers import run_gang, worker_configs
from worker_agent import wire
from worker_agent.jobs import JobLaunch, NodeResources
from worker_agent.runtime.checkpoint import CHECKPOINT_FILE
from worker_agent.runtime.control import LocalController
from worker_agent.runtime.protocol import IterationRecord, Outcome

ITERATIONS = 12
RESIZE_AT = 5
# TinyTrial: 256 samples, no dropout, so the trajectory depends on the batches alone.
# A global batch of 64 is 2 workers x 32 or 1 worker x 32 x 2 accumulated.
_FIELDS: dict[str, Any] = {
    "workload": "tests.runtime_helpers:TinyTrial",
    "hyperparameters": {"batch_size": 64, "learning_rate": 0.05, "optimizer": "sgd"},
    "max_iterations": ITERATIONS,
    "eval_every": 100,
    "seed": 3,
    "max_micro_batch": 32,
}


def _state(directory: Path) -> dict[str, Any]:
    state: dict[str, Any] = torch.load(directory / CHECKPOINT_FILE, weights_only=True)
    return state


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[IterationRecord]]:
    """The unresized run on 2 workers: its checkpoint directory and rank 0's records."""
    directory = tmp_path_factory.mktemp("straight")
    controllers = run_gang(worker_configs(2, checkpoint_dir=directory, **_FIELDS))
    return directory, controllers[0].records


def _assert_same_state(expected: dict[str, Any], actual: dict[str, Any]) -> None:
    assert actual["iteration"] == expected["iteration"] == ITERATIONS
    assert (actual["epoch"], actual["batch"]) == (expected["epoch"], expected["batch"])
    for name, tensor in expected["model"].items():
        assert torch.allclose(actual["model"][name], tensor, rtol=1e-5, atol=1e-6), name
    for index, moments in actual["optimizer"]["state"].items():
        for key, value in moments.items():
            reference = expected["optimizer"]["state"][index][key]
            assert torch.allclose(value, reference, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("first", "then"), [(2, 1), (1, 2)], ids=["2-to-1", "1-to-2"])
def test_a_job_resized_at_a_boundary_ends_as_an_unresized_run(
    tmp_path: Path, straight: tuple[Path, list[IterationRecord]], first: int, then: int
) -> None:
    before = run_gang(
        worker_configs(first, checkpoint_dir=tmp_path, attempt=1, **_FIELDS),
        [LocalController(suspend_at=RESIZE_AT)] + [LocalController()] * (first - 1),
    )
    assert before[0].status is not None and before[0].status.outcome is Outcome.SUSPENDED
    assert [r.iteration for r in before[0].records] == list(range(1, RESIZE_AT + 1))

    after = run_gang(worker_configs(then, checkpoint_dir=tmp_path, attempt=2, **_FIELDS))
    # No iteration lost or repeated: the new gang starts at the boundary and goes on.
    assert after[0].checks[0] == RESIZE_AT
    assert [r.iteration for r in after[0].records] == list(range(RESIZE_AT + 1, ITERATIONS + 1))
    assert {r.batch_size for r in before[0].records + after[0].records} == {64}
    _assert_same_state(_state(straight[0]), _state(tmp_path))


def test_a_job_shrunk_in_place_goes_on_in_the_same_processes_and_ends_as_an_unresized_run(
    tmp_path: Path, straight: tuple[Path, list[IterationRecord]]
) -> None:
    """4 ranks at iteration 5 become 2 without a process starting: ranks 0 and 3 form the
    new group (3 renumbered 1, on a new port) from the boundary's checkpoint, 1 and 2
    leave."""
    configs = worker_configs(4, checkpoint_dir=tmp_path, attempt=1, **_FIELDS)
    smaller = worker_configs(2, checkpoint_dir=tmp_path, attempt=1, **_FIELDS)
    assert smaller[0].master_port != configs[0].master_port
    controllers = run_gang(
        configs,
        [
            LocalController(shrink_at=RESIZE_AT, shrink_to=smaller[0]),
            LocalController(),
            LocalController(),
            LocalController(shrink_to=smaller[1]),
        ],
    )
    assert [c.shrunk_at for c in controllers] == [RESIZE_AT] * 4
    outcomes = [c.status.outcome if c.status is not None else None for c in controllers]
    assert outcomes == [Outcome.SUCCEEDED, Outcome.LEFT, Outcome.LEFT, Outcome.SUCCEEDED]
    records = controllers[0].records
    # No iteration lost or repeated, and the same process (no new start) trained on.
    assert [r.iteration for r in records] == list(range(1, ITERATIONS + 1))
    assert [r.workers for r in records] == [4] * RESIZE_AT + [2] * (ITERATIONS - RESIZE_AT)
    # The smaller gang's first boundary is the shrink's: asked again, in the same process.
    assert controllers[0].checks.count(RESIZE_AT) == 2
    assert {r.batch_size for r in records} == {64}
    _assert_same_state(_state(straight[0]), _state(tmp_path))


def test_a_job_grown_in_place_keeps_its_process_and_ends_as_an_unresized_run(
    tmp_path: Path, straight: tuple[Path, list[IterationRecord]]
) -> None:
    """1 rank at iteration 5 becomes 2 without a restart: rank 0 checkpoints, leaves its
    group and forms the larger one (a new port) in the same process; the joiner, started
    beside it, waits at that rendezvous until then and resumes from the boundary's
    checkpoint, as a restarted rank would."""
    configs = worker_configs(1, checkpoint_dir=tmp_path, attempt=1, **_FIELDS)
    larger = worker_configs(2, checkpoint_dir=tmp_path, attempt=1, **_FIELDS)
    controllers = run_gang(
        [configs[0], larger[1]],
        [LocalController(shrink_at=RESIZE_AT, shrink_to=larger[0]), LocalController()],
    )
    outcomes = [c.status.outcome if c.status is not None else None for c in controllers]
    assert outcomes == [Outcome.SUCCEEDED, Outcome.SUCCEEDED]
    assert controllers[0].shrunk_at == RESIZE_AT
    records = controllers[0].records
    # No iteration lost or repeated, one process throughout for rank 0.
    assert [r.iteration for r in records] == list(range(1, ITERATIONS + 1))
    assert [r.workers for r in records] == [1] * RESIZE_AT + [2] * (ITERATIONS - RESIZE_AT)
    assert {r.batch_size for r in records} == {64}
    _assert_same_state(_state(straight[0]), _state(tmp_path))


def test_another_global_batch_would_be_seen(
    tmp_path: Path, straight: tuple[Path, list[IterationRecord]]
) -> None:
    """The comparison above can fail: a run with another global batch ends elsewhere."""
    fields = {**_FIELDS, "hyperparameters": {**_FIELDS["hyperparameters"], "batch_size": 32}}
    run_gang(worker_configs(1, checkpoint_dir=tmp_path, **fields))
    with pytest.raises(AssertionError):
        _assert_same_state(_state(straight[0]), _state(tmp_path))


def test_a_fixed_batch_keeps_its_learning_rate_and_reports_its_noise(
    straight: tuple[Path, list[IterationRecord]],
) -> None:
    records = straight[1]
    assert [r.iteration for r in records] == list(range(1, ITERATIONS + 1))
    assert all(r.learning_rate == 0.05 and r.batch_size == 64 for r in records)
    assert [r.progress for r in records] == [float(r.iteration) for r in records]
    # Two workers, one micro-batch each: two gradients a step, enough to measure.
    assert all(r.grad_sqr is not None and r.grad_var is not None for r in records)
    assert any(r.grad_var for r in records)


def _assert_counts_adascale_gains(records: list[IterationRecord], since: float = 0.0) -> None:
    """Each step's progress is its AdaScale gain (its rate over the base rate, 0.05)."""
    done = [since] + [r.progress for r in records]
    for before, record in zip(done, records, strict=False):
        assert record.progress == pytest.approx(before + record.learning_rate / 0.05, rel=1e-9)


def test_an_adaptive_batch_scales_the_learning_rate_by_adascale(tmp_path: Path) -> None:
    """Base batch 32 at lr 0.05; the scheduler asked for 128 on 2 workers (2 x 32 x 2).
    Each step counts its AdaScale gain (more than 1) towards `max_iterations`, so the
    job ends in fewer steps, every rank at the same one."""
    fields = {
        **_FIELDS,
        "hyperparameters": {"batch_size": 128, "learning_rate": 0.05, "optimizer": "sgd"},
        "base_batch": 32,
    }
    controllers = run_gang(worker_configs(2, checkpoint_dir=tmp_path, **fields))
    records = controllers[0].records
    steps = len(records)
    assert [r.iteration for r in records] == list(range(1, steps + 1))
    _assert_counts_adascale_gains(records)
    assert records[-2].progress < ITERATIONS <= records[-1].progress and steps < ITERATIONS
    assert _state(tmp_path)["progress"] == records[-1].progress
    assert all(r.batch_size == 128 for r in records)
    measured = [r for r in records if r.grad_sqr is not None]
    assert len(measured) == steps  # 4 micro-batches a step: measured from the first
    for record in measured:
        assert record.grad_var is not None and record.grad_var >= 0 and record.grad_sqr >= 0
        grad = GradParams(record.grad_sqr, record.grad_var)
        assert record.learning_rate == pytest.approx(adascale(0.05, 32, 128, grad).lr, rel=1e-9)
        # AdaScale lies between no scaling and linear scaling.
        assert 0.05 <= record.learning_rate <= 0.05 * 4 * (1 + 1e-12)
    # The noise is real here (a mini-batch is not the whole data), so the rate moved.
    assert all(r.learning_rate > 0.05 * 1.01 for r in measured)


def test_an_adaptive_batch_on_one_worker_runs_two_micro_batches_and_measures_its_noise(
    tmp_path: Path,
) -> None:
    """One gradient a step would measure no noise: one worker splits an adaptive batch of
    32 in two (16 x 2), so its noise, and AdaScale's rate, come from the first step on;
    a run resumed from its checkpoint at another batch (a resize, a rebatch) goes on
    from the noise measured before, its rate the new batch's at once."""
    fields = {
        **_FIELDS,
        "hyperparameters": {"batch_size": 32, "learning_rate": 0.05, "optimizer": "sgd"},
        "base_batch": 16,
    }
    first = run_gang(worker_configs(1, checkpoint_dir=tmp_path, **fields))[0].records
    steps = len(first)
    assert [r.iteration for r in first] == list(range(1, steps + 1))
    for record in first:
        assert record.grad_sqr is not None and record.grad_var is not None
        grad = GradParams(record.grad_sqr, record.grad_var)
        assert record.learning_rate == pytest.approx(adascale(0.05, 16, 32, grad).lr, rel=1e-9)
    assert first[-1].learning_rate > 0.05
    saved = _state(tmp_path)
    assert saved["schedule"]["noise"][2] == pytest.approx(1 - 0.99**steps)  # weight so far
    assert saved["progress"] == first[-1].progress >= ITERATIONS
    fields["hyperparameters"] = {**fields["hyperparameters"], "batch_size": 64}
    # One more step: its gain is at least 1.
    fields["max_iterations"] = math.floor(first[-1].progress) + 1
    [resumed] = run_gang(worker_configs(1, checkpoint_dir=tmp_path, **fields))[0].records
    assert (resumed.iteration, resumed.batch_size) == (steps + 1, 64)
    assert resumed.grad_sqr is not None and resumed.grad_var is not None
    grad = GradParams(resumed.grad_sqr, resumed.grad_var)
    assert resumed.learning_rate == pytest.approx(adascale(0.05, 16, 64, grad).lr, rel=1e-9)
    _assert_counts_adascale_gains([resumed], since=first[-1].progress)
    saved = _state(tmp_path)
    assert saved["schedule"]["noise"][2] == pytest.approx(1 - 0.99 ** (steps + 1))  # went on


def test_the_noise_estimator_recovers_a_known_mean_and_variance() -> None:
    """Micro-batch gradients drawn as G + noise of known variance: the estimates, at the
    base batch, converge to |G|^2 and tr(Sigma) x m / B0."""
    generator = torch.Generator().manual_seed(0)
    dim, count, micro, base = 50, 4, 8, 32
    true = torch.randn(dim, generator=generator, dtype=torch.float64)
    sigma = 0.5  # per-coordinate standard deviation of one micro-batch gradient
    estimator = NoiseEstimator(base, smoothing=0.999)
    for _ in range(5000):
        gradients = true + sigma * torch.randn(count, dim, generator=generator, dtype=torch.float64)
        estimator.update(
            local_sqr=float(gradients.pow(2).sum(dim=1).mean()),
            total_sqr=float(gradients.mean(dim=0).pow(2).sum()),
            count=count,
            micro_batch=micro,
        )
    params = estimator.params
    assert params is not None
    assert params.sqr == pytest.approx(float(true.pow(2).sum()), rel=0.05)
    assert params.var == pytest.approx(dim * sigma**2 * micro / base, rel=0.05)


def test_the_noise_estimator_needs_two_gradients_and_ignores_diverged_steps() -> None:
    estimator = NoiseEstimator(32)
    assert estimator.params is None
    with pytest.raises(ValueError, match="two gradients"):
        estimator.update(local_sqr=1.0, total_sqr=1.0, count=1, micro_batch=8)
    estimator.update(local_sqr=math.inf, total_sqr=1.0, count=2, micro_batch=8)
    assert estimator.params is None


def test_the_noise_estimator_restores_what_it_averaged() -> None:
    estimator = NoiseEstimator(32)
    estimator.update(local_sqr=3.0, total_sqr=2.0, count=4, micro_batch=8)
    again = NoiseEstimator(32)
    again.restore(estimator.state())
    assert again.params == estimator.params and again.state() == estimator.state()
    for bad in ([1.0, math.nan, 0.5], [1.0, 1.0, 2.0]):
        with pytest.raises(ValueError, match="noise estimator"):
            again.restore(bad)


@pytest.mark.parametrize(
    ("batch", "workers", "most", "expected"),
    [
        (32, 4, 8, (8, 1)),
        (32, 2, 8, (8, 2)),  # the 4 x 8 -> 2 x 8 x 2
        (32, 1, 8, (8, 4)),
        (48, 1, 20, (16, 3)),  # 48 / 20 needs 3 micro-batches, of 16
        (36, 1, 10, (9, 4)),
    ],
)
def test_a_global_batch_splits_exactly_into_the_fewest_micro_batches(
    batch: int, workers: int, most: int, expected: tuple[int, int]
) -> None:
    split = elastic.split(batch, workers, most)
    assert (split.micro_batch, split.accumulation) == expected
    assert split.global_batch == batch


def test_a_batch_that_cannot_split_evenly_is_refused_and_an_adaptive_one_rounds_down() -> None:
    with pytest.raises(ValueError, match="does not split evenly"):
        elastic.split(30, 4, 8)
    rounded = elastic.nearest_split(30, 4, 8)
    assert (rounded.micro_batch, rounded.accumulation, rounded.global_batch) == (7, 1, 28)
    assert elastic.nearest_split(3, 2, 1).global_batch == 2
    with pytest.raises(ValueError, match="no sample"):
        elastic.nearest_split(1, 2, 8)
    # One worker runs two micro-batches or more, to measure its noise between them.
    for batch, most, expected in ((32, 32, (16, 2)), (33, 64, (11, 3)), (64, 16, (16, 4))):
        alone = elastic.nearest_split(batch, 1, most)
        assert (alone.micro_batch, alone.accumulation) == expected, batch
    assert elastic.nearest_split(1, 1, 8).accumulation == 1


def _launch(spec: dict[str, Any], workers: int, global_batch: int = 0) -> JobLaunch:
    command = pb.LaunchCommand(
        job_id=7,
        spec=convert.spec_message(JobSpec.model_validate(spec)),
        ranks=[pb.RankAssignment(rank=r, gpu_index=r) for r in range(workers)],
        world_size=workers,
        master_addr="127.0.0.1",
        master_port=29500,
        global_batch=global_batch,
    )
    slots = {i: GpuSlot(i, "virtual-cpu", 1 << 30, True) for i in range(4)}
    return wire.job_launch(command, NodeResources(slots, Path("/tmp"), 1))


def test_the_agent_configures_the_batch_split_and_the_schedulers_adaptive_batch() -> None:
    spec = {
        "name": "e",
        "workload": "digits-mlp",
        "workers": 4,
        "max_iterations": 5,
        "hyperparameters": {"batch_size": 32},
        "elastic": {"min_workers": 1, "max_workers": 4},
    }
    shrunk = _launch(spec, 2)
    assert shrunk.problem is None
    config = shrunk.configs[0]
    assert (config.world_size, config.max_micro_batch, config.base_batch) == (2, 8, None)
    assert config.hyperparameters.batch_size == 32

    adaptive = {**spec, "batch": {"min": 16, "max": 256, "adaptive": True}}
    chosen = _launch(adaptive, 2, global_batch=128).configs[0]
    assert (chosen.hyperparameters.batch_size, chosen.base_batch) == (128, 32)
    assert "outside the spec's [16, 256]" in str(_launch(adaptive, 2, global_batch=512).problem)
    assert "fixed at 32" in str(_launch(spec, 2, global_batch=64).problem)
    # A job that is neither elastic nor adaptive runs as before: no split of its own.
    plain = {key: value for key, value in spec.items() if key != "elastic"}
    assert _launch(plain, 4).configs[0].max_micro_batch is None
