"""k of reverse first-k from a profile: move dW after the dX chain when exchanges would
otherwise delay the next forward, and not when communication is free."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from jigsaw.jobspec import JobSpec
from jigsaw.spb import SPBProfile, StageProfile
from worker_agent.runtime.ooo.first_k import choose_first_k, iteration_seconds


def _profile(stages: int) -> SPBProfile:
    stage = StageProfile(
        forward_seconds=1.0,
        backward_input_seconds=1.0,
        backward_weight_seconds=1.0,
        activation_bytes=0,
        parameter_bytes=1,
    )
    return SPBProfile("test", 8, (stage,) * stages, {})


def test_exchanges_as_long_as_a_dw_move_the_first_stages_after_the_chain() -> None:
    # 2 workers send each stage's 1 byte once at 1 B/s: one second per exchange. In
    # standard order layer 0's exchange starts last and the next forward waits for it.
    profile = _profile(4)
    assert iteration_seconds(profile, 0, 2, 1.0) == 13.0
    assert iteration_seconds(profile, 1, 2, 1.0) == 13.0
    assert iteration_seconds(profile, 2, 2, 1.0) == 12.0
    assert iteration_seconds(profile, 4, 2, 1.0) == 12.0
    assert choose_first_k(profile, 2, 1.0) == 2


def test_free_communication_keeps_the_standard_order() -> None:
    assert choose_first_k(_profile(4), 8, 1e12) == 0


def test_nonsense_is_refused() -> None:
    with pytest.raises(ValueError, match="workers"):
        choose_first_k(_profile(2), 1, 1.0)


def test_a_job_spec_refuses_a_k_below_one_with_the_field_named() -> None:
    spec = {"name": "j", "workload": "digits-mlp", "max_iterations": 1, "backprop": "ooo"}
    assert JobSpec.model_validate({**spec, "ooo_first_k": 3}).ooo_first_k == 3
    with pytest.raises(ValidationError, match="ooo_first_k"):
        JobSpec.model_validate({**spec, "ooo_first_k": 0})
