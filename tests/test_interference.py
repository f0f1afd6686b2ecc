"""The measured interference model: its physical properties on every shipped fit, the fit
reproducing the H100 pairs, its error on pairs held out of the fit, and the shipped
parameters being what the fit script produces from the measurements."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from benchmarks import interference_fit as fitting
from benchmarks.interference_data import (
    MEASUREMENTS,
    MPS_FILES,
    TIME_SLICING_FILES,
    gavel_pairs,
    h100_pairs,
    host_with_guest_pairs,
)
from scheduler.core.interference import (
    InterferenceModel,
    Sharing,
    fits_from_json,
    fitted,
)

FITS = fitted()
MODELS = {
    f"{generation}/{sharing}": model
    for generation, by_sharing in FITS.models.items()
    for sharing, model in by_sharing.items()
}
# The most a GPU saturated by one job may gain from any guest: nothing under time
# slicing; under MPS what two saturating jobs were measured to gain (1.08-1.09).
SATURATED_GAIN = {Sharing.TIME_SLICING: 0.0, Sharing.MPS: 0.1}
needs_measurements = pytest.mark.skipif(
    not (MEASUREMENTS / "h100").is_dir(), reason="the measurements live in ../shared"
)

utilization = st.floats(0.0, 1.0)
co_runners = st.lists(utilization, min_size=2, max_size=5)


def combined(model: InterferenceModel, utilizations: Sequence[float]) -> float:
    return sum(model.speeds(utilizations))


# ------------------------------------------------------------- the model's properties


@pytest.mark.parametrize("name", MODELS)
@given(u=utilization)
def test_a_lone_job_is_never_slowed(name: str, u: float) -> None:
    assert MODELS[name].stretch([u]) == (1.0,)
    assert MODELS[name].stretch([]) == ()


@pytest.mark.parametrize("name", MODELS)
@given(utilizations=co_runners, data=st.data())
def test_more_utilization_never_means_less_slowdown(
    name: str, utilizations: list[float], data: st.DataObject
) -> None:
    model = MODELS[name]
    busier = list(utilizations)
    i = data.draw(st.integers(0, len(busier) - 1))
    busier[i] = data.draw(st.floats(busier[i], 1.0))
    for before, after in zip(model.stretch(utilizations), model.stretch(busier), strict=True):
        assert after >= before - 1e-12


@pytest.mark.parametrize("name", MODELS)
@given(utilizations=co_runners)
def test_co_runners_cost_between_nothing_and_equal_time_slicing(
    name: str, utilizations: list[float]
) -> None:
    model = MODELS[name]
    worst = len(utilizations) / model.capacity
    for stretch in model.stretch(utilizations):
        assert 1.0 <= stretch <= worst + 1e-12


@pytest.mark.parametrize(
    "generation, sharing", [(g, s) for g, by in FITS.models.items() for s in by]
)
@given(guests=st.lists(utilization, min_size=1, max_size=4))
def test_a_gpu_saturated_by_one_job_gains_nothing_from_any_guest(
    generation: str, sharing: Sharing, guests: list[float]
) -> None:
    model = FITS.get(generation, sharing)
    assert combined(model, [1.0, *guests]) <= 1.0 + SATURATED_GAIN[sharing] + 1e-9


@pytest.mark.parametrize("generation", [g for g, by in FITS.models.items() if Sharing.MPS in by])
@given(utilizations=co_runners)
def test_mps_is_never_predicted_worse_than_time_slicing(
    generation: str, utilizations: list[float]
) -> None:
    mps = FITS.get(generation, Sharing.MPS).speeds(utilizations)
    time_slicing = FITS.get(generation, Sharing.TIME_SLICING).speeds(utilizations)
    for with_mps, without in zip(mps, time_slicing, strict=True):
        assert with_mps >= without - 1e-12


def test_underused_pairs_gain_and_saturating_pairs_lose_under_time_slicing() -> None:
    h100 = FITS.get("h100")
    assert combined(h100, [0.3, 0.3]) > 1.7
    assert combined(h100, [0.6, 0.6]) > 1.3
    assert combined(h100, [1.0, 1.0]) < 1.0


@pytest.mark.parametrize("bad", [-0.1, 1.01, math.nan, math.inf])
def test_a_utilization_outside_0_1_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="utilization"):
        FITS.get("h100").stretch([0.5, bad])


@pytest.mark.parametrize(
    "parameters",
    [
        {"capacity": 0.0, "overlap_exponent": 1, "saturation_exponent": 1, "self_exponent": 1},
        {"capacity": 2.0, "overlap_exponent": 1, "saturation_exponent": 1, "self_exponent": 1},
        {"capacity": 0.9, "overlap_exponent": 0, "saturation_exponent": 1, "self_exponent": 1},
    ],
)
def test_parameters_out_of_range_are_refused(parameters: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        fits_from_json({"fits": {"x": {"time-slicing": parameters}}})


def test_devices_map_to_their_generation_and_unknown_ones_to_the_most_pessimistic_fit() -> None:
    assert FITS.for_device("NVIDIA H100 80GB HBM3") is FITS.get("h100")
    assert FITS.for_device("Tesla V100-SXM2-16GB", Sharing.MPS) is FITS.get("v100")
    assert FITS.for_device("Tesla T4") is FITS.get("v100")  # nearest fitted: Volta
    unknown = FITS.for_device("Some Future GPU")
    assert unknown.capacity == min(m.capacity for m in MODELS.values())


def test_a_generation_measured_only_without_mps_uses_that_fit_under_mps() -> None:
    assert FITS.get("k80", Sharing.MPS) is FITS.get("k80", Sharing.TIME_SLICING)


# ------------------------------------------------------------- against the measurements


def errors(predictions: Sequence[tuple[fitting.Pair, fitting.Fit]]) -> dict[str, float]:
    """Median and 90th percentile of each job's |error|, median of each pair's combined."""
    jobs, pairs = [], []
    for pair, fit in predictions:
        predicted = fitting.speeds(pair, fitting.PREDICTORS["model"](pair, fit))
        jobs += [abs(p - m) for p, m in zip(predicted, pair.speeds, strict=True)]
        pairs.append(abs(sum(predicted) - pair.combined))
    jobs.sort()
    return {
        "job median": statistics.median(jobs),
        "job p90": fitting.percentile(jobs, 0.9),
        "combined median": statistics.median(pairs),
    }


def assert_within(measured: dict[str, float], **bounds: float) -> None:
    over = {k: v for k, v in measured.items() if v > bounds.get(k.replace(" ", "_"), math.inf)}
    assert not over, f"errors {measured} over their bounds {bounds}"


@needs_measurements
def test_the_shipped_fit_reproduces_the_measured_h100_pairs() -> None:
    ts = fitting.Fit(FITS.get("h100"))
    mps = fitting.Fit(FITS.get("h100", Sharing.MPS))
    assert_within(
        errors([(p, ts) for p in h100_pairs(TIME_SLICING_FILES)]),
        job_median=0.03,
        job_p90=0.12,
        combined_median=0.05,
    )
    # The SPB host with a guest was never fitted: its partial step contended, its wait not.
    assert_within(
        errors([(p, ts) for p in host_with_guest_pairs()]),
        job_median=0.03,
        job_p90=0.1,
        combined_median=0.06,
    )
    # MPS: 7 pairs, one of them (ResNet-18-CIFAR, ran faster together than alone) unfittable.
    assert_within(
        errors([(p, mps) for p in h100_pairs(MPS_FILES)]), job_median=0.03, combined_median=0.05
    )


@needs_measurements
def test_pairs_held_out_of_the_fit_are_predicted_within_the_stated_error() -> None:
    ts_pairs = h100_pairs(TIME_SLICING_FILES)
    held_out = fitting.leave_one_model_out(ts_pairs, fitting.fit_time_slicing)
    measured = errors(held_out)
    assert_within(measured, job_median=0.03, job_p90=0.15, combined_median=0.05)
    # ... and better than the constant the policies charged (every job's demand 1).
    constant = fitting.Evaluation("h100", "one model", held_out).rows()[1]
    assert constant["predictor"] == "constant 0.15, demand 1"
    assert constant["job_err_median"] > 2 * measured["job median"]
    ts = fitting.fit_time_slicing(ts_pairs).model
    mps_held_out = fitting.leave_one_out(
        h100_pairs(MPS_FILES), lambda pairs: fitting.fit_mps(pairs, ts)
    )
    assert_within(errors(mps_held_out), job_median=0.03, combined_median=0.1)


@needs_measurements
def test_the_shipped_parameters_are_what_the_fit_script_produces() -> None:
    ts = fitting.fit_time_slicing(h100_pairs(TIME_SLICING_FILES)).model
    mps = fitting.fit_mps(h100_pairs(MPS_FILES), ts).model
    v100 = fitting.fit_latent(gavel_pairs("v100"), ts).model
    for refit, shipped in [
        (ts, FITS.get("h100")),
        (mps, FITS.get("h100", Sharing.MPS)),
        (v100, FITS.get("v100")),
    ]:
        for field in ("capacity", "overlap_exponent", "saturation_exponent", "self_exponent"):
            assert getattr(refit, field) == pytest.approx(getattr(shipped, field), abs=2e-3)


@needs_measurements
def test_gavels_pairs_read_as_its_readme_summarizes_them() -> None:
    # The README counts ordered pairs: (a, b) and (b, a) both, a job with itself once.
    for generation, median, below_one in [
        ("k80", 1.06, 0.25),
        ("p100", 1.13, 0.13),
        ("v100", 1.36, 0.23),
    ]:
        ordered = [
            pair.combined
            for pair in gavel_pairs(generation)
            for _ in range(1 if pair.jobs[0] == pair.jobs[1] else 2)
        ]
        assert statistics.median(ordered) == pytest.approx(median, abs=0.005)
        assert sum(c < 1.0 for c in ordered) / len(ordered) == pytest.approx(below_one, abs=0.005)
