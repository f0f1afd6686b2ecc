"""The typed protocol (`jigsaw.v2`): the job spec, SPB configurations and model profiles
make the round trip scheduler -> message -> agent unchanged, and a message that does
not make a valid value is refused with the field's name."""

from __future__ import annotations

import math
from typing import Any

import pytest

from jigsaw.jobspec import JobSpec, SPBConfig
from jigsaw.proto import convert
from jigsaw.proto.v2 import agent_pb2 as pb
from jigsaw.spb import SPBProfile, StageProfile

SPECS: list[dict[str, Any]] = [
    {"name": "minimal", "workload": "digits-mlp", "max_iterations": 1},
    {
        "name": "every-field",
        "workload": "my_trials.vision:ResNetTrial",
        "hyperparameters": {
            "batch_size": 96,
            "learning_rate": 0.25,
            "optimizer": "kfac",
            # Integers stay integers on the wire, and lists keep their element types.
            "trial": {"width": 64, "dropout": 0.5, "act": "gelu", "tied": True, "dims": [3, 2.5]},
        },
        "workers": 3,
        "max_iterations": 10**12,
        "target_metric": {"name": "accuracy", "value": 0.875, "mode": "max"},
        "priority": -100,
        "queue": "batch.low_1",
        "spb": {"full_fraction": 0.5, "partial_depth": 0.25, "rotation_period": 7, "stages": 4},
        "backprop": "ooo",
        "ooo_first_k": 2,
        "max_retries": 10,
        "eval_every": 7,
        "code": "sha256:" + "ab" * 32,
    },
    {
        "name": "pipeline",
        "workload": "text-transformer",
        "hyperparameters": {"batch_size": 8, "optimizer": "adam"},
        "workers": 2,
        "target_metric": {"name": "perplexity", "value": 1.5, "mode": "min"},
        "pipeline": {"stages": 2, "schedule": "1f1b", "microbatches": 8},
    },
    {"name": "auto", "workload": "digits-cnn", "max_iterations": 5, "spb": "auto"},
    {
        "name": "gpipe",
        "workload": "transformer-synthetic",
        "workers": 2,
        "max_iterations": 3,
        "pipeline": {"stages": 2, "schedule": "gpipe", "microbatches": 1},
    },  # fmt: skip
    {
        "name": "elastic",
        "workload": "digits-mlp",
        "workers": 4,
        "max_iterations": 3,
        "elastic": {"min_workers": 1, "max_workers": 8},
        "batch": {"global": 64},
    },
    {
        "name": "adaptive",
        "workload": "digits-mlp",
        "max_iterations": 3,
        "batch": {"min": 32, "max": 1024, "adaptive": True},
    },
]


@pytest.mark.parametrize("data", SPECS, ids=[spec["name"] for spec in SPECS])
def test_a_spec_survives_the_wire(data: dict[str, Any]) -> None:
    spec = JobSpec.model_validate(data)
    wired = pb.JobSpec.FromString(convert.spec_message(spec).SerializeToString())
    assert convert.job_spec(wired) == spec


def test_trial_hyperparameters_keep_their_types_and_bad_ones_are_refused() -> None:
    spec = JobSpec.model_validate(SPECS[1])
    wired = convert.job_spec(convert.spec_message(spec))
    assert wired.hyperparameters.trial == SPECS[1]["hyperparameters"]["trial"]
    assert type(wired.hyperparameters.trial["width"]) is int
    message = convert.spec_message(spec)
    for text, reason in (("{not json", "not JSON"), ('{"x": NaN}', "finite"), ("[1]", "dict")):
        message.hyperparameters.trial_json = text
        with pytest.raises(ValueError, match=reason):
            convert.job_spec(message)


def test_unset_optional_fields_stay_unset() -> None:
    target = {"name": "loss", "value": 0.5, "mode": "min"}
    spec = JobSpec.model_validate({"name": "j", "workload": "digits-mlp", "target_metric": target})
    message = convert.spec_message(spec)
    for field in ("max_iterations", "ooo_first_k", "pipeline"):
        assert not message.HasField(field), field
    assert message.spb.mode == pb.SPB_MODE_OFF


def test_spb_configurations_and_profiles_survive_the_wire() -> None:
    for config in (
        SPBConfig(full_fraction=1, partial_depth=0.5),
        SPBConfig(full_fraction=0.125, partial_depth=1, rotation_period=3, stages=1024),
    ):
        wired = pb.SPBConfig.FromString(convert.spb_message(config).SerializeToString())
        assert convert.spb_config(wired) == config
    stage = StageProfile(0.5, 0.25, 0.125, 1 << 40, 3)
    profile = SPBProfile("digits-mlp", 32, (stage, stage), {"0.5/0.25": 1.25, "off": 1.0})
    wired_profile = pb.ModelProfile.FromString(convert.profile_message(profile).SerializeToString())
    assert convert.model_profile(wired_profile) == profile


def _spec_message(**changes: Any) -> pb.JobSpec:
    message = convert.spec_message(JobSpec.model_validate(SPECS[1]))
    for path, value in changes.items():
        *parents, name = path.split("__")
        target: Any = message
        for parent in parents:
            target = getattr(target, parent)
        setattr(target, name, value)
    return message


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"hyperparameters__optimizer": pb.OPTIMIZER_UNSPECIFIED}, "optimizer must be one of"),
        ({"hyperparameters__optimizer": 99}, "got enum value 99"),
        ({"backprop": pb.BACKPROP_UNSPECIFIED}, "backprop must be one of"),
        ({"target_metric__mode": pb.TARGET_MODE_UNSPECIFIED}, "target_metric.mode"),
        ({"spb__mode": pb.SPB_MODE_UNSPECIFIED}, "spb must be one of"),
        ({"spb__fixed__full_fraction": 0.0}, "full_fraction"),
        ({"spb__fixed__partial_depth": math.nan}, "partial_depth"),
        ({"workers": 0}, "workers"),
        ({"hyperparameters__batch_size": 0}, "batch_size"),
        ({"workload": "os:system"}, "standard library"),
        ({"ooo_first_k": 0}, "ooo_first_k"),
    ],
)
def test_a_message_that_makes_no_valid_spec_is_refused(
    changes: dict[str, Any], needle: str
) -> None:
    with pytest.raises(ValueError, match=needle):
        convert.job_spec(_spec_message(**changes))


def test_an_empty_spec_message_is_refused_not_defaulted() -> None:
    with pytest.raises(ValueError, match="optimizer must be one of"):
        convert.job_spec(pb.JobSpec())
    with pytest.raises(ValueError, match="full_fraction"):
        convert.spb_config(pb.SPBConfig())
