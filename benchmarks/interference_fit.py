"""Fit the co-location interference model to the measured pairs, and say how well it
predicts pairs held out of the fit, against the constant rule it replaces.

The model (`scheduler.core.interference`): a job of solo utilization d beside
co-runners of total utilization o meets contention with probability
1 - (1 - (d*o)^p)(1 - o^r)(1 - d^m), and met contention stretches its iteration to equal
time slicing at `capacity`. Fitted, per GPU generation and sharing mode:
  * H100, time slicing: capacity, p and m on the 24 measured pairs (r is held at
    `SATURATION_EXPONENT`: every fit drove it to its bound, i.e. a step where the
    co-runners saturate the GPU);
  * H100, MPS: capacity, p and m on the 7 MPS pairs, each bounded by the time slicing
    fit on the side of less interference (MPS is never predicted worse);
  * K80, P100, V100 (Gavel): capacity, and an intensity per job type in place of the
    utilization Gavel did not measure; the curve's shape (p, r, m) is the H100's, since
    latent intensities cannot pin it (any power of them fits as well).
Least squares on each job's normalized speed, with a soft-L1 loss (outliers, such as
ResNet-18-CIFAR at batch 512, which NVML calls 40% busy but which pairs like a
saturating job, weigh less). Time slicing's capacity is bounded to [0.8, 1]: two
saturating jobs cannot beat running one after the other, and none measured lost more
than 20% to switching (H100 0.90; Gavel's 5th percentile combined 0.94-0.97 on K80/P100).

Held out of the fit: H100 time slicing leaves one model out (every pair with it); MPS
leaves one pair out; Gavel leaves out a fifth of the pairs at a time (5-fold, each job
type's intensity fitted from its other pairs); the SPB host-with-guest pairs are never
fitted. Errors: |predicted - measured| of each job's normalized speed and of each pair's
combined throughput (median and 90th percentile). Beside the model, in the same run:
the constant rule the simulator and JigSaw charged before it (every
co-runner 15% slower, time-sliced in proportion past a whole GPU), once with each job's
demand at 1 (what a full-backprop worker declares today) and once given the same
utilization (or fitted intensity) the model sees.

    python -m benchmarks.interference_fit [--json | --markdown] [--write]
                                          [--measurements DIR]

`--write` stores the fits made on all pairs in scheduler/core/interference.json.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import brentq, least_squares

from benchmarks.harness import emit, markdown_table, percentile
from benchmarks.interference_data import (
    GAVEL_GENERATIONS,
    MEASUREMENTS,
    MPS_FILES,
    TIME_SLICING_FILES,
    Pair,
    gavel_pairs,
    h100_pairs,
    host_with_guest_pairs,
    solo_utilization,
)
from scheduler.core.interference import PARAMETERS_FILE, InterferenceModel, Sharing

SATURATION_EXPONENT = 50.0
EXPONENT_BOUNDS = (0.05, 60.0)
TIME_SLICING_CAPACITY = (0.8, 1.0)
MPS_MAX_CAPACITY = 1.5
CONSTANT_INTERFERENCE = 0.15  # what the policies and the simulator charged before the model
GAVEL_FOLDS = 5
PARAMETERS_PATH = Path(__file__).resolve().parents[1] / "scheduler" / "core" / PARAMETERS_FILE
# Gavel's job types that stand for the Pollux applications the simulator replays.
POLLUX_STAND_INS = {
    "cifar10": "ResNet-18",
    "imagenet": "ResNet-50",
    "bert": "Transformer",
    "deepspeech2": "LM",  # both recurrent
    "ncf": "Recommendation",
}


@dataclass(frozen=True)
class Fit:
    """A fitted model and, where utilization was not measured, each job type's intensity."""

    model: InterferenceModel
    intensities: dict[str, float] | None = None

    def demands(self, pair: Pair) -> tuple[float, float]:
        if pair.utilizations is not None:
            return pair.utilizations
        assert self.intensities is not None
        return self.intensities[pair.jobs[0]], self.intensities[pair.jobs[1]]


# ---------------------------------------------------------------------- prediction

# A predictor gives each job's stretch of the time it computes beside the other.
Predictor = Callable[[Pair, Fit], tuple[float, float]]


def _model_stretch(pair: Pair, fit: Fit) -> tuple[float, float]:
    first, second = fit.model.stretch(fit.demands(pair))
    return first, second


