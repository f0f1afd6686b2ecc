"""The job spec users submit (JSON over HTTP, YAML or JSON files in the CLI).

Unknown fields are refused everywhere (`extra="forbid"`), so a typo never silently
becomes a default; types are strict (`"workers": "2"` or `true` is refused, not
coerced) and floats finite (NaN reaches no database and no worker); pydantic reports
the field path of every error.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationInfo,
    field_validator,
    model_validator,
)

from jigsaw import elastic as elastic_batch
from jigsaw.codearchive import DIGEST_PATTERN

# Built-in workloads the training runtime ships (see worker_agent/), with the number of
# layers that own parameters in each model: the most stages SPB can cut it into. Known
# here, without torch, so that submission can refuse an impossible cut; a test checks
# the numbers against the real models.
BUILTIN_PARAMETER_LAYERS: dict[str, int] = {
    "digits-mlp": 2,
    "digits-cnn": 3,
    "text-transformer": 16,
    "resnet-synthetic": 19,
    "resnet18-synthetic": 41,
    "transformer-synthetic": 16,
}
BUILTIN_WORKLOADS: frozenset[str] = frozenset(BUILTIN_PARAMETER_LAYERS)
# The built-in workloads that support pipeline parallelism, with the most stages each can
# be cut into (a stage needs a transformer block); a test checks them against the trials.
BUILTIN_PIPELINE_STAGES: dict[str, int] = {
    "text-transformer": 2,
    "transformer-synthetic": 2,
}
# The training samples of each built-in workload: a batch its workers' shares of them
# cannot hold is refused at submission (the scheduler would choose an adaptive batch up to
# `batch.max`); a test checks them against the trials' data.
BUILTIN_TRAIN_SAMPLES: dict[str, int] = {
    "digits-mlp": 1437,
    "digits-cnn": 1437,
    "text-transformer": 14242,
    "resnet-synthetic": 1024,
    "resnet18-synthetic": 4096,
    "transformer-synthetic": 1024,
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
    "resnet18-synthetic": _CLASSIFICATION_METRICS,
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
_MAX_BATCH = 1_048_576  # samples in a global batch


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


# The trial's own hyperparameters: scalars or flat lists of them, a bounded number of
# bounded values, so a spec stays small in the database and in every launch command.
TRIAL_HYPERPARAMETERS_MAX = 64
TRIAL_HYPERPARAMETERS_MAX_JSON_BYTES = 16_384
_TrialScalar = bool | int | float | Annotated[str, StringConstraints(max_length=1024)]
TrialValue = _TrialScalar | Annotated[list[_TrialScalar], Field(max_length=1024)]
_TRIAL_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


class Hyperparameters(StrictModel):
    batch_size: int = Field(default=64, ge=1, le=_MAX_BATCH, description="Global batch size.")
    learning_rate: float = Field(default=0.01, gt=0, le=100, description="Learning rate.")
    optimizer: Literal["sgd", "adam", "kfac"] = Field(default="sgd", description="Optimizer.")
    trial: dict[str, TrialValue] = Field(
        default_factory=dict,
        description="The trial's own hyperparameters, passed to it as "
        "`context.hyperparameters.trial`: names of letters, digits and '_', values numbers, "
        f"strings, booleans or flat lists of them; at most {TRIAL_HYPERPARAMETERS_MAX}, "
        f"{TRIAL_HYPERPARAMETERS_MAX_JSON_BYTES} bytes as JSON.",
    )

    @field_validator("trial")
    @classmethod
    def _bounded(cls, trial: dict[str, TrialValue]) -> dict[str, TrialValue]:
        if len(trial) > TRIAL_HYPERPARAMETERS_MAX:
            raise ValueError(
                f"{len(trial)} trial hyperparameters: at most {TRIAL_HYPERPARAMETERS_MAX}"
            )
        bad = sorted(key for key in trial if not _TRIAL_KEY.fullmatch(key))
        if bad:
            raise ValueError(
                f"names {bad[:5]} are not identifiers of at most 64 letters, digits and '_'"
            )
        size = len(json.dumps(trial, separators=(",", ":")).encode())
        if size > TRIAL_HYPERPARAMETERS_MAX_JSON_BYTES:
            raise ValueError(
                f"{size} bytes as JSON: at most {TRIAL_HYPERPARAMETERS_MAX_JSON_BYTES}"
            )
        return trial


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


class ElasticRange(StrictModel):
    """The worker counts the scheduler may resize a job between, at lease boundaries."""

    min_workers: int = Field(ge=1, le=1024, description="Fewest workers the job runs on.")
    max_workers: int = Field(ge=1, le=1024, description="Most workers the job runs on.")


class BatchPolicy(StrictModel):
    """The global batch, and whether the scheduler may change it (goodput-aware)."""

    model_config = ConfigDict(serialize_by_alias=True, validate_by_name=False)

    global_: int | None = Field(
        default=None,
        alias="global",
        ge=1,
        le=_MAX_BATCH,
        description="Global batch size, kept whatever the worker count (default: "
        "`hyperparameters.batch_size`; set one of the two).",
    )
    min: int | None = Field(
        default=None, ge=1, le=_MAX_BATCH, description="Least global batch (adaptive only)."
    )
    max: int | None = Field(
        default=None, ge=1, le=_MAX_BATCH, description="Largest global batch (adaptive only)."
    )
    adaptive: bool = Field(
        default=False,
        description="The scheduler picks the global batch in [min, max] for goodput and "
        "the runtime scales the learning rate by AdaScale's gain ratio.",
    )


class JobSpec(StrictModel):
    name: str = Field(min_length=1, max_length=128, description="Human-readable job name.")
    workload: str = Field(description="A built-in workload name or `module:Class` of a user trial.")
    hyperparameters: Hyperparameters = Field(default_factory=Hyperparameters)
    workers: Annotated[int, Field(ge=1, le=1024)] = Field(
        default=1, description="Number of GPUs (data-parallel workers)."
    )
    max_iterations: int | None = Field(
        default=None,
        ge=1,
        le=10**12,
        description="Stop after this many iterations; with `batch.adaptive`, steps of the "
        "base batch (`batch.global`): a step at a larger batch counts as AdaScale's gain.",
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
    eval_every: int = Field(
        default=100,
        ge=1,
        le=10**9,
        description="Iterations between evaluations of the trial (and checks of target_metric).",
    )
    code: str | None = Field(
        default=None,
        pattern=DIGEST_PATTERN,
        description="`sha256:<hex>` of a code archive uploaded with `POST /v1/code` "
        "(`jigsaw submit --code DIR` uploads and sets it): the agents unpack it and put "
        "it first on the workers' import path, where `workload` is then found.",
    )
    elastic: ElasticRange | None = Field(
        default=None,
        description="Let the scheduler resize the job between these worker counts "
        "(null: always `workers`).",
    )
    batch: BatchPolicy | None = Field(
        default=None,
        description="The global batch policy (null: `hyperparameters.batch_size`, fixed).",
    )

    @model_validator(mode="before")
    @classmethod
    def _global_batch_in_hyperparameters(cls, data: Any) -> Any:
        """`batch.global` and `hyperparameters.batch_size` are one value: the one given
        fills the other, so everything downstream reads `hyperparameters.batch_size`. An
        invalid one is not copied: `batch.global` alone reports it."""
        if not isinstance(data, dict):
            return data
        batch, hyperparameters = data.get("batch"), data.get("hyperparameters", {})
        if (
            isinstance(batch, dict)
            and type(batch.get("global")) is int
            and 1 <= batch["global"] <= _MAX_BATCH
            and isinstance(hyperparameters, dict)
            and "batch_size" not in hyperparameters
        ):
            return {**data, "hyperparameters": {**hyperparameters, "batch_size": batch["global"]}}
        return data

    @property
    def max_micro_batch(self) -> int:
        """The per-worker batch the job asked for: on fewer workers it accumulates."""
        return -(-self.hyperparameters.batch_size // self.workers)

    def worker_counts(self) -> tuple[int, ...]:
        """The worker counts it may run on, largest first: `workers` alone unless
        elastic, else every count in its range its global batch splits over."""
        if self.elastic is None:
            return (self.workers,)
        counts = []
        for count in range(self.elastic.max_workers, self.elastic.min_workers - 1, -1):
            try:
                elastic_batch.split(self.hyperparameters.batch_size, count, self.max_micro_batch)
            except ValueError:
                continue
            counts.append(count)
        return tuple(counts)

    @property
    def adaptive(self) -> bool:
        return self.batch is not None and self.batch.adaptive

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

    @field_validator("elastic")
    @classmethod
    def _elastic_holds_workers(
        cls, elastic: ElasticRange | None, info: ValidationInfo
    ) -> ElasticRange | None:
        if elastic is None:
            return None
        workers = info.data.get("workers")
        if elastic.min_workers > elastic.max_workers:
            raise ValueError(
                f"min_workers ({elastic.min_workers}) is more than max_workers "
                f"({elastic.max_workers})"
            )
        if workers is not None and not elastic.min_workers <= workers <= elastic.max_workers:
            raise ValueError(
                f"workers ({workers}) must be within [min_workers, max_workers] = "
                f"[{elastic.min_workers}, {elastic.max_workers}]: the job starts at workers"
            )
        return elastic

    @field_validator("batch")
    @classmethod
    def _batch_bounds(cls, batch: BatchPolicy | None, info: ValidationInfo) -> BatchPolicy | None:
        if batch is None:
            return None
        hyperparameters: Hyperparameters | None = info.data.get("hyperparameters")
        size = hyperparameters.batch_size if hyperparameters is not None else None
        if batch.global_ is not None and size is not None and batch.global_ != size:
            raise ValueError(
                f"global ({batch.global_}) differs from hyperparameters.batch_size ({size}): "
                "both are the global batch, set one"
            )
        if not batch.adaptive and (batch.min is not None or batch.max is not None):
            raise ValueError("min and max bound an adaptive batch: set adaptive: true")
        if batch.min is not None and batch.max is not None and batch.min > batch.max:
            raise ValueError(f"min ({batch.min}) is more than max ({batch.max})")
        low = batch.min if batch.min is not None else size
        high = batch.max if batch.max is not None else size
        if size is not None and low is not None and high is not None and not low <= size <= high:
            raise ValueError(
                f"the global batch ({size}) must be within [min, max] = [{low}, {high}]"
            )
        return batch

    @model_validator(mode="after")
    def _elastic_runs_data_parallel(self) -> JobSpec:
        """Resizing and adaptive batches re-split the batch over workers and micro-batches,
        which the standard data-parallel schedule does; the others fix their split."""
        if self.elastic is None and not self.adaptive:
            return self
        what = "elastic" if self.elastic is not None else "batch.adaptive"
        if self.pipeline is not None:
            raise ValueError(f"{what} needs data parallelism: a pipeline has one stage per worker")
        if self.spb != "off" or self.backprop != "standard":
            raise ValueError(f"{what} needs spb: off and backprop: standard")
        if self.hyperparameters.optimizer == "kfac":
            raise ValueError(f"{what} does not work with optimizer: kfac (sgd or adam)")
        if self.elastic is not None and not self.adaptive:
            size = self.hyperparameters.batch_size
            if size % self.workers:
                raise ValueError(
                    f"hyperparameters.batch_size ({size}) must be a multiple of workers "
                    f"({self.workers}) for an elastic job: the global batch is kept exactly "
                    "at every size"
                )
        return self

    @model_validator(mode="after")
    def _batch_fits_builtin_data(self) -> JobSpec:
        """Each data-parallel replica trains on its share of the samples (the same number
        for all), which must hold its share of the largest batch the job may run at."""
        samples = BUILTIN_TRAIN_SAMPLES.get(self.workload)
        if samples is None:
            return self  # a user trial's data is known where it runs
        largest = self.hyperparameters.batch_size
        field = "hyperparameters.batch_size"
        if self.adaptive and self.batch is not None and self.batch.max is not None:
            largest, field = self.batch.max, "batch.max"
        stages = self.pipeline.stages if self.pipeline is not None else 1
        for workers in self.worker_counts():
            replicas = max(workers // stages, 1)
            if largest // replicas > samples // replicas:
                raise ValueError(
                    f"{field} ({largest}) is more than the {samples:,} training samples of "
                    f"{self.workload!r} hold on {workers} workers "
                    f"({samples // replicas * replicas:,}: a share of the samples each): "
                    f"lower {field}"
                )
        return self

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
