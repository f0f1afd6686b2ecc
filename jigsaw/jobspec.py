"""The job spec users submit (JSON over HTTP, YAML or JSON files in the CLI).

Unknown fields are refused everywhere (`extra="forbid"`), so a typo never silently
becomes a default; types are strict (`"workers": "2"` or `true` is refused, not
coerced) and floats finite (NaN reaches no database and no worker); pydantic reports
the field path of every error.
"""

from __future__ import annotations

import re
import sys
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

# Built-in workloads the training runtime ships (see worker_agent/), with the number of
# layers that own parameters in each model: the most stages SPB can cut it into. Known
# here, without torch, so that submission can refuse an impossible cut; a test checks
# the numbers against the real models.
BUILTIN_PARAMETER_LAYERS: dict[str, int] = {
    "digits-mlp": 2,
    "digits-cnn": 3,
    "text-transformer": 16,
    "resnet-synthetic": 19,
    "transformer-synthetic": 16,
}
BUILTIN_WORKLOADS: frozenset[str] = frozenset(BUILTIN_PARAMETER_LAYERS)
# The built-in workloads that support pipeline parallelism, with the most stages each can
# be cut into (a stage needs a transformer block); a test checks them against the trials.
BUILTIN_PIPELINE_STAGES: dict[str, int] = {
    "text-transformer": 2,
    "transformer-synthetic": 2,
}
# The metrics each built-in workload's evaluation reports, so that a target metric it
# never reports is refused at submission, not found out after a launch; a test checks
# them against the trials' evaluations.
_CLASSIFICATION_METRICS = frozenset({"accuracy", "loss"})
_LANGUAGE_MODEL_METRICS = frozenset({"loss", "perplexity"})
BUILTIN_METRICS: dict[str, frozenset[str]] = {
    "digits-mlp": _CLASSIFICATION_METRICS,
    "digits-cnn": _CLASSIFICATION_METRICS,
    "text-transformer": _LANGUAGE_MODEL_METRICS,
    "resnet-synthetic": _CLASSIFICATION_METRICS,
    "transformer-synthetic": _LANGUAGE_MODEL_METRICS,
}

# `package.module:ClassName` of a user trial (matched whole: no trailing newline).
_IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
_TRIAL_REF = re.compile(rf"(?P<top>{_IDENTIFIER})(\.{_IDENTIFIER})*:{_IDENTIFIER}")
# Top-level modules no user trial lives in: the standard library's and the control
# plane's (naming one would only run its module code in a worker). A user's own package
# may be installed where it runs.
_FOREIGN_MODULES = frozenset(
    sys.stdlib_module_names | {"__main__", "api", "scheduler", "migrations"}
)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def checked_workload(value: str) -> str:
    """`value` if it names a built-in workload or a `package.module:Class` trial.

    Checked by its form alone, nothing is imported. A trial is the user's own module:
    one of the standard library (`os:system`, `this:Trial`) or of the control plane
    (`api.server:serve`) holds no Trial, and importing it would only run its module
    code, so it is refused here.
    """
    if value in BUILTIN_WORKLOADS:
        return value
    ref = _TRIAL_REF.fullmatch(value)
    if ref is None:
        raise ValueError(
            f"unknown workload {value!r}: use one of {sorted(BUILTIN_WORKLOADS)} "
            "or 'package.module:TrialClass'"
        )
    top = ref.group("top")
    if top in _FOREIGN_MODULES:
        raise ValueError(
            f"workload {value!r} names module {top!r} of the standard library or of "
            "JigSaw's control plane, not a user trial: use 'package.module:TrialClass' of "
            f"your own trial module, or one of {sorted(BUILTIN_WORKLOADS)}"
        )
    return value


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class Hyperparameters(StrictModel):
    batch_size: int = Field(default=64, ge=1, le=1_048_576, description="Global batch size.")
    learning_rate: float = Field(default=0.01, gt=0, le=100, description="Learning rate.")
    optimizer: Literal["sgd", "adam", "kfac"] = Field(default="sgd", description="Optimizer.")


