"""What an SPB configuration means (jigsaw/spb.py): depths, contributors, costs."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jigsaw.jobspec import SPBConfig
from jigsaw.spb import (
    SPBProfile,
    StageProfile,
    as_json,
    config_key,
    contributors,
    job_cost,
    resolve,
    worker_depths,
)

HALF_QUARTER = SPBConfig(full_fraction=0.5, partial_depth=0.25)


def test_off_and_auto_resolve_to_full_backprop() -> None:
    for setting in ("off", "auto", {}, None):
        assert resolve(setting) is None
        assert worker_depths(resolve(setting), 4, 4) == (4, 4, 4, 4)
    assert resolve({"full_fraction": 0.5, "partial_depth": 0.25}) == HALF_QUARTER
    assert resolve(as_json(HALF_QUARTER)) == HALF_QUARTER and as_json(None) == {}
    with pytest.raises(ValueError):
        resolve("sometimes")


def test_half_full_quarter_depth_on_four_workers_and_stages() -> None:
    depths = worker_depths(HALF_QUARTER, 4, 4)
    assert depths == (4, 4, 1, 1)
    # Stage 3 (the top) is trained by everyone, the others by the full workers only.
    assert contributors(depths, 4) == (
        frozenset({0, 1}),
        frozenset({0, 1}),
        frozenset({0, 1}),
        frozenset({0, 1, 2, 3}),
    )


def test_counts_round_half_up_and_keep_one_full_worker() -> None:
    config = SPBConfig(full_fraction=0.25, partial_depth=0.5)
    assert worker_depths(config, 2, 5) == (5, 3)  # 0.5 workers -> 1; 2.5 stages -> 3
    assert worker_depths(SPBConfig(full_fraction=0.1, partial_depth=0.1), 3, 2) == (2, 1, 1)


def test_rotation_moves_the_full_block_every_period() -> None:
    config = SPBConfig(full_fraction=0.5, partial_depth=0.25, rotation_period=10)
    assert worker_depths(config, 4, 4, iteration=0) == (4, 4, 1, 1)
    assert worker_depths(config, 4, 4, iteration=9) == (4, 4, 1, 1)
    assert worker_depths(config, 4, 4, iteration=10) == (1, 4, 4, 1)
    assert worker_depths(config, 4, 4, iteration=30) == (4, 1, 1, 4)
    assert worker_depths(config, 4, 4, iteration=40) == (4, 4, 1, 1)


@given(
    full=st.floats(min_value=0.01, max_value=1.0),
    depth=st.floats(min_value=0.01, max_value=1.0),
    period=st.integers(min_value=0, max_value=5),
    workers=st.integers(min_value=1, max_value=16),
    stages=st.integers(min_value=1, max_value=12),
    iteration=st.integers(min_value=0, max_value=100),
)
def test_every_stage_has_a_contributor_and_the_top_has_all(
    full: float, depth: float, period: int, workers: int, stages: int, iteration: int
) -> None:
    config = SPBConfig(full_fraction=full, partial_depth=depth, rotation_period=period)
    depths = worker_depths(config, workers, stages, iteration)
    assert all(1 <= d <= stages for d in depths)
    sets = contributors(depths, stages)
    assert sets[-1] == frozenset(range(workers))
    assert all(sets[s] <= sets[s + 1] for s in range(stages - 1))  # nested
    assert len(sets[0]) == sum(d == stages for d in depths) >= 1


def _profile() -> SPBProfile:
    stage = StageProfile(
        forward_seconds=1.0,
        backward_input_seconds=1.0,
        backward_weight_seconds=1.0,
        activation_bytes=100,
        parameter_bytes=10,
    )
    return SPBProfile("toy", 32, (stage,) * 4, {"0.5/0.25": 1.1})


def test_cost_of_full_backprop_is_a_ring_all_reduce_of_everything() -> None:
    cost = job_cost(_profile(), None, 4)
    # 4 forward, 4 weight gradients, 3 input gradients (none below the bottom stage).
    assert cost.worker_compute_seconds == (11.0,) * 4
    assert cost.worker_activation_bytes == (400,) * 4
    assert cost.bytes_exchanged == 2 * 3 * 40  # ring over 4: 2(N-1) gradients of 40 B
    assert cost.steps_ratio == 1.0


def test_cost_of_a_partial_configuration() -> None:
    cost = job_cost(_profile(), HALF_QUARTER, 4)
    assert cost.worker_compute_seconds == (11.0, 11.0, 5.0, 5.0)
    assert cost.iteration_compute_seconds == 11.0
    assert cost.worker_activation_bytes == (400, 400, 100, 100)
    # Three stages among 2 contributors (2 + 2 sends), the top among all 4 (6 sends).
    assert cost.bytes_exchanged == 3 * (2 + 2) * 10 + 6 * 10
    assert cost.steps_ratio == 1.1
    unmeasured = SPBConfig(full_fraction=0.75, partial_depth=0.5)
    assert job_cost(_profile(), unmeasured, 4).steps_ratio is None
    assert config_key(unmeasured) == "0.75/0.5" and config_key(None) == "off"
    rotating = SPBConfig(full_fraction=0.5, partial_depth=0.25, rotation_period=10)
    assert config_key(rotating) == "0.5/0.25/r10"


def test_profiles_round_trip_through_json() -> None:
    profile = _profile()
    assert SPBProfile.from_json(profile.to_json()) == profile
