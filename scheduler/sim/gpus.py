"""The GPU a simulated cluster is made of: what a job's step time, solo utilization and
memory are on it, and which interference fit prices co-location there.

- `t4` (the default): the Pollux applications as profiled (on T4s). No utilization was
  measured there, so the rule is stated, not measured: a T4 is taken to be saturated
  while a worker computes (it has about a tenth of an H100's throughput, and batches
  that keep an H100 60-100% busy fill it), idle while it synchronises; a worker's solo
  utilization is its compute share of the step. Co-location is priced by the
  older-GPU fit (a T4 maps to the V100 fit in `scheduler.core.interference`).
- `h100`: the applications measured on an H100 (`h100_solo.json`, copied from
  `../shared/measurements/h100/solo-by-batch.jsonl`) run at the measured solo step
  time, utilization and peak memory at their per-GPU batch; their synchronisation stays
  the Pollux profile's. Stand-ins: `imagenet` is ResNet-50, `cifar10` is
  ResNet-18-CIFAR, `bert` is BERT-base. The other applications (deepspeech2, ncf,
  yolov3) and traces without an application keep their original profile and the T4
  rule. Co-location is priced by the H100 fit.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass
from enum import StrEnum
from functools import cache
from importlib import resources


class SimGPU(StrEnum):
    T4 = "t4"
    H100 = "h100"


# The device name the simulated agents would report (what `fitted().for_device` reads).
DEVICE_NAMES = {SimGPU.T4: "Tesla T4", SimGPU.H100: "NVIDIA H100 80GB HBM3"}
MEMORY_GIB = {SimGPU.T4: 16.0, SimGPU.H100: 80.0}
# Which measured model each Pollux application stands for on an H100.
H100_STAND_INS = {"imagenet": "resnet50", "cifar10": "resnet18-cifar", "bert": "bert-base"}


@dataclass(frozen=True)
class Solo:
    """One model alone on the GPU at one per-GPU batch."""

    step_seconds: float
    memory_bytes: int
    utilization: float  # 0-1


@dataclass(frozen=True)
class SoloSweep:
    """A model's solo runs by per-GPU batch, measured."""

    batches: tuple[float, ...]
    runs: tuple[Solo, ...]

    def at(self, batch: float) -> Solo:
        """Linear between measured batches; below the smallest, the smallest; above the
        largest, gradient accumulation over micro-batches of the largest (compute scales,
        memory and utilization do not)."""
        if batch <= self.batches[0]:
            return self.runs[0]
        if batch >= self.batches[-1]:
            last = self.runs[-1]
            return Solo(
                last.step_seconds * batch / self.batches[-1], last.memory_bytes, last.utilization
            )
        i = bisect.bisect_right(self.batches, batch)
        low, high = self.runs[i - 1], self.runs[i]
        t = (batch - self.batches[i - 1]) / (self.batches[i] - self.batches[i - 1])
        return Solo(
            low.step_seconds + t * (high.step_seconds - low.step_seconds),
            int(low.memory_bytes + t * (high.memory_bytes - low.memory_bytes)),
            low.utilization + t * (high.utilization - low.utilization),
        )


@cache
def h100_sweeps() -> dict[str, SoloSweep]:
    """The measured H100 solo sweeps, by model name."""
    text = resources.files("scheduler.sim").joinpath("h100_solo.json").read_text()
    sweeps = {}
    for model, rows in json.loads(text)["models"].items():
        ordered = sorted(rows, key=lambda r: r["batch"])
        sweeps[model] = SoloSweep(
            tuple(float(r["batch"]) for r in ordered),
            tuple(
                Solo(r["step_s"], int(r["peak_mem_gib"] * (1 << 30)), r["utilization_pct"] / 100)
                for r in ordered
            ),
        )
    return sweeps


def measured_solo(gpu: SimGPU, application: str) -> SoloSweep | None:
    """The measured sweep an application runs at on `gpu` (None: its original profile)."""
    if gpu is SimGPU.H100 and application in H100_STAND_INS:
        return h100_sweeps()[H100_STAND_INS[application]]
    return None