def _constant(demands: Callable[[Pair, Fit], tuple[float, float]]) -> Predictor:
    def predict(pair: Pair, fit: Fit) -> tuple[float, float]:
        first, second = demands(pair, fit)
        # The rule the model replaced: every co-runner 15% slower, time-sliced in
        # proportion past a whole GPU.
        stretch = (1.0 + CONSTANT_INTERFERENCE) * max(1.0, first + second)
        return stretch, stretch

    return predict


PREDICTORS: dict[str, Predictor] = {
    "model": _model_stretch,
    "constant 0.15, demand 1": _constant(lambda pair, fit: (1.0, 1.0)),
    "constant 0.15, same demand": _constant(lambda pair, fit: fit.demands(pair)),
}


def speeds(pair: Pair, stretch: tuple[float, float]) -> tuple[float, float]:
    """Each job's speed together / alone. A host that computes part of its step and then
    idles (the SPB case, as measured: the idle time follows the contended compute) is
    stretched only while it computes; its guest runs contended then, alone while the
    host idles."""
    if pair.host_phases is None:
        return 1.0 / stretch[0], 1.0 / stretch[1]
    compute, idle = pair.host_phases
    contended = compute * stretch[0]
    step = contended + idle
    return (compute + idle) / step, (contended / stretch[1] + idle) / step


# ------------------------------------------------------------------------- fitting


def _least_squares(
    residuals: Callable[[np.ndarray], list[float]], start: Sequence[float], bounds: Sequence
) -> np.ndarray:
    low, high = zip(*bounds, strict=True)
    inside = np.clip(np.asarray(start, dtype=float), np.add(low, 1e-9), np.subtract(high, 1e-9))
    result = least_squares(
        lambda x: np.asarray(residuals(x)), inside, bounds=(low, high), loss="soft_l1", f_scale=0.05
    )
    return np.asarray(result.x)


def _speed_residuals(fit: Fit, pairs: Sequence[Pair]) -> list[float]:
    out: list[float] = []
    for pair in pairs:
        predicted = speeds(pair, _model_stretch(pair, fit))
        out += [predicted[0] - pair.speeds[0], predicted[1] - pair.speeds[1]]
    return out


def _curve(x: np.ndarray) -> InterferenceModel:
    """The model of (capacity, p, m), with r held at SATURATION_EXPONENT."""
    return InterferenceModel(float(x[0]), float(x[1]), SATURATION_EXPONENT, float(x[2]))


def fit_time_slicing(pairs: Sequence[Pair]) -> Fit:
    """Time slicing's capacity, p and m from pairs with measured utilization."""
    x = _least_squares(
        lambda x: _speed_residuals(Fit(_curve(x)), pairs),
        (0.9, 1.0, 4.0),
        (TIME_SLICING_CAPACITY, EXPONENT_BOUNDS, EXPONENT_BOUNDS),
    )
    return Fit(_curve(x))


def fit_mps(pairs: Sequence[Pair], time_slicing: InterferenceModel) -> Fit:
    """MPS's capacity, p and m, each bounded by time slicing's on the side of less
    interference, so that MPS never predicts a pair worse than time slicing does."""
    ts = time_slicing
    x = _least_squares(
        lambda x: _speed_residuals(Fit(_curve(x)), pairs),
        (ts.capacity + 0.1, ts.overlap_exponent, ts.self_exponent),
        (
            (ts.capacity, MPS_MAX_CAPACITY),
            (ts.overlap_exponent, EXPONENT_BOUNDS[1]),
            (ts.self_exponent, EXPONENT_BOUNDS[1]),
        ),
    )
    return Fit(_curve(x))


def fit_latent(pairs: Sequence[Pair], shape: InterferenceModel) -> Fit:
    """Capacity and each job type's intensity, on the curve of `shape`."""
    types = sorted({job for pair in pairs for job in pair.jobs})

    def fit(x: np.ndarray) -> Fit:
        return Fit(
            replace(shape, capacity=float(x[0])),
            {name: float(v) for name, v in zip(types, x[1:], strict=True)},
        )

    def residuals(x: np.ndarray) -> list[float]:
        return _speed_residuals(fit(x), pairs)

    x = _least_squares(
        residuals,
        (0.9, *([0.6] * len(types))),
        (TIME_SLICING_CAPACITY, *([(0.0, 1.0)] * len(types))),
    )
    return fit(x)


# ---------------------------------------------------------------------- evaluation


