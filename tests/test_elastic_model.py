"""An elastic job's speed at every size from the sizes it ran (Pollux's fitted
throughput model), as the live snapshot builds it: measured sizes kept, the others
predicted, an adaptive job at its best batch in seconds per base step."""

from __future__ import annotations

import pytest

from jigsaw.gradnoise import GradParams
from scheduler.core.elastic_model import adaptive_batch, fixed_batch, sample
from scheduler.core.goodput import BatchLimits, PerfParams


def measured(perf: PerfParams, workers: int, batch: int, micro: int) -> object:
    """What a job with these true parameters reports at a size (one node)."""
    split_accum = -(-batch // (workers * micro)) - 1
    per_gpu = batch // (workers * (split_accum + 1))
    step = perf.step_seconds(1, workers, per_gpu, split_accum)
    return sample(
        workers, 1, batch, micro, step, perf.sync_seconds(1, workers, per_gpu), adaptive=False
    )


TRUE = PerfParams(0.01, 0.002, 0.05, 0.01, 0.02, 0.005, 1.5)


def test_sizes_run_keep_their_times_and_the_others_are_predicted() -> None:
    samples = [measured(TRUE, w, 64, 32) for w in (1, 2, 4)]
    assert all(s is not None for s in samples)
    table = fixed_batch(samples, (1, 2, 3, 4, 8), max_nodes=2, batch=64, max_micro_batch=32)
    # 3 does not divide the batch: another size would train another trajectory.
    assert sorted(table.steps) == [1, 2, 4, 8]
    assert table.batches == {}
    for s in samples:
        assert table.steps[s.workers][1] == (s.step_seconds, s.sync_seconds)
    # 8 never ran: predicted within a fifth of the truth, on one node and on two.
    truth = TRUE.step_seconds(1, 8, 8, 0)
    assert table.steps[8][1][0] == pytest.approx(truth, rel=0.2)
    assert set(table.steps[8]) == {1, 2}
    assert table.steps[1] == {1: table.steps[1][1]}  # one GPU spans one node


def test_one_size_measured_predicts_the_others_optimistically() -> None:
    one = measured(TRUE, 2, 64, 32)
    assert one is not None
    table = fixed_batch([one], (1, 2, 4), max_nodes=1, batch=64, max_micro_batch=32)
    # Synchronisation beyond what was seen costs nothing yet: 4 GPUs look faster than
    # 2, and 1 GPU (two accumulated micro-batches, no synchronisation) no faster.
    assert table.steps[4][1][0] < table.steps[2][1][0] <= table.steps[1][1][0]


def test_a_measurement_that_cannot_be_a_sample_is_none() -> None:
    assert sample(3, 1, 64, 32, 1.0, 0.5, adaptive=False) is None  # 64 over 3 workers
    assert sample(2, 1, 64, 32, 0.0, 0.0, adaptive=False) is None  # no time measured


def test_an_adaptive_job_runs_each_size_at_its_best_batch() -> None:
    samples = [measured(TRUE, w, 64, 32) for w in (1, 2)]
    limits = BatchLimits(base=64, min=32, max=1024, max_per_gpu=32)
    noisy = adaptive_batch(samples, (1, 2, 4), 1, GradParams(sqr=1.0, var=100.0), limits)
    quiet = adaptive_batch(samples, (1, 2, 4), 1, GradParams(sqr=1.0, var=0.01), limits)
    # Much noise: large batches stay efficient and are chosen; little: they are not.
    assert noisy.batches[4][1] > quiet.batches[4][1]
    assert quiet.batches[4][1] <= 128
    # Seconds per base-batch step of progress: a large efficient batch makes several.
    step = TRUE.step_seconds(1, 4, 32, noisy.batches[4][1] // 128 - 1)
    assert noisy.steps[4][1][0] < step
