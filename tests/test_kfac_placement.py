"""Inversion placement, fusion planning and SPB contributors, against brute force and
hand-worked cases."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from jigsaw.jobspec import Hyperparameters, SPBConfig
from jigsaw.spb import contributors, worker_depths
from worker_agent.runtime.kfac.exchange import CommModel, fusion_plan
from worker_agent.runtime.kfac.factors import discover_layers, layer_contributors
from worker_agent.runtime.kfac.placement import balanced, round_robin
from worker_agent.runtime.trial import TrialContext
from worker_agent.runtime.workloads import BUILTIN_TRIALS


def _max_load(
    owners: tuple[int | None, ...], inversion: list[float], broadcast: list[float], workers: int
) -> float:
    """Written out again here: a local factor costs its inversion on every worker; a
    distributed one its broadcast on every worker and its inversion on its owner."""
    loads = []
    for worker in range(workers):
        load = 0.0
        for owner, inv, bcast in zip(owners, inversion, broadcast, strict=True):
            load += inv if owner is None else bcast + (inv if owner == worker else 0.0)
        loads.append(load)
    return max(loads)


def _brute_force(inversion: list[float], broadcast: list[float], workers: int) -> float:
    remote = [i for i in range(len(inversion)) if inversion[i] >= broadcast[i]]
    best = float("inf")
    for assignment in itertools.product(range(workers), repeat=len(remote)):
        owners: list[int | None] = [None] * len(inversion)
        for i, worker in zip(remote, assignment, strict=True):
            owners[i] = worker
        best = min(best, _max_load(tuple(owners), inversion, broadcast, workers))
    return best


def _case(rng: random.Random, factors: int) -> tuple[list[float], list[float]]:
    # Inversion grows as d^3, a broadcast as alpha + beta d^2: small factors are local.
    dims = [rng.randint(2, 300) for _ in range(factors)]
    inversion = [d**3 * 1e-9 * rng.uniform(0.8, 1.2) for d in dims]
    broadcast = [1e-4 + d * d * 4e-9 for d in dims]
    return inversion, broadcast


def test_balanced_placement_is_optimal_on_small_cases_and_never_above_round_robin() -> None:
    rng = random.Random(0)
    for _ in range(150):
        workers = rng.randint(2, 4)
        inversion, broadcast = _case(rng, rng.randint(1, 7))
        placement = balanced(inversion, broadcast, workers)
        load = _max_load(placement.owners, inversion, broadcast, workers)
        assert load == pytest.approx(_brute_force(inversion, broadcast, workers), rel=1e-12)
        baseline = round_robin(len(inversion), workers).owners
        assert load <= _max_load(baseline, inversion, broadcast, workers) * (1 + 1e-12)


def test_balanced_placement_beats_round_robin_on_a_resnet_sized_case() -> None:
    rng = random.Random(1)
    inversion, broadcast = _case(rng, 60)
    placement = balanced(inversion, broadcast, 4)
    assert placement.owners.count(None) > 0  # some factors are cheaper inverted locally
    load = _max_load(placement.owners, inversion, broadcast, 4)
    assert load < _max_load(round_robin(60, 4).owners, inversion, broadcast, 4)


def test_a_single_worker_decomposes_everything_itself() -> None:
    assert balanced([1.0, 2.0], [0.1, 0.1], 1).owners == (None, None)


def test_comm_model_fit_recovers_startup_and_per_element_cost() -> None:
    model = CommModel.fit([10, 1000, 100_000], [2e-4 + 1e-9 * n for n in (10, 1000, 100_000)])
    assert model.alpha == pytest.approx(2e-4)
    assert model.beta == pytest.approx(1e-9)


def test_fusion_plan_merges_what_would_wait_and_keeps_what_would_not() -> None:
    elements = [100] * 4
    # A startup longer than any gap: waiting for the next factor is always cheaper.
    assert fusion_plan([0.0, 1.0, 2.0, 3.0], elements, CommModel(10.0, 0.0)) == [[0, 1, 2, 3]]
    # Free messages and far-apart factors: every factor goes alone, at once.
    assert fusion_plan([0.0, 1.0, 2.0, 3.0], elements, CommModel(0.0, 1e-3)) == [[0], [1], [2], [3]]
    # Factor 0's message occupies the channel until 0.5 + 1.0: factors 1 and 2 (ready
    # at 0.6, 0.9) would wait behind it anyway and share one message; factor 3 comes
    # much later and goes alone.
    plan = fusion_plan([0.5, 0.6, 0.9, 5.0], elements, CommModel(0.05, 0.0095))
    assert plan == [[0], [1, 2], [3]]
    assert fusion_plan([], [], CommModel(1.0, 0.0)) == []


def test_layers_take_the_contributors_of_their_spb_stage() -> None:
    context = TrialContext(Hyperparameters(), 0, 4, torch.device("cpu"), seed=0)
    trial = BUILTIN_TRIALS["digits-cnn"](context)
    model = trial.build_model()
    stages = trial.stages(model)
    # Two full workers, two training the top stage only.
    config = SPBConfig(full_fraction=0.5, partial_depth=0.5)
    per_stage = contributors(worker_depths(config, 4, len(stages)), len(stages))
    layers = discover_layers(model)
    mapping = layer_contributors(layers, stages, per_stage)
    assert {name: sorted(ranks) for name, ranks in mapping.items()} == {
        "0.1": [0, 1],
        "0.3": [0, 1],
        "1.1": [0, 1, 2, 3],
    }
