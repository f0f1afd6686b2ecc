"""Structured partial backprop in the runtime: real gloo process groups on localhost.

The oracle of the exchange is computed here, in one process, from each worker's full
gradient on its own shard: the mean over each stage's contributors.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from jigsaw import spb
from jigsaw.jobspec import (
    BUILTIN_METRICS,
    BUILTIN_PARAMETER_LAYERS,
    BUILTIN_TRAIN_SAMPLES,
    Hyperparameters,
    SPBConfig,
)
from tests.runtime_helpers import run_gang, worker_configs
from worker_agent.runtime.checkpoint import CHECKPOINT_FILE
from worker_agent.runtime.control import LocalController
from worker_agent.runtime.gang import run_local_gang
from worker_agent.runtime.protocol import Outcome
from worker_agent.runtime.spb import stages as stage_cuts
from worker_agent.runtime.spb.memory import SavedActivations, forward_peak_bytes
from worker_agent.runtime.spb.partial import PartialBackprop
from worker_agent.runtime.trial import Trial, TrialContext
from worker_agent.runtime.workloads import BUILTIN_TRIALS
from worker_agent.runtime.workloads.nets import cifar_resnet

HALF_QUARTER = SPBConfig(full_fraction=0.5, partial_depth=0.25)


def _trial(workload: str, batch_size: int = 32) -> Trial:
    context = TrialContext(
        hyperparameters=Hyperparameters(batch_size=batch_size),
        rank=0,
        world_size=1,
        device=torch.device("cpu"),
        seed=0,
    )
    return BUILTIN_TRIALS[workload](context)


def test_builtin_layer_counts_match_the_models() -> None:
    for workload, layers in BUILTIN_PARAMETER_LAYERS.items():
        model = _trial(workload).build_model()
        assert len(stage_cuts.parameter_layers(model)) == layers, workload


def test_builtin_sample_counts_match_the_training_data() -> None:
    # Submission refuses a batch these samples cannot hold: they must be the trials'.
    assert set(BUILTIN_TRAIN_SAMPLES) == set(BUILTIN_PARAMETER_LAYERS)
    for workload, samples in BUILTIN_TRAIN_SAMPLES.items():
        assert len(_trial(workload).train_data()) == samples, workload


def test_builtin_metric_names_match_the_evaluations() -> None:
    # Submission refuses a target metric outside BUILTIN_METRICS; it must be what the
    # workload's evaluation really reports.
    for workload, metrics in BUILTIN_METRICS.items():
        trial = _trial(workload)
        assert set(trial.evaluate(trial.build_model())) == metrics, workload


def test_derived_stages_balance_parameters_and_refuse_impossible_cuts() -> None:
    model = nn.Sequential(
        nn.Linear(10, 100), nn.ReLU(), nn.Linear(100, 10), nn.Linear(10, 10), nn.Linear(10, 2)
    )
    cut = stage_cuts.build(model, [model], 2)
    # Layers of 1,100, 1,010, 110 and 22 parameters: half of the 2,242 is nearest after
    # the first layer.
    assert [sum(p.numel() for p in ps) for ps in cut.parameters] == [1100, 1142]
    # A trial that declares one stage gets up to DEFAULT_STAGES of them.
    assert len(stage_cuts.build(model, [model], None)) == 4
    with pytest.raises(stage_cuts.StageError, match="only 4 layers with parameters"):
        stage_cuts.build(model, [model], 5)
    with pytest.raises(stage_cuts.StageError, match="depth 0"):
        cut.train_top(0)


def test_a_shared_parameter_belongs_to_the_topmost_stage() -> None:
    embedding = nn.Embedding(10, 4)
    head = nn.Linear(4, 10)
    head.weight = embedding.weight  # tied input and output embeddings
    model = nn.Sequential(embedding, nn.Linear(4, 4), head)
    cut = stage_cuts.build(model, list(model), None)
    assert not any(p is embedding.weight for p in cut.parameters[0])
    assert any(p is embedding.weight for p in cut.parameters[2])


@pytest.mark.parametrize(
    "workload", ["digits-cnn", "resnet-synthetic", "resnet18-synthetic", "transformer-synthetic"]
)
def test_stages_below_the_cut_save_no_activations(workload: str) -> None:
    trial = _trial(workload)
    model = trial.build_model()
    cut = stage_cuts.build(model, trial.stages(model), None)
    batch = next(iter(torch.utils.data.DataLoader(trial.train_data(), batch_size=8)))
    count = len(cut)
    for depth in range(1, count + 1):
        cut.train_top(depth)
        with SavedActivations(cut, model) as saved:
            loss = trial.loss(model, batch)
        below, trained = range(count - depth), range(count - depth, count)
        assert all(saved.bytes[stage] == 0 for stage in below), (depth, dict(saved.bytes))
        assert all(saved.bytes[stage] > 0 for stage in trained), (depth, dict(saved.bytes))
        loss.backward()
        for stage in below:
            assert all(p.grad is None for p in cut.parameters[stage])
        model.zero_grad(set_to_none=True)


def test_a_partial_worker_holds_less_memory_than_a_full_one() -> None:
    model = cifar_resnet((8, 16, 32), 10)
    cut = stage_cuts.build(model, list(model), None)
    images, labels = torch.randn(64, 3, 32, 32), torch.randint(10, (64,))

    def forward() -> torch.Tensor:
        return F.cross_entropy(model(images), labels)

    peaks = {}
    for depth in (len(cut), 1):
        cut.train_top(depth)
        forward()  # warm up the allocator at this depth
        peaks[depth] = min(forward_peak_bytes(forward, torch.device("cpu")) for _ in range(3))
    assert 0 < peaks[1] < 0.6 * peaks[len(cut)], peaks


# ------------------------------------------------------------------ the exchange


def _digits_cnn() -> nn.Module:
    torch.manual_seed(0)
    return _trial("digits-cnn").build_model()


def _global_batch(step: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 + step)
    inputs = torch.rand(size, 64, generator=generator)
    return inputs, torch.randint(10, (size,), generator=generator)


def _shard(step: int, rank: int, world_size: int, per_rank: int) -> tuple[torch.Tensor, ...]:
    inputs, targets = _global_batch(step, per_rank * world_size)
    rows = slice(rank * per_rank, (rank + 1) * per_rank)
    return inputs[rows], targets[rows]


def _train_partially(rank: int, world_size: int, config: dict[str, Any], steps: int) -> Any:
    """A rank of the gang: per step, parameters before, its gradients after the
    exchange, and parameters after the optimizer step."""
    model = _digits_cnn()
    partial = PartialBackprop(
        stage_cuts.build(model, [model], 3),
        model,
        rank=rank,
        world_size=world_size,
        config=spb.resolve(config),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    history = []
    for step in range(steps):
        before = [p.detach().clone() for p in model.parameters()]
        depths = partial.begin(step)
        inputs, targets = _shard(step, rank, world_size, per_rank=8)
        optimizer.zero_grad()
        F.cross_entropy(model(inputs), targets).backward()
        wire_bytes = partial.synchronize()
        grads = [p.grad.clone() for p in model.parameters()]  # type: ignore[union-attr]
        optimizer.step()
        after = [p.detach().clone() for p in model.parameters()]
        history.append((depths, before, grads, after, wire_bytes))
    return history


def _contributor_means(
    before: list[torch.Tensor], depths: tuple[int, ...], step: int
) -> list[torch.Tensor]:
    """In one process: each worker's full gradient on its shard, averaged per stage over
    the workers whose depth reaches the stage."""
    model = _digits_cnn()
    with torch.no_grad():
        for param, value in zip(model.parameters(), before, strict=True):
            param.copy_(value)
    cut = stage_cuts.build(model, [model], 3)
    world_size = len(depths)
    per_worker = []
    for rank in range(world_size):
        model.zero_grad()
        inputs, targets = _shard(step, rank, world_size, per_rank=8)
        F.cross_entropy(model(inputs), targets).backward()
        per_worker.append({id(p): p.grad.clone() for p in model.parameters()})  # type: ignore[union-attr]
    stage_ranks = spb.contributors(depths, len(cut))
    expected = {}
    for stage, params in enumerate(cut.parameters):
        for param in params:
            ranks = sorted(stage_ranks[stage])
            expected[id(param)] = torch.stack([per_worker[r][id(param)] for r in ranks]).mean(0)
    return [expected[id(p)] for p in model.parameters()]


@pytest.mark.parametrize("world_size", [2, 4])
def test_each_stage_gets_its_contributors_mean_and_replicas_stay_identical(
    world_size: int,
) -> None:
    # Rotating every step: the contributor sets (and their process groups) change.
    config = {"full_fraction": 0.5, "partial_depth": 0.34, "rotation_period": 1}
    steps = 3
    ranks = run_local_gang(_train_partially, world_size, config, steps)
    for step in range(steps):
        depths, before, _, _, _ = ranks[0][step]
        assert sorted(set(depths)) == [1, 3]  # some ranks partial, some full
        expected = _contributor_means(before, depths, step)
        for rank in range(world_size):
            _, rank_before, grads, after, _ = ranks[rank][step]
            assert all(torch.equal(a, b) for a, b in zip(rank_before, before, strict=True))
            for grad, want in zip(grads, expected, strict=True):
                torch.testing.assert_close(grad, want, rtol=1e-5, atol=1e-6)
            # Bit-identical replicas after every step.
            assert all(torch.equal(a, b) for a, b in zip(after, ranks[0][step][3], strict=True))
    # The exchange moves what the scheduler's cost model says, less than an all-reduce
    # of everything over all ranks.
    model = _digits_cnn()
    stage_bytes = stage_cuts.build(model, [model], 3).parameter_bytes()
    everything = world_size * 2 * (world_size - 1) * sum(stage_bytes) // world_size
    for step in range(steps):
        depths = ranks[0][step][0]
        modelled = sum(
            spb.exchange_bytes(len(ranks_of_stage), world_size, size)
            for ranks_of_stage, size in zip(spb.contributors(depths, 3), stage_bytes, strict=True)
        )
        measured = sum(rank[step][4] for rank in ranks)
        assert measured == modelled < everything


# ------------------------------------------------------------------ the training loop

_LOOP_FIELDS: dict[str, Any] = {
    "workload": "digits-cnn",
    "hyperparameters": {"batch_size": 64, "learning_rate": 0.05},
    "eval_every": 1000,
    "seed": 3,
}


def _final_parameters(directory: Path) -> dict[str, torch.Tensor]:
    state: dict[str, Any] = torch.load(directory / CHECKPOINT_FILE, weights_only=True)
    return dict(state["model"])


@pytest.mark.parametrize("world_size", [2, 4])
def test_spb_at_full_depth_matches_ddp(world_size: int, tmp_path: Path) -> None:
    finals = []
    for name, spb_fields in (
        ("ddp", {}),
        (
            "spb",
            # Profiling first (on a copy) must leave the trajectory as it was.
            {
                "spb_enabled": True,
                "spb": {"full_fraction": 1.0, "partial_depth": 0.5},
                "profile": True,
            },
        ),
    ):
        directory = tmp_path / name
        controllers = run_gang(
            worker_configs(
                world_size, max_iterations=6, checkpoint_dir=directory, **_LOOP_FIELDS, **spb_fields
            )
        )
        finals.append(_final_parameters(directory))
    # Rank 0 alone measured the model and reported its profile.
    (profile,) = controllers[0].profiles
    assert profile["workload"] == "digits-cnn" and len(profile["stages"]) == 2
    assert all(not c.profiles for c in controllers[1:])
    ddp, partial = finals
    assert ddp.keys() == partial.keys()
    for key in ddp:
        torch.testing.assert_close(partial[key], ddp[key], rtol=1e-5, atol=1e-6)


def test_reconfiguring_full_partial_full_keeps_training(tmp_path: Path) -> None:
    partial = {"full_fraction": 0.5, "partial_depth": 0.5}
    controllers = run_gang(
        worker_configs(
            2,
            max_iterations=14,
            checkpoint_dir=tmp_path,
            spb_enabled=True,
            spb_stages=2,
            **_LOOP_FIELDS,
        ),
        [LocalController(reconfigure_at={4: partial, 10: {}}), LocalController()],
    )
    for controller in controllers:
        assert controller.status is not None
        assert controller.status.outcome is Outcome.SUCCEEDED
        assert controller.status.iteration == 14 and controller.status.config_version == 2
    records = controllers[0].records
    # No lost or repeated step, no restart: one process ran every iteration.
    assert [r.iteration for r in records] == list(range(1, 15))
    assert all(math.isfinite(r.loss) for r in records)
    assert records[-1].loss < records[0].loss
    # The configuration took effect exactly at its boundaries: rank 0 is the one full
    # worker while partial and sends its lower stage to rank 1 through nobody's
    # all-reduce, so its wire bytes drop in iterations 5..10 only.
    wire = [r.bytes_communicated for r in records]
    assert len(set(wire[:4])) == 1 and wire[:4] == wire[10:]
    assert len(set(wire[4:10])) == 1 and wire[4] < wire[0]


def test_spb_composes_with_out_of_order_backprop_and_kfac(tmp_path: Path) -> None:
    partial = {"full_fraction": 0.5, "partial_depth": 0.5}
    finals = {}
    for name, fields in (
        ("spb", {}),
        # Reverse first-k averages each layer over its stage's contributors: the same
        # gradients as SPB's own exchange, applied later.
        ("spb+ooo", {"backprop": "ooo"}),
        # K-FAC's factors of the lower stage come from rank 0 alone.
        ("spb+kfac", {"hyperparameters": {"batch_size": 64, "optimizer": "kfac"}}),
        # Rank 1 hands K-FAC no G below its cut either; one K-FAC step per iteration.
        (
            "spb+ooo+kfac",
            {"backprop": "ooo", "hyperparameters": {"batch_size": 64, "optimizer": "kfac"}},
        ),
    ):
        directory = tmp_path / name
        controllers = run_gang(
            worker_configs(
                2,
                max_iterations=6,
                checkpoint_dir=directory,
                spb_enabled=True,
                spb=partial,
                **{**_LOOP_FIELDS, **fields},
            )
        )
        records = controllers[0].records
        assert [r.iteration for r in records] == list(range(1, 7))
        assert all(math.isfinite(r.loss) and r.spb_depth == 0.75 for r in records)
        finals[name] = _final_parameters(directory)
    for key, value in finals["spb"].items():
        torch.testing.assert_close(finals["spb+ooo"][key], value, rtol=1e-5, atol=1e-6)
    # K-FAC steps differently, but it stepped.
    assert any(not torch.equal(finals["spb+kfac"][k], v) for k, v in finals["spb"].items())
    # The damped solve amplifies the exchanges' different summation orders.
    for key, value in finals["spb+kfac"].items():
        torch.testing.assert_close(finals["spb+ooo+kfac"][key], value, rtol=1e-4, atol=1e-5)