class TargetMetric(StrictModel):
    name: str = Field(min_length=1, max_length=64, description="Evaluation metric name.")
    value: float = Field(description="Stop when the metric reaches this value.")
    mode: Literal["max", "min"] = Field(
        default="max", description="Whether larger (`max`) or smaller (`min`) is better."
    )

    def reached_by(self, value: float) -> bool:
        return value >= self.value if self.mode == "max" else value <= self.value


class SPBConfig(StrictModel):
    """A fixed structured partial backprop configuration."""

    full_fraction: float = Field(
        gt=0, le=1, description="Fraction of workers that backpropagate through every stage."
    )
    partial_depth: float = Field(
        gt=0, le=1, description="Fraction of stages (from the top) the other workers train."
    )
    rotation_period: int = Field(
        default=0, ge=0, description="Iterations between role rotations (0 = fixed roles)."
    )
    stages: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description="Cut the model into this many stages of about equal parameter count "
        "(default: the stages the trial declares).",
    )


SPBSetting = Literal["off", "auto"] | SPBConfig

PipelineSchedule = Literal["gpipe", "1f1b", "zero-bubble"]


class PipelineConfig(StrictModel):
    """Pipeline parallelism: the model cut into consecutive stages, one per worker."""

    stages: int = Field(
        ge=2,
        le=1024,
        description="Pipeline stages, one per worker: must equal `workers` (a pipeline is "
        "not replicated for data parallelism).",
    )
    schedule: PipelineSchedule = Field(
        default="zero-bubble",
        description="`gpipe` (all forwards, then all backwards), `1f1b` (one forward, one "
        "backward), or `zero-bubble` (1F1B with each backward split into its input part, "
        "sent upstream at once, and its weight part, run later to fill bubbles).",
    )
    microbatches: int = Field(
        default=4,
        ge=1,
        le=65_536,
        description="Microbatches each iteration's batch is split into; must divide "
        "`hyperparameters.batch_size`.",
    )


