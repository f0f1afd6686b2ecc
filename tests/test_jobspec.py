"""Job spec validation: bad input is refused with the field path and a reason."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from scheduler.jobspec import JobSpec, SPBConfig

BASE: dict[str, Any] = {"name": "mnist-1", "workload": "digits-mlp", "max_iterations": 100}


def _error_locs(payload: dict[str, Any]) -> list[tuple[str, str]]:
    with pytest.raises(ValidationError) as info:
        JobSpec.model_validate(payload)
    return [(".".join(str(p) for p in e["loc"]), e["msg"]) for e in info.value.errors()]


def test_minimal_spec_gets_defaults() -> None:
    spec = JobSpec.model_validate(BASE)
    assert spec.workers == 1
    assert spec.spb == "off"
    assert spec.backprop == "standard"
    assert spec.hyperparameters.optimizer == "sgd"


def test_fixed_spb_and_user_trial_accepted() -> None:
    spec = JobSpec.model_validate(
        {
            **BASE,
            "workload": "my_pkg.trials:ResNetTrial",
            "spb": {"full_fraction": 0.5, "partial_depth": 0.25},
            "workers": 4,
        }
    )
    assert spec.spb == SPBConfig(full_fraction=0.5, partial_depth=0.25)


@pytest.mark.parametrize(
    ("patch", "loc"),
    [
        ({"foo": 1}, "foo"),
        ({"hyperparameters": {"batch_size": 0}}, "hyperparameters.batch_size"),
        ({"hyperparameters": {"optimizer": "rmsprop"}}, "hyperparameters.optimizer"),
        ({"hyperparameters": {"lr": 0.1}}, "hyperparameters.lr"),
        ({"workers": 0}, "workers"),
        ({"workload": "not a workload"}, "workload"),
        ({"name": "bad name!"}, "name"),
        ({"backprop": "sideways"}, "backprop"),
        ({"priority": 1000}, "priority"),
    ],
)
def test_bad_fields_name_their_path(patch: dict[str, Any], loc: str) -> None:
    locs = [path for path, _ in _error_locs({**BASE, **patch})]
    assert any(path == loc or path.startswith(loc + ".") for path in locs), locs


def test_bad_spb_config_names_its_field() -> None:
    errors = _error_locs({**BASE, "spb": {"full_fraction": 1.5, "partial_depth": 0.5}})
    assert any("full_fraction" in path for path, _ in errors)


def test_job_must_have_a_stopping_rule() -> None:
    errors = _error_locs({"name": "x", "workload": "digits-mlp"})
    assert any("max_iterations" in msg for _, msg in errors)


def test_batch_smaller_than_workers_is_refused() -> None:
    errors = _error_locs({**BASE, "workers": 8, "hyperparameters": {"batch_size": 4}})
    assert any("every worker" in msg for _, msg in errors)


def test_out_of_order_backprop_with_kfac_is_accepted() -> None:
    spec = JobSpec.model_validate(
        {**BASE, "backprop": "ooo", "hyperparameters": {"optimizer": "kfac", "learning_rate": 0.1}}
    )
    assert spec.backprop == "ooo" and spec.hyperparameters.optimizer == "kfac"