@dataclass(frozen=True)
class Evaluation:
    """Held-out predictions of one dataset: (pair, the fit that did not see it)."""

    dataset: str
    held_out: str
    predictions: list[tuple[Pair, Fit]]

    def rows(self) -> list[dict[str, Any]]:
        rows = []
        for name, predictor in PREDICTORS.items():
            job_errors, combined_errors = [], []
            for pair, fit in self.predictions:
                predicted = speeds(pair, predictor(pair, fit))
                job_errors += [abs(p - m) for p, m in zip(predicted, pair.speeds, strict=True)]
                combined_errors.append(abs(sum(predicted) - pair.combined))
            job_errors.sort()
            combined_errors.sort()
            rows.append(
                {
                    "dataset": self.dataset,
                    "held_out": self.held_out,
                    "predictions": len(self.predictions),
                    "predictor": name,
                    "job_err_median": round(statistics.median(job_errors), 3),
                    "job_err_p90": round(percentile(job_errors, 0.9), 3),
                    "combined_err_median": round(statistics.median(combined_errors), 3),
                    "combined_err_p90": round(percentile(combined_errors, 0.9), 3),
                }
            )
        return rows


def _model_of(label: str) -> str:
    return label.split("@")[0]


def leave_one_model_out(pairs: Sequence[Pair], fitter: Callable[[list[Pair]], Fit]) -> list:
    """Each pair predicted by a fit on the pairs without either of its models."""
    models = sorted({_model_of(job) for pair in pairs for job in pair.jobs})
    predictions = []
    for model in models:
        held = [pair for pair in pairs if model in map(_model_of, pair.jobs)]
        fit = fitter([pair for pair in pairs if pair not in held])
        predictions += [(pair, fit) for pair in held]
    return predictions


def leave_one_out(pairs: Sequence[Pair], fitter: Callable[[list[Pair]], Fit]) -> list:
    return [(pair, fitter([p for p in pairs if p is not pair])) for pair in pairs]


def k_fold(pairs: Sequence[Pair], fitter: Callable[[list[Pair]], Fit], folds: int) -> list:
    order = list(range(len(pairs)))
    random.Random(0).shuffle(order)
    predictions = []
    for fold in range(folds):
        held = set(order[fold::folds])
        fit = fitter([pair for i, pair in enumerate(pairs) if i not in held])
        predictions += [(pairs[i], fit) for i in sorted(held)]
    return predictions


@dataclass(frozen=True)
class Fits:
    """Every dataset's pairs, the fits on all of them, and the held-out evaluations."""

    models: dict[str, dict[Sharing, Fit]]
    evaluations: list[Evaluation]


def fit_all(root: Path = MEASUREMENTS, gavel_folds: int = GAVEL_FOLDS) -> Fits:
    time_slicing = h100_pairs(TIME_SLICING_FILES, root)
    mps = h100_pairs(MPS_FILES, root)
    ts_fit = fit_time_slicing(time_slicing)
    mps_fit = fit_mps(mps, ts_fit.model)
    models: dict[str, dict[Sharing, Fit]] = {
        "h100": {Sharing.TIME_SLICING: ts_fit, Sharing.MPS: mps_fit}
    }
    evaluations = [
        Evaluation("h100 time-slicing", "none (in-sample)", [(p, ts_fit) for p in time_slicing]),
        Evaluation(
            "h100 time-slicing",
            "one model",
            leave_one_model_out(time_slicing, fit_time_slicing),
        ),
        Evaluation("h100 mps", "none (in-sample)", [(p, mps_fit) for p in mps]),
        Evaluation(
            "h100 mps", "one pair", leave_one_out(mps, lambda ps: fit_mps(ps, ts_fit.model))
        ),
        Evaluation(
            "h100 spb host+guest",
            "all (never fitted)",
            [(p, ts_fit) for p in host_with_guest_pairs(root)],
        ),
    ]
    for generation in GAVEL_GENERATIONS:
        pairs = gavel_pairs(generation, root)
        fit = fit_latent(pairs, ts_fit.model)
        models[generation] = {Sharing.TIME_SLICING: fit}
        evaluations += [
            Evaluation(f"gavel {generation}", "none (in-sample)", [(p, fit) for p in pairs]),
            Evaluation(
                f"gavel {generation}",
                f"1/{gavel_folds} of pairs",
                k_fold(pairs, lambda ps: fit_latent(ps, ts_fit.model), gavel_folds),
            ),
        ]
    return Fits(models, evaluations)


# ------------------------------------------------------------------------- outlook


def _break_even(model: InterferenceModel) -> float:
    """The highest utilization at which two equal jobs together still beat running one
    after the other (1 if even two saturating jobs do)."""

    def gain(u: float) -> float:
        return sum(model.speeds((u, u))) - 1.0

    return 1.0 if gain(1.0) > 0.0 else float(brentq(gain, 0.0, 1.0))


