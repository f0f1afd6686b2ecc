"""The job spec, SPB configurations and model profiles as `jigsaw.v2` messages and back.

The one typed conversion both processes use: the scheduler writes what the agent reads
and the agent writes what the scheduler reads, so each pair of functions here is the
other's inverse. Reading validates: a message that does not make a valid value raises
a ValueError that names the field (a pydantic ValidationError is one), never a
KeyError or a TypeError. Enums left UNSPECIFIED are invalid: every field is set.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, TypeVar

from jigsaw.jobspec import JobSpec, SPBConfig, SPBSetting
from jigsaw.proto.v2 import agent_pb2 as pb
from jigsaw.spb import SPBProfile, StageProfile

_Name = TypeVar("_Name", bound=str)

_OPTIMIZERS = {"sgd": pb.OPTIMIZER_SGD, "adam": pb.OPTIMIZER_ADAM, "kfac": pb.OPTIMIZER_KFAC}
_TARGET_MODES = {"max": pb.TARGET_MODE_MAX, "min": pb.TARGET_MODE_MIN}
_SPB_MODES = {"off": pb.SPB_MODE_OFF, "auto": pb.SPB_MODE_AUTO}
_BACKPROPS = {"standard": pb.BACKPROP_STANDARD, "ooo": pb.BACKPROP_OOO}
_PIPELINE_SCHEDULES = {
    "gpipe": pb.PIPELINE_SCHEDULE_GPIPE,
    "1f1b": pb.PIPELINE_SCHEDULE_1F1B,
    "zero-bubble": pb.PIPELINE_SCHEDULE_ZERO_BUBBLE,
}


def spec_message(spec: JobSpec) -> pb.JobSpec:
    message = pb.JobSpec(
        name=spec.name,
        workload=spec.workload,
        hyperparameters=pb.Hyperparameters(
            batch_size=spec.hyperparameters.batch_size,
            learning_rate=spec.hyperparameters.learning_rate,
            optimizer=_OPTIMIZERS[spec.hyperparameters.optimizer],
            trial_json=json.dumps(spec.hyperparameters.trial) if spec.hyperparameters.trial else "",
        ),
        workers=spec.workers,
        max_iterations=spec.max_iterations,
        priority=spec.priority,
        queue=spec.queue,
        spb=_spb_setting_message(spec.spb),
        backprop=_BACKPROPS[spec.backprop],
        ooo_first_k=spec.ooo_first_k,
        max_retries=spec.max_retries,
        eval_every=spec.eval_every,
        code=spec.code or "",
    )
    if spec.target_metric is not None:
        target = spec.target_metric
        message.target_metric.CopyFrom(
            pb.TargetMetric(name=target.name, value=target.value, mode=_TARGET_MODES[target.mode])
        )
    if spec.elastic is not None:
        message.elastic.CopyFrom(
            pb.Elastic(min_workers=spec.elastic.min_workers, max_workers=spec.elastic.max_workers)
        )
    if spec.batch is not None:
        batch = spec.batch
        message.batch.CopyFrom(
            pb.BatchPolicy(
                global_batch=batch.global_, min=batch.min, max=batch.max, adaptive=batch.adaptive
            )
        )
    if spec.pipeline is not None:
        pipeline = spec.pipeline
        message.pipeline.CopyFrom(
            pb.Pipeline(
                stages=pipeline.stages,
                schedule=_PIPELINE_SCHEDULES[pipeline.schedule],
                microbatches=pipeline.microbatches,
            )
        )
    return message


def job_spec(message: pb.JobSpec) -> JobSpec:
    """The spec `message` carries, validated as a submitted one is."""
    hyperparameters = message.hyperparameters
    data: dict[str, Any] = {
        "name": message.name,
        "workload": message.workload,
        "hyperparameters": {
            "batch_size": hyperparameters.batch_size,
            "learning_rate": hyperparameters.learning_rate,
            "optimizer": _name(_OPTIMIZERS, hyperparameters.optimizer, "optimizer"),
            "trial": _trial_hyperparameters(hyperparameters.trial_json),
        },
        "workers": message.workers,
        "max_iterations": _optional(message, "max_iterations"),
        "target_metric": None,
        "priority": message.priority,
        "queue": message.queue,
        "spb": _spb_setting(message.spb),
        "backprop": _name(_BACKPROPS, message.backprop, "backprop"),
        "ooo_first_k": _optional(message, "ooo_first_k"),
        "pipeline": None,
        "max_retries": message.max_retries,
        "code": message.code or None,
        "elastic": None,
        "batch": None,
    }
    if message.HasField("eval_every"):
        data["eval_every"] = message.eval_every
    if message.HasField("elastic"):
        elastic = message.elastic
        data["elastic"] = {
            "min_workers": elastic.min_workers,
            "max_workers": elastic.max_workers,
        }
    if message.HasField("batch"):
        batch = message.batch
        data["batch"] = {
            key: value
            for key, value in (
                ("global", _optional(batch, "global_batch")),
                ("min", _optional(batch, "min")),
                ("max", _optional(batch, "max")),
            )
            if value is not None
        } | {"adaptive": batch.adaptive}
    if message.HasField("target_metric"):
        target = message.target_metric
        data["target_metric"] = {
            "name": target.name,
            "value": target.value,
            "mode": _name(_TARGET_MODES, target.mode, "target_metric.mode"),
        }
    if message.HasField("pipeline"):
        pipeline = message.pipeline
        data["pipeline"] = {
            "stages": pipeline.stages,
            "schedule": _name(_PIPELINE_SCHEDULES, pipeline.schedule, "pipeline.schedule"),
            "microbatches": pipeline.microbatches,
        }
    return JobSpec.model_validate(data)


def spb_message(config: SPBConfig | None) -> pb.SPBConfig | None:
    """A command's configuration; None (off) leaves the command's field unset."""
    if config is None:
        return None
    return pb.SPBConfig(
        full_fraction=config.full_fraction,
        partial_depth=config.partial_depth,
        rotation_period=config.rotation_period,
        stages=config.stages,
    )


def spb_config(message: pb.SPBConfig) -> SPBConfig:
    return SPBConfig.model_validate(
        {
            "full_fraction": message.full_fraction,
            "partial_depth": message.partial_depth,
            "rotation_period": message.rotation_period,
            "stages": _optional(message, "stages"),
        }
    )


def profile_message(profile: SPBProfile) -> pb.ModelProfile:
    """Raises a ValueError or TypeError when `profile`'s values are not numbers (a
    worker's trial code can forge what it reports)."""
    return pb.ModelProfile(
        workload=profile.workload,
        per_worker_batch=profile.per_worker_batch,
        stages=[pb.StageProfile(**vars(stage)) for stage in profile.stages],
        steps_ratio=dict(profile.steps_ratio),
    )


