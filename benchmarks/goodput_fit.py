"""The goodput model against the Pollux applications' measurements.

For each of the six applications (`apps/<app>/` of the Pollux artifact's profiles):

- throughput: `fit_throughput` on the measured step times (`placements.csv`,
  `scalability.csv`), the fitted parameters, and the error of predicted step times on
  measurements held out of the fit: a random quarter fitted, the rest predicted; up to
  k GPUs fitted, k+1 to 2k predicted (a job growing, as Pollux lets it, to twice the
  most GPUs it has run on); a job's first runs (one GPU; then also one node of 4 and two
  of 4, at one per-GPU batch) fitted, every size up to 16 GPUs predicted.
- statistical efficiency: E(B) from each epoch's `grad_sqr` and `grad_var`
  (`validation-<B>.csv`) against the efficiency AdaptDL recorded in the same row (the
  statistical progress it counted over the epoch, per sample, relative to the base
  batch).
- the adaptive batch: with the throughput fitted on every measurement and the gradient
  noise of mid-training, the batch `best_batch` picks by size, and the speedup over one
  GPU against keeping the base batch.

    python -m benchmarks.goodput_fit [--apps DIR] [--json | --markdown]

`--markdown` prints docs/results/goodput.md.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import emit, markdown_table
from jigsaw.gradnoise import GradParams, efficiency
from scheduler.core.goodput import (
    BatchLimits,
    GoodputModel,
    PerfParams,
    StepSample,
    fit_throughput,
    profile_samples,
)

APPS = Path(__file__).resolve().parents[2] / "shared/traces/pollux/apps"
# The largest per-GPU batch where the artifact sets one below what was measured.
MAX_PER_GPU = {"yolov3": 8}
SIZES = ((1, 1), (4, 1), (8, 2), (16, 4), (64, 16))


@dataclass(frozen=True)
class App:
    name: str
    samples: list[StepSample]
    validation: dict[int, list[dict[str, str]]]  # rows by global batch

    @property
    def base_batch(self) -> int:
        return min(self.validation)


def load_app(directory: Path) -> App:
    samples = []
    for name in ("placements.csv", "scalability.csv"):
        with (directory / name).open() as rows:
            samples += profile_samples(csv.DictReader(rows))
    validation = {}
    for path in directory.glob("validation-*.csv"):
        with path.open() as rows:
            validation[int(path.stem.split("-")[1])] = list(csv.DictReader(rows))
    if not validation:
        raise ValueError(f"{directory}: no validation-<batch>.csv")
    return App(directory.name, samples, validation)


def _errors(params: PerfParams, samples: list[StepSample]) -> tuple[float, float, float]:
    """Median and 90th percentile of |predicted / measured - 1|, and the median signed
    error (below zero: predicted faster than measured)."""
    predicted = np.array(
        [params.step_seconds(s.nodes, s.workers, s.per_gpu, s.accum_steps) for s in samples]
    )
    relative = predicted / np.array([s.step_seconds for s in samples]) - 1.0
    return (
        float(np.median(np.abs(relative))),
        float(np.percentile(np.abs(relative), 90)),
        float(np.median(relative)),
    )


Split = Callable[[list[StepSample]], tuple[list[StepSample], list[StepSample]]]


def _random_quarter(samples: list[StepSample]) -> tuple[list[StepSample], list[StepSample]]:
    order = np.random.default_rng(0).permutation(len(samples))
    quarter = len(samples) // 4
    return [samples[i] for i in order[:quarter]], [samples[i] for i in order[quarter:]]


def _grow(limit: int) -> Split:
    def split(samples: list[StepSample]) -> tuple[list[StepSample], list[StepSample]]:
        return (
            [s for s in samples if s.workers <= limit],
            [s for s in samples if limit < s.workers <= 2 * limit],
        )

    return split


def _first_runs(sizes: set[tuple[int, int]]) -> Split:
    """The job's runs at these (nodes, GPUs) at its middle per-GPU batch."""

    def split(samples: list[StepSample]) -> tuple[list[StepSample], list[StepSample]]:
        batches = sorted({s.per_gpu for s in samples})
        middle = batches[len(batches) // 2]
        seen = [s for s in samples if (s.nodes, s.workers) in sizes and s.per_gpu == middle]
        return seen, [s for s in samples if s.workers <= 16 and s not in seen]

    return split


SCENARIOS: dict[str, Split] = {
    "all, in sample": lambda samples: (samples, samples),
    "random 1/4 -> rest": _random_quarter,
    "<=4 GPUs -> 5-8": _grow(4),
    "<=8 GPUs -> 9-16": _grow(8),
    "<=16 GPUs -> 17-32": _grow(16),
    "1 GPU run -> <=16": _first_runs({(1, 1)}),
    "1, 1x4, 2x4 runs -> <=16": _first_runs({(1, 1), (1, 4), (2, 8)}),
}


def throughput_rows(apps: list[App]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(fitted parameters by application, step-time errors by application and split)."""
    params_rows, error_rows = [], []
    for app in apps:
        fitted = fit_throughput(app.samples)
        median, p90, _ = _errors(fitted, app.samples)
        params_rows.append(
            {
                "app": app.name,
                "samples": len(app.samples),
                **{k: round(v, 6) for k, v in asdict(fitted).items()},
                "median_error": median,
                "p90_error": p90,
            }
        )
        for scenario, split in SCENARIOS.items():
            train, test = split(app.samples)
            median, p90, bias = _errors(fit_throughput(train), test)
            error_rows.append(
                {
                    "app": app.name,
                    "fit -> predicted": scenario,
                    "fitted": len(train),
                    "predicted": len(test),
                    "median_error": median,
                    "p90_error": p90,
                    "median_bias": bias,
                }
            )
    return params_rows, error_rows


def _recorded_efficiency(app: App, batch: int) -> tuple[list[float], list[float]]:
    """(E from each epoch's gradient noise, E AdaptDL recorded for the epoch)."""
    from_noise, recorded = [], []
    progress, iteration = 0.0, 0
    for row in app.validation[batch]:
        grad = GradParams.from_estimates(float(row["grad_sqr"]), float(row["grad_var"]))
        from_noise.append(efficiency(grad, app.base_batch, batch))
        steps = int(row["iteration"]) - iteration
        recorded.append((float(row["progress"]) - progress) / steps / (batch / app.base_batch))
        progress, iteration = float(row["progress"]), int(row["iteration"])
    return from_noise, recorded


def efficiency_rows(apps: list[App]) -> list[dict[str, Any]]:
    rows = []
    for app in apps:
        for batch in sorted(app.validation)[1:]:
            from_noise, recorded = _recorded_efficiency(app, batch)
            epochs = len(from_noise)
            # The first epoch's noise is a warm-up estimate; the second is the first settled.
            marks = {"2nd": min(1, epochs - 1), "mid": epochs // 2, "last": epochs - 1}
            ratio = np.array(recorded) / np.array(from_noise)
            rows.append(
                {
                    "app": app.name,
                    "batch": batch,
                    "scale": batch // app.base_batch,
                    "epochs": epochs,
                    **{
                        f"E {name} epoch (noise/recorded)": (
                            f"{from_noise[i]:.3f}/{recorded[i]:.3f}"
                        )
                        for name, i in marks.items()
                    },
                    "median_mismatch": float(np.median(np.abs(ratio - 1.0))),
                    "max_mismatch_after_1st": float(np.max(np.abs(ratio[1:] - 1.0))),
                }
            )
    return rows


def adaptive_rows(apps: list[App]) -> list[dict[str, Any]]:
    rows = []
    for app in apps:
        base = app.base_batch
        middle = app.validation[base][len(app.validation[base]) // 2]
        grad = GradParams.from_estimates(float(middle["grad_sqr"]), float(middle["grad_var"]))
        per_gpu = [int(s.per_gpu) for s in app.samples]
        max_per_gpu = MAX_PER_GPU.get(app.name, max(per_gpu))
        perf = fit_throughput(app.samples)
        limits = BatchLimits(base, base, max(app.validation), max_per_gpu, min(per_gpu))
        adaptive = GoodputModel(perf, grad, limits)
        fixed = GoodputModel(perf, grad, BatchLimits.fixed(base, max_per_gpu))
        for workers, nodes in SIZES:
            choice = adaptive.best_batch(workers, nodes)
            rows.append(
                {
                    "app": app.name,
                    "noise_scale": round(grad.noise_scale(base)),
                    "gpus x nodes": f"{workers}x{nodes}",
                    "batch": choice.batch if choice else None,
                    "per_gpu": choice.per_gpu if choice else None,
                    "accum_steps": choice.accum_steps if choice else None,
                    "efficiency": adaptive.efficiency(choice.batch) if choice else None,
                    "speedup": adaptive.speedup(workers, nodes),
                    "speedup_fixed_batch": fixed.speedup(workers, nodes),
                }
            )
    return rows


def _markdown_table(rows: list[dict[str, Any]]) -> str:
    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.3g}" if abs(value) < 100 else f"{value:,.0f}"
        return "" if value is None else str(value)

    cells = [[cell(value) for value in row.values()] for row in rows]
    return "\n".join(markdown_table(list(rows[0]), cells))


MARKDOWN_HEAD = """# The goodput model against the Pollux applications

Generated by `python -m benchmarks.goodput_fit --markdown > docs/results/goodput.md`
from the Pollux artifact's application profiles (`../shared/traces/pollux/apps`, see
`../shared/traces/README.md`); nothing here is tuned by hand. The model is
`scheduler/core/goodput.py` (formulas and sources in its docstring); its tests are
`tests/test_goodput.py`, which hold the bounds quoted below.

- **Statistical efficiency** (AdaptDL's definition): E(B) = (var + sqr) / (var + sqr B/B0)
  = (B_noise + B0) / (B_noise + B), from the gradient's squared norm `sqr` and variance
  `var` at the base batch B0 (the smallest batch each application was validated at).
- **Throughput**: Pollux's step-time model, compute alpha_c + beta_c m per micro-batch of
  m samples, synchronisation alpha + beta (w - 2) by node count, combined by a
  gamma-norm (overlap), fitted by bounded least squares on log times. One change: the
  network term's alpha is scaled by a ring all-reduce's 2 (w - 1) / w. With Pollux's
  linear term, fitting on up to 4 GPUs and predicting 5-8 missed by a median 32% (bert)
  and 27% (ncf); the test `test_fit_predicts_held_out_steps` bounds it at 25%.
- **Adaptive batch**: `best_batch` maximises throughput x efficiency over the job's
  batch range, per-GPU micro-batches within memory, more as gradient accumulation.
- **Learning rate**: AdaScale, lr = base_lr x gain, gain = (var + sqr) / (var B0/B + sqr),
  the rule the efficiency model assumes (tested: between no scaling and linear scaling).

How the simulator feeds it from these files: `placements.csv` and `scalability.csv`
rows -> `profile_samples` -> `fit_throughput` (once per application, as here); each
`validation-<B>.csv` row's `grad_sqr`, `grad_var` -> `GradParams` for that batch and
epoch (B0 = the smallest validated batch); a job's `BatchLimits` from its requested
batch and the application's per-GPU range. The live cluster fits the same model from
the step and sync times it measures per size, and the runtime's gradient noise.
"""

MARKDOWN_SECTIONS = {
    "throughput_params": (
        "## Fitted throughput parameters (every measurement)",
        "Seconds: alpha_c per micro-batch, beta_c per sample; alpha_r/beta_r within a "
        "node, alpha_n/beta_n over nodes; errors are |predicted / measured - 1| of step "
        "times.",
    ),
    "throughput_heldout": (
        "## Step-time error on measurements held out of the fit",
        "`median_bias` below zero: predicted faster than measured. Few runs predict "
        "optimistically (network terms never seen cost nothing, as in Pollux) or, when "
        "the only multi-node run is the slowest placement (2 nodes), pessimistically: "
        "the live fit improves with every size a job runs at.",
    ),
    "efficiency": (
        "## Statistical efficiency: from the gradient noise vs recorded by AdaptDL",
        "Each epoch's row of `validation-<B>.csv` holds the noise and the statistical "
        "progress AdaptDL counted (its gain ratio summed over the epoch's steps); "
        "`mismatch` = |recorded / from noise - 1| by epoch. They differ in the first "
        "epoch (the noise is the estimate at its end, while warm-up moves it fast) and "
        "for deepspeech2 at its largest batch, where the recorded progress is 4% lower.",
    ),
    "adaptive": (
        "## The adaptive batch at mid-training",
        "Gradient noise of the base batch's middle epoch; batch limits: the validated "
        "range, per-GPU batches as measured (yolov3 at most 8). Speedup is goodput over "
        "the best on one GPU; `speedup_fixed_batch` keeps the base batch (0: it cannot be "
        "split over that many GPUs).",
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--apps", type=Path, default=APPS)
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true")
    output.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    directories = sorted(p for p in args.apps.glob("*") if (p / "placements.csv").is_file())
    if not directories:
        sys.exit(f"{args.apps}: no application profiles (<app>/placements.csv)")
    try:
        apps = [load_app(directory) for directory in directories]
    except (OSError, ValueError) as exc:
        sys.exit(f"unreadable application profile: {exc}")
    params, heldout = throughput_rows(apps)
    tables = {
        "throughput_params": params,
        "throughput_heldout": heldout,
        "efficiency": efficiency_rows(apps),
        "adaptive": adaptive_rows(apps),
    }
    if args.markdown:
        parts = [MARKDOWN_HEAD]
        for name, rows in tables.items():
            title, note = MARKDOWN_SECTIONS[name]
            parts += [title, note, _markdown_table(rows)]
        sys.stdout.write("\n\n".join(parts) + "\n")
        return
    for name, rows in tables.items():
        if args.json:
            emit([{"table": name, **row} for row in rows], name, "json")
        else:
            emit(rows, name, "table")


if __name__ == "__main__":
    main()
