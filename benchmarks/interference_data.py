"""The co-location measurements the interference model is fitted to, as pairs.

From `../shared/measurements/` beside the checkout (read its READMEs):
  * `h100/`: pairs of jobs on one H100 under plain time slicing (`spb-and-pairs-batch*`)
    and under CUDA MPS (`mps-pairs-*`), each job's speed normalized to its own speed alone
    in the same mode; each job's solo utilization is NVML's mean in `solo-by-batch.jsonl`
    at its per-GPU batch. A partial SPB worker (`frozen_stages` > 0) was not swept alone:
    it is given the utilization of the full job at the same batch (it runs the same
    forward and a shorter backward, so it keeps the GPU about as busy). The SPB host of
    `spb-host-with-guest.jsonl` computes its partial step at that utilization, then idles
    `gap_s` (as at an all-reduce): a pair there carries both phases' lengths.
  * `gavel/`: Gavel's pairs on K80, P100 and V100 (throughputs together and alone); no
    utilization, so a pair names its job types and the fit gives each type an intensity.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MEASUREMENTS = Path(__file__).resolve().parents[2] / "shared" / "measurements"
# Per-GPU batch of the "1x" runs (the README); the 2x and 4x files multiply it.
H100_BATCH = {"resnet50": 64, "resnet18-cifar": 128, "bert-base": 32}
TIME_SLICING_FILES = {
    "spb-and-pairs-batch1x.jsonl": 1,
    "spb-and-pairs-batch2x.jsonl": 2,
    "spb-and-pairs-batch4x.jsonl": 4,
}
MPS_FILES = {"mps-pairs-batch1x.jsonl": 1, "mps-pairs-batch4x.jsonl": 4}
GAVEL_GENERATIONS = ("k80", "p100", "v100")


class MeasurementsError(ValueError):
    """A measurement file is missing or not in the expected form."""


@dataclass(frozen=True)
class Pair:
    """Two jobs measured together on one GPU."""

    jobs: tuple[str, str]  # job labels ("resnet50@64", "ResNet-50 (batch size 64)")
    speeds: tuple[float, float]  # each one's speed together / alone
    utilizations: tuple[float, float] | None  # measured solo demands; None: fitted
    # The first job's (compute, idle) seconds per step when it computes only part of it
    # and idles the rest; None: it computes throughout.
    host_phases: tuple[float, float] | None = None

    @property
    def combined(self) -> float:
        return self.speeds[0] + self.speeds[1]


def _lines(path: Path) -> Iterator[dict[str, Any]]:
    try:
        text = path.read_text()
    except OSError as error:
        raise MeasurementsError(f"cannot read {path}: {error}") from error
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                yield json.loads(line)
            except json.JSONDecodeError as error:
                raise MeasurementsError(f"{path}:{number}: {error}") from error


def solo_utilization(root: Path = MEASUREMENTS) -> dict[tuple[str, int], float]:
    """NVML utilization (0-1) of each model alone, by per-GPU batch."""
    return {
        (row["model"], int(row["batch"])): min(1.0, row["nvml_util_mean"] / 100.0)
        for row in _lines(root / "h100" / "solo-by-batch.jsonl")
        if row["part"] == "sweep"
    }


def _label(job: dict[str, Any], batch: int) -> str:
    partial = f" partial {5 - job['frozen_stages']}/5" if job["frozen_stages"] else ""
    return f"{job['model']}@{batch}{partial}"


def h100_pairs(files: dict[str, int], root: Path = MEASUREMENTS) -> list[Pair]:
    """The pairs of the given H100 files (name: batch multiple)."""
    solo = solo_utilization(root)
    pairs = []
    for name, scale in files.items():
        for row in _lines(root / "h100" / name):
            if row["part"] != "pair":
                continue
            jobs = row["jobs"]
            batches = [H100_BATCH[job["model"]] * scale for job in jobs]
            pairs.append(
                Pair(
                    jobs=(_label(jobs[0], batches[0]), _label(jobs[1], batches[1])),
                    speeds=(1.0 - jobs[0]["slowdown"], 1.0 - jobs[1]["slowdown"]),
                    utilizations=(
                        solo[jobs[0]["model"], batches[0]],
                        solo[jobs[1]["model"], batches[1]],
                    ),
                )
            )
    return pairs


def host_with_guest_pairs(root: Path = MEASUREMENTS) -> list[Pair]:
    """The SPB host (a partial ResNet-50 worker idling at its all-reduce) with a guest."""
    solo = solo_utilization(root)
    pairs = []
    scale, phases = 0.0, (0.0, 0.0)
    for row in _lines(root / "h100" / "spb-host-with-guest.jsonl"):
        if row["part"] == "env":
            scale = row["batch_scale"]
        elif row["part"] == "calibrate":
            phases = (row["partial_step_s"], row["gap_s"])
        elif row["part"] == "host+guest":
            host, guest = row["jobs"]
            batches = [int(H100_BATCH[job["model"]] * scale) for job in (host, guest)]
            pairs.append(
                Pair(
                    jobs=(_label(host, batches[0]) + " host", _label(guest, batches[1])),
                    speeds=(host["normalized"], guest["normalized"]),
                    utilizations=(
                        solo[host["model"], batches[0]],
                        solo[guest["model"], batches[1]],
                    ),
                    host_phases=phases,
                )
            )
    return pairs


def gavel_pairs(generation: str, root: Path = MEASUREMENTS) -> list[Pair]:
    """Gavel's single-GPU pairs on one generation, each unordered pair once. Left out:
    pairs that did not fit in memory (a zero throughput) and pairs whose two speeds
    equal their solo speeds exactly (filler, per the README)."""
    path = root / "gavel" / "simulation_throughputs.json"
    try:
        table = json.loads(path.read_text())[generation]
    except (OSError, json.JSONDecodeError, KeyError) as error:
        raise MeasurementsError(f"cannot read {generation} from {path}: {error}") from error
    types = [key for key in table if ast.literal_eval(key)[1] == 1]
    pairs = []
    for i, first in enumerate(types):
        for second in types[i:]:
            together = table[first][second]
            alone = (table[first]["null"], table[second]["null"])
            if min(together) <= 0.0 or tuple(together) == alone:
                continue
            pairs.append(
                Pair(
                    jobs=(ast.literal_eval(first)[0], ast.literal_eval(second)[0]),
                    speeds=(together[0] / alone[0], together[1] / alone[1]),
                    utilizations=None,
                )
            )
    return pairs
