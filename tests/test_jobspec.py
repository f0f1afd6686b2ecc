"""Job spec validation: bad input is refused with the field path and a reason."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from jigsaw.jobspec import JobSpec, PipelineConfig, SPBConfig

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


def test_the_trials_own_hyperparameters_are_free_form_scalars_and_lists() -> None:
    trial = {"hidden": 64, "dropout": 0.1, "act": "relu", "residual": True, "widths": [8, 4]}
    spec = JobSpec.model_validate(
        {
            **BASE,
            "hyperparameters": {"trial": trial},
            "eval_every": 25,
            "code": "sha256:" + "0" * 64,
        }
    )
    assert spec.hyperparameters.trial == trial and spec.eval_every == 25
    assert JobSpec.model_validate(BASE).hyperparameters.trial == {}


@pytest.mark.parametrize(
    ("trial", "reason"),
    [
        ({"nested": {"a": 1}}, "hyperparameters.trial.nested"),
        ({"deep": [[1]]}, "hyperparameters.trial.deep"),
        ({"nan": float("nan")}, "hyperparameters.trial.nan"),
        ({"long": "x" * 1025}, "hyperparameters.trial.long"),
        ({"many": list(range(1025))}, "hyperparameters.trial.many"),
        ({"not-a-name": 1}, "not identifiers"),
        ({f"k{i}": i for i in range(65)}, "at most 64"),
        ({f"k{i}": "x" * 1000 for i in range(20)}, "bytes as JSON"),
    ],
)
def test_bad_trial_hyperparameters_are_refused_with_where(trial: Any, reason: str) -> None:
    errors = _error_locs({**BASE, "hyperparameters": {"trial": trial}})
    assert any(reason in path or reason in message for path, message in errors), errors


@pytest.mark.parametrize(
    ("patch", "loc"),
    [
        ({"eval_every": 0}, "eval_every"),
        ({"code": "sha256:" + "0" * 63}, "code"),
        ({"code": "sha256:" + "G" * 64}, "code"),
        ({"code": "/etc/passwd"}, "code"),
    ],
)
def test_bad_eval_interval_or_code_digest_is_refused(patch: dict[str, Any], loc: str) -> None:
    assert [path for path, _ in _error_locs({**BASE, **patch})] == [loc]


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


PIPELINED: dict[str, Any] = {
    **BASE,
    "workload": "text-transformer",
    "workers": 2,
    "hyperparameters": {"batch_size": 16},
    "pipeline": {"stages": 2, "schedule": "1f1b", "microbatches": 8},
}


def test_pipeline_spec_accepted_with_a_batch_smaller_than_workers() -> None:
    assert JobSpec.model_validate(PIPELINED).pipeline == PipelineConfig(
        stages=2, schedule="1f1b", microbatches=8
    )
    # Every stage sees the whole batch, so one sample is enough.
    small = {
        **PIPELINED,
        "hyperparameters": {"batch_size": 1},
        "pipeline": {"stages": 2, "microbatches": 1},
    }
    spec = JobSpec.model_validate(small)
    assert spec.pipeline is not None and spec.pipeline.schedule == "zero-bubble"
    # A user trial may support more stages than a built-in; its runtime checks them.
    user = JobSpec.model_validate(
        {**PIPELINED, "workload": "my_pkg.trials:Deep", "workers": 8, "pipeline": {"stages": 8}}
    )
    assert user.pipeline is not None and user.pipeline.stages == 8


@pytest.mark.parametrize(
    ("patch", "reason"),
    [
        ({"workers": 4}, "pipeline.stages (2) must equal workers (4)"),
        ({"workload": "digits-cnn"}, "'digits-cnn' does not support pipeline parallelism"),
        ({"workers": 4, "pipeline": {"stages": 4}}, "more than the 2 transformer blocks"),
        ({"hyperparameters": {"batch_size": 12}}, "not a multiple of pipeline.microbatches (8)"),
        ({"spb": "auto"}, "pipeline needs spb: off"),
        ({"spb": {"full_fraction": 0.5, "partial_depth": 0.5}}, "pipeline needs spb: off"),
        ({"backprop": "ooo"}, "pipeline needs backprop: standard"),
        ({"hyperparameters": {"batch_size": 16, "optimizer": "kfac"}}, "optimizer: kfac"),
    ],
)
def test_impossible_pipelines_are_refused_at_the_pipeline_field(
    patch: dict[str, Any], reason: str
) -> None:
    errors = _error_locs({**PIPELINED, **patch})
    assert [path for path, _ in errors] == ["pipeline"], errors
    assert reason in errors[0][1]


def test_pipeline_fields_are_checked() -> None:
    assert [path for path, _ in _error_locs({**PIPELINED, "pipeline": {"stages": 1}})] == [
        "pipeline.stages"
    ]
    errors = _error_locs({**PIPELINED, "pipeline": {"stages": 2, "microbatches": 0}})
    assert [path for path, _ in errors] == ["pipeline.microbatches"]


def test_elastic_and_batch_default_to_a_fixed_job() -> None:
    spec = JobSpec.model_validate({**BASE, "workers": 2})
    assert spec.elastic is None and spec.batch is None and not spec.adaptive
    assert spec.max_micro_batch == 32  # the default global batch of 64 over 2 workers


def test_batch_global_is_the_hyperparameters_batch_size() -> None:
    spec = JobSpec.model_validate(
        {
            **BASE,
            "workers": 4,
            "elastic": {"min_workers": 1, "max_workers": 8},
            "batch": {"global": 32},
        }
    )
    assert spec.hyperparameters.batch_size == 32
    assert spec.max_micro_batch == 8
    assert spec.model_dump(mode="json")["batch"]["global"] == 32
    assert JobSpec.model_validate(spec.model_dump(mode="json")) == spec
    adaptive = JobSpec.model_validate({**BASE, "batch": {"min": 16, "max": 512, "adaptive": True}})
    assert adaptive.adaptive and adaptive.hyperparameters.batch_size == 64


@pytest.mark.parametrize(
    ("patch", "loc", "message"),
    [
        ({"workers": 2, "elastic": {"min_workers": 3, "max_workers": 4}}, "elastic", "within"),
        ({"elastic": {"min_workers": 4, "max_workers": 2}}, "elastic", "more than"),
        ({"elastic": {"min_workers": 0, "max_workers": 2}}, "elastic.min_workers", "greater"),
        ({"elastic": {"min_workers": 1}}, "elastic.max_workers", "required"),
        ({"elastic": {"min_workers": "1", "max_workers": 2}}, "elastic.min_workers", "integer"),
        ({"batch": {"global": 0}}, "batch.global", "greater"),
        ({"batch": {"global_": 64}}, "batch.global_", "Extra"),
        ({"batch": {"adaptive": "yes"}}, "batch.adaptive", "boolean"),
        (
            {"hyperparameters": {"batch_size": 32}, "batch": {"global": 64}},
            "batch",
            "set one",
        ),
        ({"batch": {"min": 8}}, "batch", "adaptive: true"),
        ({"batch": {"min": 128, "max": 32, "adaptive": True}}, "batch", "min (128) is more than"),
        ({"batch": {"min": 128, "adaptive": True}}, "batch", "within [min, max]"),
        ({"batch": {"max": 32, "adaptive": True}}, "batch", "within [min, max]"),
        (
            {"workers": 3, "elastic": {"min_workers": 1, "max_workers": 4}},
            "",
            "multiple of workers",
        ),
        ({"elastic": {"min_workers": 1, "max_workers": 2}, "spb": "auto"}, "", "spb: off"),
        (
            {"batch": {"adaptive": True}, "hyperparameters": {"optimizer": "kfac"}},
            "",
            "kfac",
        ),
        # digits: 1,437 samples, of which 2 workers hold 718 each.
        (
            {"workers": 2, "batch": {"global": 64, "max": 1438, "adaptive": True}},
            "",
            "batch.max (1438) is more than the 1,437 training samples of 'digits-mlp' hold "
            "on 2 workers (1,436",
        ),
        (
            {"elastic": {"min_workers": 1, "max_workers": 2}, "batch": {"global": 2048}},
            "",
            "hyperparameters.batch_size (2048) is more than",
        ),
    ],
)
def test_bad_elastic_and_batch_specs_name_their_path(
    patch: dict[str, Any], loc: str, message: str
) -> None:
    errors = _error_locs({**BASE, **patch})
    assert any(at == loc and message in text for at, text in errors), errors


def test_a_batch_as_large_as_the_workers_shares_of_the_data_is_accepted() -> None:
    # Each worker's share of the batch rounds down, as the runtime splits it.
    for workers, largest in ((1, 1437), (2, 1437), (3, 1439)):
        batch = {"global": 64 * 3, "max": largest, "adaptive": True}
        JobSpec.model_validate({**BASE, "workers": workers, "batch": batch})
    # A user trial's data is not known here: nothing is refused.
    JobSpec.model_validate({**BASE, "workload": "trials.big:Big", "batch": {"global": 4096}})


@pytest.mark.parametrize("value", [0, "64", 2**70, 64.0, True])
def test_a_bad_global_batch_is_reported_once_where_it_was_written(value: Any) -> None:
    """`batch.global` fills `hyperparameters.batch_size` only when it is a batch size:
    a bad one is not also blamed on a field the user did not write."""
    errors = _error_locs({**BASE, "batch": {"global": value, "adaptive": True}})
    assert [at for at, _ in errors] == ["batch.global"], errors