class JobSpec(StrictModel):
    name: str = Field(min_length=1, max_length=128, description="Human-readable job name.")
    workload: str = Field(description="A built-in workload name or `module:Class` of a user trial.")
    hyperparameters: Hyperparameters = Field(default_factory=Hyperparameters)
    workers: Annotated[int, Field(ge=1, le=1024)] = Field(
        default=1, description="Number of GPUs (data-parallel workers)."
    )
    max_iterations: int | None = Field(
        default=None, ge=1, le=10**12, description="Stop after this many iterations."
    )
    target_metric: TargetMetric | None = Field(
        default=None, description="Stop when an evaluation reaches this metric value."
    )
    priority: int = Field(default=0, ge=-100, le=100, description="Higher runs first.")
    queue: str = Field(
        default="default",
        min_length=1,
        max_length=64,
        description="The queue it is submitted to (`jigsaw queue list`); it must exist and admit "
        "the submitting user.",
    )
    spb: SPBSetting = Field(default="off", description="`off`, `auto`, or a fixed config.")
    backprop: Literal["standard", "ooo"] = Field(
        default="standard", description="Backprop schedule: standard or out-of-order."
    )
    ooo_first_k: int | None = Field(
        default=None,
        ge=1,
        le=100_000,
        description="With backprop ooo on several workers: how many layers from the input "
        "compute weight gradients after the output-gradient chain (reverse first-k); "
        "null: the platform chooses, in stages, from the model's measured costs and the "
        "link speed measured at start.",
    )
    pipeline: PipelineConfig | None = Field(
        default=None,
        description="Train pipeline parallel: the model cut into stages, one per worker "
        "(null: data parallel).",
    )
    max_retries: int = Field(
        default=0, ge=0, le=10, description="Relaunches after a training process crashes."
    )

    @field_validator("name", "queue")
    @classmethod
    def _simple_name(cls, value: str) -> str:
        if not _NAME.fullmatch(value):
            raise ValueError(
                "must start with a letter or digit and hold only letters, digits, '.', '_', '-'"
            )
        return value

    @field_validator("workload")
    @classmethod
    def _known_workload(cls, value: str) -> str:
        return checked_workload(value)

    @field_validator("target_metric")
    @classmethod
    def _metric_is_reported(
        cls, target: TargetMetric | None, info: ValidationInfo
    ) -> TargetMetric | None:
        reported = BUILTIN_METRICS.get(info.data.get("workload", ""))
        if target is not None and reported is not None and target.name not in reported:
            raise ValueError(
                f"workload {info.data['workload']!r} reports no metric {target.name!r}: "
                f"its evaluation reports {sorted(reported)}"
            )
        return target

    @field_validator("pipeline")
    @classmethod
    def _pipeline_fits_the_job(
        cls, pipeline: PipelineConfig | None, info: ValidationInfo
    ) -> PipelineConfig | None:
        """Checked against the fields before it (absent where those were invalid)."""
        if pipeline is None:
            return None
        job = info.data
        workload, workers = job.get("workload"), job.get("workers")
        if workers is not None and pipeline.stages != workers:
            raise ValueError(
                f"pipeline.stages ({pipeline.stages}) must equal workers ({workers}): each "
                "worker runs one stage"
            )
        if workload in BUILTIN_WORKLOADS:
            most = BUILTIN_PIPELINE_STAGES.get(workload)
            if most is None:
                raise ValueError(
                    f"workload {workload!r} does not support pipeline parallelism: use one of "
                    f"{sorted(BUILTIN_PIPELINE_STAGES)} or a trial that implements "
                    "Trial.pipeline"
                )
            if pipeline.stages > most:
                raise ValueError(
                    f"pipeline.stages ({pipeline.stages}) is more than the {most} transformer "
                    f"blocks of {workload!r}: a stage needs at least one block"
                )
        hyperparameters: Hyperparameters | None = job.get("hyperparameters")
        if hyperparameters is not None:
            if hyperparameters.batch_size % pipeline.microbatches:
                raise ValueError(
                    f"hyperparameters.batch_size ({hyperparameters.batch_size}) is not a "
                    f"multiple of pipeline.microbatches ({pipeline.microbatches}): "
                    "microbatches are equal parts of the batch"
                )
            if hyperparameters.optimizer == "kfac":
                raise ValueError(
                    "pipeline does not work with optimizer: kfac: K-FAC preconditions every "
                    "layer of the model on each worker, and a stage holds only its own"
                )
        if job.get("spb", "off") != "off":
            raise ValueError(
                "pipeline needs spb: off: SPB averages each stage's gradient over the "
                "workers that train it, and in a pipeline every stage has one worker"
            )
        if job.get("backprop") == "ooo":
            raise ValueError(
                "pipeline needs backprop: standard: out-of-order backprop reorders a "
                "data-parallel exchange a pipeline does not have; pipeline.schedule "
                "zero-bubble is the pipeline's own split of backward into input and weight "
                "parts"
            )
        return pipeline

    @model_validator(mode="after")
    def _has_stopping_rule(self) -> JobSpec:
        if self.max_iterations is None and self.target_metric is None:
            raise ValueError("set max_iterations, target_metric, or both: a job must end")
        if (
            isinstance(self.spb, SPBConfig)
            and self.spb.stages is not None
            and self.spb.stages > BUILTIN_PARAMETER_LAYERS.get(self.workload, self.spb.stages)
        ):
            raise ValueError(
                f"spb.stages ({self.spb.stages}) is more than the "
                f"{BUILTIN_PARAMETER_LAYERS[self.workload]} layers with parameters of "
                f"{self.workload!r}: a stage needs at least one layer"
            )
        # A pipeline's stages all see the whole batch; data-parallel workers split it.
        if self.pipeline is None and self.hyperparameters.batch_size < self.workers:
            raise ValueError(
                f"hyperparameters.batch_size ({self.hyperparameters.batch_size}) is smaller "
                f"than workers ({self.workers}): every worker needs at least one sample"
            )
        return self