def on_slower_gpu(utilization: float, factor: float) -> float:
    """A job's utilization on a GPU that takes `factor` times as long for its GPU work
    (the host's share of the step unchanged)."""
    busy = factor * utilization
    return busy / (busy + 1.0 - utilization)


# The T4 (Turing) has about half a V100's FP32 and tensor throughput (8.1 vs 15.7 and 65
# vs 125 TFLOPS) and a third of its memory bandwidth: its GPU work takes at least twice
# as long, so the same job keeps it busier.
T4_SLOWDOWN_VS_V100 = 2.0


def outlook_rows(fits: Fits, root: Path = MEASUREMENTS) -> list[dict[str, Any]]:
    """What each fit says about packing: two equal jobs at several utilizations, and every
    pair of the jobs known on that generation (H100: the models and batches of the solo
    sweep, at their measured utilization; Gavel: the job types that stand for the Pollux
    applications, at their fitted intensities; "t4": V100's, on a GPU half as fast)."""
    sweep = solo_utilization(root)
    cases = []
    for generation, by_sharing in fits.models.items():
        for sharing, fit in by_sharing.items():
            if fit.intensities is None:
                jobs = {f"{m}@{b}": u for (m, b), u in sweep.items()}
            else:
                jobs = {
                    name: u
                    for name, u in fit.intensities.items()
                    if name.split(" (")[0] in POLLUX_STAND_INS.values()
                }
            cases.append((generation, sharing, fit.model, jobs))
            if generation == "v100":
                slower = {n: on_slower_gpu(u, T4_SLOWDOWN_VS_V100) for n, u in jobs.items()}
                cases.append(("t4 (v100 fit, GPU work x2)", sharing, fit.model, slower))
    rows = []
    for generation, sharing, model, jobs in cases:
        names = sorted(jobs)
        combined = [
            sum(model.speeds((jobs[a], jobs[b]))) for i, a in enumerate(names) for b in names[i:]
        ]
        row: dict[str, Any] = {"generation": generation, "sharing": str(sharing)}
        for u in (0.25, 0.5, 0.75, 1.0):
            row[f"combined_at_{u}"] = round(sum(model.speeds((u, u))), 2)
        row["break_even_utilization"] = round(_break_even(model), 2)
        row["job_pairs"] = len(combined)
        row["pairs_gaining"] = round(sum(c > 1.0 for c in combined) / len(combined), 2)
        row["median_combined"] = round(statistics.median(combined), 2)
        rows.append(row)
    return rows


def _rounded(model: InterferenceModel, digits: int) -> dict[str, float]:
    return {name: round(value, digits) for name, value in asdict(model).items()}


def parameter_rows(fits: Fits) -> list[dict[str, Any]]:
    return [
        {"generation": generation, "sharing": str(sharing), **_rounded(fit.model, 3)}
        for generation, by_sharing in fits.models.items()
        for sharing, fit in by_sharing.items()
    ]


def parameters_document(fits: Fits) -> dict[str, Any]:
    return {
        "about": (
            "Co-location interference fits (scheduler.core.interference), generated by "
            "`python -m benchmarks.interference_fit --write` from the H100 and Gavel "
            "measurements; see docs/results/interference.md."
        ),
        "fits": {
            generation: {
                str(sharing): _rounded(fit.model, 4) for sharing, fit in by_sharing.items()
            }
            for generation, by_sharing in fits.models.items()
        },
    }


def _markdown(rows: list[dict[str, Any]]) -> str:
    cells = [[str(value) for value in row.values()] for row in rows]
    return "\n".join(markdown_table(list(rows[0]), cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--measurements", type=Path, default=MEASUREMENTS)
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="one JSON object per line")
    output.add_argument("--markdown", action="store_true", help="tables for the docs")
    parser.add_argument("--write", action="store_true", help=f"store the fits in {PARAMETERS_FILE}")
    args = parser.parse_args()
    fits = fit_all(args.measurements)
    tables = {
        "parameters": ("fitted parameters", parameter_rows(fits)),
        "error": (
            "held-out error of each job's normalized speed and each pair's combined throughput",
            [row for evaluation in fits.evaluations for row in evaluation.rows()],
        ),
        "outlook": ("what each fit says about packing", outlook_rows(fits, args.measurements)),
    }
    if args.write:
        PARAMETERS_PATH.write_text(json.dumps(parameters_document(fits), indent=2) + "\n")
    for name, (title, rows) in tables.items():
        if args.markdown:
            sys.stdout.write(f"### {title}\n\n{_markdown(rows)}\n\n")
        elif args.json:
            emit([{"table": name, **row} for row in rows], title, "json")
        else:
            emit(rows, title, "table")


if __name__ == "__main__":
    main()
