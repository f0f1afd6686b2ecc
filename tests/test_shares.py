"""`shares.relax`, the Lagrangian relaxation of the GPU-count knapsack, against the exact
program (`shares.allocate`) on scores of the kind fluid sizing makes."""

from __future__ import annotations

import random

import pytest

from scheduler.core.shares import allocate, relax


def fluid_scores(rng: random.Random, jobs: int, capacity: int) -> list[dict[int, float]]:
    """Each job's -(1 / T)^0.5 at each size, T its time to go under a concave speedup,
    a size other than the one it holds charged a move."""
    scores = []
    for rank in range(jobs):
        seconds, power, held = rng.uniform(100, 20_000), rng.uniform(0.3, 0.95), rng.choice([0, 2])
        options = {0: -1e-9 * rank}
        for workers in (1, 2, 3, 4, 6, 8, 12, 16):
            if workers <= capacity:
                moved = 0 if workers == held else 120
                options[workers] = -((1 / (seconds / workers**power + moved)) ** 0.5)
        scores.append(options)
    return scores


def total(scores: list[dict[int, float]], counts: list[int]) -> float:
    return sum(options[workers] for options, workers in zip(scores, counts, strict=True))


@pytest.mark.parametrize(("jobs", "capacity", "gap"), [(3, 8, 0.03), (50, 64, 1e-3)])
def test_the_relaxation_fits_and_comes_near_the_optimum(
    jobs: int, capacity: int, gap: float
) -> None:
    # What it can miss is a few jobs' worth, so a share that falls with their number.
    rng = random.Random(3)
    for _ in range(50):
        scores = fluid_scores(rng, jobs, capacity)
        counts = relax(scores, capacity)
        assert sum(counts) <= capacity
        assert all(workers in options for options, workers in zip(scores, counts, strict=True))
        best = total(scores, allocate(scores, capacity))
        assert total(scores, counts) <= best * (1 - gap)  # negative sums: near the least


def test_the_relaxation_leaves_no_gpu_a_job_would_gain_from() -> None:
    # Two jobs whose scores fall linearly in GPUs: every GPU goes, the steeper job first.
    scores = [{0: 0.0, 1: -2.0, 2: -4.0, 3: -6.0}, {0: 0.0, 1: -1.0, 2: -2.0, 4: -4.0}]
    assert relax(scores, 4) == [3, 1]
    assert relax(scores, 7) == [3, 4]
    assert relax(scores, 100) == [3, 4]


def test_the_relaxation_of_nothing_and_of_no_gpus() -> None:
    assert relax([], 8) == []
    assert relax([{0: 0.0, 2: -1.0}, {0: 0.0, 1: -5.0}], 0) == [0, 0]
    assert relax([{0: 0.0, 9: -100.0, 1: -1.0}], 8) == [1]  # 9 GPUs never fit in 8
    with pytest.raises(ValueError, match="0 GPUs"):
        relax([{1: -1.0}], 4)