def model_profile(message: pb.ModelProfile) -> SPBProfile:
    """The profile `message` carries (its values are checked by whoever stores it)."""
    return SPBProfile(
        workload=message.workload,
        per_worker_batch=message.per_worker_batch,
        stages=tuple(
            StageProfile(
                forward_seconds=stage.forward_seconds,
                backward_input_seconds=stage.backward_input_seconds,
                backward_weight_seconds=stage.backward_weight_seconds,
                activation_bytes=stage.activation_bytes,
                parameter_bytes=stage.parameter_bytes,
            )
            for stage in message.stages
        ),
        steps_ratio=dict(message.steps_ratio),
    )


def _spb_setting_message(setting: SPBSetting) -> pb.SPBSetting:
    if isinstance(setting, SPBConfig):
        return pb.SPBSetting(fixed=spb_message(setting))
    return pb.SPBSetting(mode=_SPB_MODES[setting])


def _spb_setting(message: pb.SPBSetting) -> str | dict[str, Any]:
    if message.WhichOneof("setting") == "fixed":
        return spb_config(message.fixed).model_dump()
    return _name(_SPB_MODES, message.mode, "spb")


def _trial_hyperparameters(text: str) -> Any:
    """The JSON object `text` holds ({} when empty); what it holds is validated with
    the rest of the spec."""
    if not text:
        return {}
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ValueError(f"hyperparameters.trial is not JSON: {exc}") from None


def _optional(message: Any, field: str) -> Any:
    return getattr(message, field) if message.HasField(field) else None


def _name(names: Mapping[_Name, int], value: int, field: str) -> _Name:
    """The spec's name of an enum value; unset or unknown values are invalid."""
    for name, number in names.items():
        if number == value:
            return name
    raise ValueError(f"{field} must be one of {sorted(names)}, got enum value {value}")
