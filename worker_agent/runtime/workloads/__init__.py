"""Built-in workloads by name, and loading of user trials by `package.module:Class`.

Loading a user trial runs its module's code: only the training process does it (see
`runtime.worker`); the scheduler checks the reference's form alone
(`jigsaw.jobspec.checked_workload`).
"""

from __future__ import annotations

import importlib

from worker_agent.runtime.trial import Trial
from worker_agent.runtime.workloads.digits import DigitsCNN, DigitsMLP
from worker_agent.runtime.workloads.synthetic import (
    ResNet18Synthetic,
    ResNetSynthetic,
    TransformerSynthetic,
)
from worker_agent.runtime.workloads.text import TextTransformer

BUILTIN_TRIALS: dict[str, type[Trial]] = {
    "digits-mlp": DigitsMLP,
    "digits-cnn": DigitsCNN,
    "text-transformer": TextTransformer,
    "resnet-synthetic": ResNetSynthetic,
    "resnet18-synthetic": ResNet18Synthetic,
    "transformer-synthetic": TransformerSynthetic,
}


class WorkloadError(ValueError):
    """A workload name or reference that does not resolve to a Trial class."""


def load_trial(name_or_ref: str) -> type[Trial]:
    """The Trial class of a built-in name or of a `package.module:Class` reference."""
    if name_or_ref in BUILTIN_TRIALS:
        return BUILTIN_TRIALS[name_or_ref]
    module_name, sep, class_name = name_or_ref.partition(":")
    if not sep or not module_name or not class_name:
        raise WorkloadError(
            f"unknown workload {name_or_ref!r}: use one of {sorted(BUILTIN_TRIALS)} "
            "or 'package.module:TrialClass'"
        )
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise WorkloadError(
            f"{exc} (importing workload {name_or_ref!r}): upload your code with "
            "`jigsaw submit --code DIR` or install it on the agents"
        ) from exc
    except Exception as exc:  # noqa: BLE001 - whatever user code raises, the job says it
        raise WorkloadError(
            f"cannot import module {module_name!r} of workload {name_or_ref!r}: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    trial = getattr(module, class_name, None)
    if trial is None:
        raise WorkloadError(f"module {module_name!r} has no attribute {class_name!r}")
    if not (isinstance(trial, type) and issubclass(trial, Trial)):
        raise WorkloadError(
            f"{name_or_ref!r} is not a subclass of worker_agent.runtime.trial.Trial"
        )
    return trial
