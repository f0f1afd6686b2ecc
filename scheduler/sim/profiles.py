"""SPB profiles for simulated jobs: measured ones from files, or first-principles defaults.

The runtime's profiler (`jigsaw profile`) writes `jigsaw.spb.SPBProfile` JSON; give
the simulator a directory of such files and each job uses the profile named after its
application, else the one named after its model family (`resnet-synthetic` serves
cifar10, imagenet and yolov3). Until measured profiles exist, `default_profile` builds
one per family from first principles. THESE DEFAULTS ARE NOT MEASUREMENTS: stage
sizes are rough shapes of the published architectures, backward costs twice forward
(split evenly between input and weight gradients), and the statistical price of each
SPB configuration (`steps_ratio`) is an assumption, stated below.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from jigsaw.jobspec import SPBConfig
from jigsaw.spb import SPBProfile, StageProfile, config_key
from scheduler.policies.jigsaw.params import CONFIGS

# Which model family each Pollux application belongs to; anything else is "generic".
FAMILY = {
    "cifar10": "resnet",  # ResNet-18
    "imagenet": "resnet",  # ResNet-50
    "yolov3": "resnet",  # Darknet-53 backbone: a residual CNN
    "bert": "transformer",
    "deepspeech2": "rnn",  # convolutions, then recurrent layers
    "ncf": "mlp",  # embeddings, then a small MLP
}

_MIB = 1 << 20


@dataclass(frozen=True)
class _Family:
    """Relative shape of four stages (input side first) at `batch` samples per GPU."""

    batch: int
    forward: tuple[float, ...]  # relative forward time per stage
    parameters_mib: tuple[float, ...]
    activations_mib: tuple[float, ...]


# CNNs keep large activations low and most parameters high; transformers are uniform;
# recommenders keep their parameters in the bottom embeddings.
_FAMILIES = {
    "resnet": _Family(32, (0.3, 0.3, 0.25, 0.15), (1.0, 5.0, 28.0, 64.0), (1600, 1000, 600, 200)),
    "transformer": _Family(12, (0.25,) * 4, (96.0, 80.0, 80.0, 80.0), (900,) * 4),
    "rnn": _Family(20, (0.4, 0.2, 0.2, 0.2), (2.0, 40.0, 40.0, 40.0), (2000, 800, 800, 800)),
    "mlp": _Family(1024, (0.4, 0.2, 0.2, 0.2), (400.0, 8.0, 2.0, 1.0), (50, 40, 20, 10)),
    "generic": _Family(32, (0.25,) * 4, (50.0,) * 4, (500,) * 4),
}
# Applications whose inputs make their activations far from their family's: CIFAR-10's
# 32x32 images (ResNet-18), YOLOv3's 416x416 ones (Darknet-53).
_APPLICATIONS = {
    "cifar10": _Family(128, (0.3, 0.3, 0.25, 0.15), (0.6, 2.0, 8.0, 32.0), (800, 400, 250, 150)),
    "yolov3": _Family(8, (0.3, 0.3, 0.25, 0.15), (2.0, 10.0, 60.0, 160.0), (3000, 2000, 1200, 600)),
}


def assumed_steps_ratio(config: SPBConfig) -> float:
    """ASSUMED statistical price (steps relative to full backprop): up to 20% more,
    in proportion to the share of workers that are partial times the share of stages
    they skip. A placeholder until the runtime measures steps to target per
    configuration; measured `steps_ratio` values in a profile file replace it."""
    return 1.0 + 0.2 * (1.0 - config.full_fraction) * (1.0 - config.partial_depth)


def default_profile(name: str) -> SPBProfile:
    """The default of an application (or a model family) named `name`."""
    if name in _APPLICATIONS:
        shape = _APPLICATIONS[name]
    else:
        name = name if name in _FAMILIES else family_of(name)
        shape = _FAMILIES[name]
    return SPBProfile(
        workload=f"default-{name}",
        per_worker_batch=shape.batch,
        stages=tuple(
            StageProfile(
                forward_seconds=forward,
                backward_input_seconds=forward,
                backward_weight_seconds=forward,
                activation_bytes=int(activations * _MIB),
                parameter_bytes=int(parameters * _MIB),
            )
            for forward, parameters, activations in zip(
                shape.forward, shape.parameters_mib, shape.activations_mib, strict=True
            )
        ),
        steps_ratio={config_key(c): assumed_steps_ratio(c) for c in CONFIGS},
    )


def family_of(workload: str) -> str:
    return FAMILY.get(workload, "generic")


def load_profiles(directory: Path) -> dict[str, SPBProfile]:
    """Every `*.json` SPB profile in `directory`, by its `workload` name."""
    if not directory.is_dir():
        raise ValueError(f"{directory}: not a directory of SPB profiles")
    profiles = {}
    for path in sorted(directory.glob("*.json")):
        try:
            profile = SPBProfile.from_json(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}: not an SPB profile ({exc})") from exc
        profiles[profile.workload] = profile
    return profiles


def profile_for(workload: str, measured: Mapping[str, SPBProfile]) -> SPBProfile:
    """The measured profile of this workload or of its family, else the default."""
    if workload in measured:
        return measured[workload]
    family = family_of(workload)
    for name in sorted(measured):
        if name.startswith(family):
            return measured[name]
    return default_profile(workload)


def memory_per_gpu(profile: SPBProfile, micro_batch: float) -> tuple[int, float]:
    """Bytes per GPU at full backprop (weights, gradients and two optimizer moments,
    saved activations at this per-GPU batch, 1 GiB of workspace) and the share of it
    in activations."""
    parameters = sum(stage.parameter_bytes for stage in profile.stages)
    activations = sum(stage.activation_bytes for stage in profile.stages)
    activations = int(activations * micro_batch / profile.per_worker_batch)
    total = 4 * parameters + activations + 1024 * _MIB
    return total, activations / total
