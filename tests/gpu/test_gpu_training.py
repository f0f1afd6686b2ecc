"""Training on CUDA: each backward schedule and K-FAC on cuda:0, SPB's memory saving
measured by the CUDA allocator, checkpoint and resume on a GPU, an adaptive batch's noise
and AdaScale rate with a rebatch in place, and the multi-GPU gangs (NCCL) where the
machine has the devices.

Jobs run in spawned processes (`run_gang`), as the agent runs them, with the backend the
agent would pick (NCCL on CUDA).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from api.server import free_port
from jigsaw.gradnoise import GradParams, adascale
from tests.gpu import GPU_LANE, needs_gpus
from tests.runtime_helpers import run_gang, worker_configs
from worker_agent.runtime.checkpoint import CHECKPOINT_FILE
from worker_agent.runtime.config import WorkerConfig
from worker_agent.runtime.control import LocalController
from worker_agent.runtime.protocol import Outcome
from worker_agent.runtime.spb import stages as stage_cuts
from worker_agent.runtime.workloads.nets import cifar_resnet

pytestmark = GPU_LANE

ITERATIONS = 30
_JOB: dict[str, Any] = {
    "workload": "digits-cnn",
    "hyperparameters": {"batch_size": 64, "learning_rate": 0.05},
    "max_iterations": ITERATIONS,
    "eval_every": 10,
    "seed": 0,
}
# Each backward schedule and optimizer a job spec can name that runs on one device.
SCHEDULES: dict[str, dict[str, Any]] = {
    "standard": {},
    "ooo": {"backprop": "ooo"},
    "kfac": {"hyperparameters": {"batch_size": 64, "learning_rate": 0.1, "optimizer": "kfac"}},
    "spb": {"spb_enabled": True, "spb": {}},
}


def _on_gpus(configs: list[WorkerConfig]) -> list[WorkerConfig]:
    """Rank r on cuda:r, as the agent places a gang on a node's GPUs."""
    return [config.model_copy(update={"device": f"cuda:{config.rank}"}) for config in configs]


def _assert_trained_on_cuda(controller: LocalController, iterations: int = ITERATIONS) -> None:
    assert controller.status is not None, "rank 0 reported no exit"
    assert controller.status.outcome is Outcome.SUCCEEDED, controller.status
    assert controller.status.iteration == iterations
    records = controller.records
    assert [r.iteration for r in records] == list(range(1, iterations + 1))
    first, last = records[:5], records[-5:]
    assert sum(r.loss for r in last) < sum(r.loss for r in first)  # it learns
    # The CUDA allocator's peak, not the host's resident set: a few MB for this CNN.
    assert all(0 < r.peak_memory_bytes < 2**31 for r in records)
    # NVML's utilization of the GPU (nvidia-ml-py is in the train extra).
    readings = [r.utilization for r in records if r.utilization is not None]
    assert readings, "no NVML utilization reported: is nvidia-ml-py installed?"
    assert all(0.0 <= reading <= 1.0 for reading in readings)


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_a_job_trains_on_cuda_0(name: str) -> None:
    fields = {**_JOB, **SCHEDULES[name]}
    (config,) = worker_configs(1, device="cuda:0", **fields)
    assert config.resolved_backend == "nccl"
    (controller,) = run_gang([config])
    _assert_trained_on_cuda(controller)


@needs_gpus(2)
@pytest.mark.parametrize(
    "name",
    [*SCHEDULES, "spb-partial"],
)
def test_a_two_gpu_gang_trains_over_nccl(name: str) -> None:
    fields = {**_JOB, **SCHEDULES.get(name, {})}
    if name == "spb-partial":  # rank 1 backpropagates through the top half only
        fields |= {"spb_enabled": True, "spb": {"full_fraction": 0.5, "partial_depth": 0.5}}
    controllers = run_gang(_on_gpus(worker_configs(2, **fields)))
    _assert_trained_on_cuda(controllers[0])
    if name == "spb-partial":
        assert all(r.spb_depth is not None and r.spb_depth < 1 for r in controllers[0].records)


@needs_gpus(2)
def test_a_two_stage_pipeline_trains_over_nccl() -> None:
    fields = {
        "workload": "text-transformer",
        "hyperparameters": {"batch_size": 16, "learning_rate": 0.003, "optimizer": "adam"},
        "max_iterations": 12,
        "eval_every": 6,
        "seed": 3,
        "pipeline": {"stages": 2, "schedule": "zero-bubble", "microbatches": 4},
    }
    controllers = run_gang(_on_gpus(worker_configs(2, **fields)))
    _assert_trained_on_cuda(controllers[0], iterations=12)


def test_a_partial_worker_needs_less_gpu_memory_than_a_full_one() -> None:
    """SPB's memory saving on a GPU: the allocator's peak over a forward and backward of a
    worker that trains only the top stage against one that trains every stage."""
    device = torch.device("cuda:0")
    model = cifar_resnet((32, 64, 128), 10).to(device)
    cut = stage_cuts.build(model, list(model), None)
    images = torch.randn(256, 3, 32, 32, device=device)
    labels = torch.randint(10, (256,), device=device)

    def peak_bytes(depth: int) -> int:
        cut.train_top(depth)
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(images), labels).backward()  # warm up the allocator
        model.zero_grad(set_to_none=True)
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        F.cross_entropy(model(images), labels).backward()
        torch.cuda.synchronize(device)
        return int(torch.cuda.max_memory_allocated(device)) - before

    full, partial = peak_bytes(len(cut)), peak_bytes(1)
    assert 0 < partial < 0.6 * full, {"full": full, "partial": partial}


def test_suspend_and_resume_on_the_gpu_continue_the_same_trajectory(tmp_path: Path) -> None:
    """Adam's moments and dropout's CUDA random stream survive a checkpoint: a run
    suspended at 6 and resumed ends where an uninterrupted one ends."""
    fields = {
        **_JOB,
        "workload": "digits-mlp",
        "hyperparameters": {"batch_size": 128, "learning_rate": 0.01, "optimizer": "adam"},
        "max_iterations": 14,
        "seed": 7,
    }
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    run_gang(worker_configs(1, device="cuda:0", checkpoint_dir=straight, **fields))
    (suspended,) = run_gang(
        worker_configs(1, device="cuda:0", checkpoint_dir=interrupted, **fields),
        [LocalController(suspend_at=6)],
    )
    assert suspended.status is not None and suspended.status.outcome is Outcome.SUSPENDED
    (resumed,) = run_gang(worker_configs(1, device="cuda:0", checkpoint_dir=interrupted, **fields))
    assert resumed.checks[0] == 6
    assert [r.iteration for r in resumed.records] == list(range(7, 15))
    expected = torch.load(straight / CHECKPOINT_FILE, weights_only=True)
    actual = torch.load(interrupted / CHECKPOINT_FILE, weights_only=True)
    assert actual["iteration"] == expected["iteration"] == 14
    assert "cuda" in actual["rng"][0], "the CUDA random state was not checkpointed"
    for name, tensor in expected["model"].items():
        # cuDNN and cuBLAS may pick other kernels in a new process: close, not equal.
        assert torch.allclose(actual["model"][name], tensor, rtol=1e-4, atol=1e-6), name


def _reformed(configs: list[WorkerConfig], keep: int) -> list[WorkerConfig]:
    """The first `keep` ranks' configurations in the smaller gang, on a new port."""
    port = free_port()
    return [
        config.model_copy(update={"world_size": keep, "master_port": port})
        for config in configs[:keep]
    ]


_ELASTIC = {**_JOB, "max_micro_batch": 32}  # global batch 64: 2 x 32, or 1 x 32 x 2


def test_an_nccl_group_is_formed_again_in_the_same_process(tmp_path: Path) -> None:
    """What an in-place resize does to a rank that stays, on one GPU: checkpoint at the
    boundary, destroy the NCCL group, form a new one on another port, resume."""
    configs = worker_configs(1, device="cuda:0", checkpoint_dir=tmp_path, **_ELASTIC)
    (controller,) = run_gang(
        configs, [LocalController(shrink_at=10, shrink_to=_reformed(configs, 1)[0])]
    )
    assert controller.shrunk_at == 10 and controller.checks.count(10) == 2
    _assert_trained_on_cuda(controller)


@needs_gpus(2)
def test_a_two_gpu_gang_shrinks_in_place_and_trains_on_over_nccl(tmp_path: Path) -> None:
    configs = _on_gpus(worker_configs(2, checkpoint_dir=tmp_path, **_ELASTIC))
    smaller = _reformed(configs, 1)
    controllers = run_gang(
        configs,
        [LocalController(shrink_at=10, shrink_to=smaller[0]), LocalController()],
    )
    _assert_trained_on_cuda(controllers[0])
    assert [r.workers for r in controllers[0].records] == [2] * 10 + [1] * (ITERATIONS - 10)
    assert controllers[1].status is not None and controllers[1].status.outcome is Outcome.LEFT


REBATCH_AT = 5


def test_an_adaptive_batch_measures_its_noise_on_cuda_and_is_rebatched_in_place(
    tmp_path: Path,
) -> None:
    """The goodput path on the GPU: one rank splits its adaptive batch of 64 into two
    micro-batches, so the gradient noise (over CUDA gradients) is measured from the first
    step and the rate follows AdaScale; at a boundary the scheduler's new batch, 128, is
    taken in place (the NCCL group formed again in the same process), its rate at once."""
    fields = {**_ELASTIC, "base_batch": 32}
    (config,) = worker_configs(1, device="cuda:0", checkpoint_dir=tmp_path, **fields)
    larger = _reformed([config], 1)[0]
    hyperparameters = larger.hyperparameters.model_copy(update={"batch_size": 128})
    larger = larger.model_copy(update={"hyperparameters": hyperparameters})
    (controller,) = run_gang([config], [LocalController(shrink_at=REBATCH_AT, shrink_to=larger)])
    assert controller.status is not None, "rank 0 reported no exit"
    assert controller.status.outcome is Outcome.SUCCEEDED, controller.status
    assert controller.shrunk_at == REBATCH_AT
    records = controller.records
    steps = len(records)
    assert [r.iteration for r in records] == list(range(1, steps + 1))
    assert [r.batch_size for r in records] == [64] * REBATCH_AT + [128] * (steps - REBATCH_AT)
    for record in records:
        assert record.grad_sqr is not None and record.grad_var is not None, record
        grad = GradParams(record.grad_sqr, record.grad_var)
        expected = adascale(0.05, 32, record.batch_size, grad).lr
        assert record.learning_rate == pytest.approx(expected, rel=1e-6)
        assert 0.05 < record.learning_rate <= 0.05 * record.batch_size / 32 * (1 + 1e-9)
    # Each step counts its AdaScale gain, so the job ends in fewer steps than asked.
    assert records[-2].progress < ITERATIONS <= records[-1].progress and steps < ITERATIONS
    assert sum(r.loss for r in records[-3:]) < sum(r.loss for r in records[:3])  # it learns
