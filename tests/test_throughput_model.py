"""The sweep's throughput model: fitted on some of the paper's M1 points and judged on the others, exact
recovery of synthetic parameters, a knee that survives noise, and errors for inputs it cannot use."""

from __future__ import annotations

import random

import pytest

from dsctl.costmodel.throughput import ThroughputModel, hold_out, softmin, unsoftmin
from dsctl.specs.errors import SpecError

# Paper §4.2, Figure 9 (M1), batches/s; colocated 0.55 and ideal 6.47 from Figure 8.
PAPER_M1 = {8: 0.30, 16: 0.64, 64: 2.3, 128: 4.77}


@pytest.fixture(scope="module")
def m1() -> ThroughputModel:
    return ThroughputModel.calibrate({8: 0.30}, ideal=6.47, colocated=0.55)


def test_m1_fitted_on_8_workers_predicts_the_held_out_points_within_7_percent():
    model, errors = hold_out(PAPER_M1, [8], ideal=6.47, colocated=0.55)
    assert sorted(errors) == [16, 64, 128], "every count but the fitted one is held out"
    r = unsoftmin(0.30, 6.47) / 8  # one point: the rate it implies before the cap, per worker, no overhead
    for n, e in errors.items():
        assert e == pytest.approx(softmin(r * n, 6.47) / PAPER_M1[n] - 1, abs=1e-12)
    assert max(abs(e) for e in errors.values()) < 0.07  # 16: -6.3%, 64: +4.3%, 128: -0.5%


@pytest.mark.parametrize("fit_on", [[8], [8, 16], [16, 128]])
def test_hold_out_never_sees_the_held_out_rates(fit_on):
    """The fit depends on the fitted rates only: change every held-out rate and the parameters stay put."""
    model, errors = hold_out(PAPER_M1, fit_on, ideal=6.47)
    changed = {n: (t if n in fit_on else 3 * t) for n, t in PAPER_M1.items()}
    model2, errors2 = hold_out(changed, fit_on, ideal=6.47)
    assert (model2.per_worker_bps, model2.overhead_workers) == (model.per_worker_bps, model.overhead_workers)
    assert model2.fitted_from == tuple((n, PAPER_M1[n]) for n in sorted(fit_on))
    for n in errors:  # the same predictions, judged against rates three times larger
        assert errors2[n] == pytest.approx((1 + errors[n]) / 3 - 1)
    moved = {**PAPER_M1, fit_on[0]: PAPER_M1[fit_on[0]] * 1.5}
    assert hold_out(moved, fit_on, ideal=6.47)[0].per_worker_bps != model.per_worker_bps, "the fitted rates do count"


@pytest.mark.parametrize("fit_on, says", [([], "non-empty subset"), ([8, 32], "non-empty subset"),
                                          ([8, 16, 64, 128], "hold at least one out")])
def test_hold_out_needs_a_real_split(fit_on, says):
    with pytest.raises(SpecError, match=says):
        hold_out(PAPER_M1, fit_on, ideal=6.47)


def test_m1_parameters_and_speedups(m1):
    assert m1.per_worker_bps == pytest.approx(0.30 / 8, rel=1e-6)
    assert m1.overhead_workers == 0
    assert m1.predict(8) == pytest.approx(0.30, rel=1e-6)      # reproduces what it was fitted on
    assert m1.speedup(8) < 1 < m1.speedup(16)                  # predicted: 16 beats colocated, as in the paper
    assert 128 < m1.knee() <= 512
    d = m1.to_dict()
    assert d["per_worker_bps"] == m1.per_worker_bps and d["fitted_from"] == {"8": 0.30}
    assert d["knee_3pct"] == m1.knee() and d["notes"]


@pytest.mark.parametrize("model", [
    ThroughputModel.calibrate({8: 0.30}, ideal=6.47),
    ThroughputModel(per_worker_bps=0.2, overhead_workers=3.5, ideal_bps=2.0),
    ThroughputModel(per_worker_bps=5.0, overhead_workers=0.0, ideal_bps=1.0),
])
def test_predictions_never_exceed_ideal_and_never_fall(model):
    ns = [x / 4 for x in range(0, 4 * 2000)] + [1e6, 1e12]
    preds = [model.predict(n) for n in ns]
    assert all(0 <= p <= model.ideal_bps for p in preds)
    assert all(b >= a for a, b in zip(preds, preds[1:]))


@pytest.mark.parametrize("r, n0, ideal", [(0.25, 0.0, 1.0), (0.04, 2.5, 6.47), (3.0, 0.7, 40.0)])
def test_fit_recovers_known_parameters(r, n0, ideal):
    truth = ThroughputModel(per_worker_bps=r, overhead_workers=n0, ideal_bps=ideal)
    counts = [n for n in (1, 2, 3, 4, 6, 8, 12, 16, 32, 64, 128, 256, 512) if n > n0]
    fitted = ThroughputModel.calibrate({n: truth.predict(n) for n in counts}, ideal=ideal)
    assert fitted.per_worker_bps == pytest.approx(r, rel=1e-6)
    assert fitted.overhead_workers == pytest.approx(n0, abs=1e-6)
    assert fitted.knee() == truth.knee()


@pytest.mark.parametrize("seed", range(20))
def test_noisy_1_to_6_sweep_finds_knee_at_4_plus_minus_1(seed):
    rng = random.Random(seed)
    ideal = 1.0  # each worker serves a quarter of what the model consumes: 4 workers reach the ideal
    points = {n: min(n / 4, 1.0) * ideal * (1 + rng.uniform(-0.05, 0.05)) for n in range(1, 7)}
    assert abs(ThroughputModel.calibrate(points, ideal=ideal).knee() - 4) <= 1


def test_all_points_saturated_gives_lower_bound_rate_and_says_so():
    m = ThroughputModel.calibrate({16: 6.4, 32: 6.5}, ideal=6.47)
    assert m.per_worker_bps == pytest.approx(6.47 / 16)
    assert m.overhead_workers == 0
    assert "at least" in " ".join(m.notes)


def test_flat_or_superlinear_measurements_fall_back_sensibly():
    flat = ThroughputModel.calibrate({1: 0.5, 2: 0.45, 3: 0.4}, ideal=1.0)   # noise, no growth
    assert flat.per_worker_bps > 0 and flat.overhead_workers == 0
    superlinear = ThroughputModel.calibrate({2: 0.1, 4: 0.3, 8: 0.7}, ideal=10.0)
    assert superlinear.overhead_workers >= 0 and superlinear.per_worker_bps > 0
    origin = ThroughputModel.calibrate({2: 0.4, 4: 0.6}, ideal=10.0)      # fitted n0 < 0: refit through 0
    assert origin.overhead_workers == 0 and "through zero" in origin.notes[0]


def test_softmin_helpers():
    assert softmin(1.0, 1.0) == pytest.approx(2 ** (-1 / 8))
    assert softmin(0.0, 5.0) == 0.0
    assert softmin(1e-300, 1e300) == pytest.approx(1e-300)                  # no overflow
    assert softmin(unsoftmin(0.7, 1.0), 1.0) == pytest.approx(0.7)


def test_knee_threshold_must_be_a_fraction(m1):
    assert m1.knee(0.10) < m1.knee(0.03) < m1.knee(0.001)
    for bad in (0, 1, -0.1, 3):
        with pytest.raises(SpecError):
            m1.knee(bad)


@pytest.mark.parametrize("points, ideal, colocated, says", [
    ({}, 6.47, None, "at least one"),
    ({8: 0.3}, 0, None, "ideal"),
    ({8: 0.3}, -1.0, None, "ideal"),
    ({8: 0.3}, float("nan"), None, "ideal"),
    ({8: 0.3}, None, None, "ideal"),
    ({8: 0.3}, 6.47, 0.0, "colocated"),
    ({8: 0.0}, 6.47, None, "8 workers"),
    ({8: -0.3}, 6.47, None, "8 workers"),
    ({8: float("inf")}, 6.47, None, "8 workers"),
    ({8: "fast"}, 6.47, None, "8 workers"),
    ({0: 0.3}, 6.47, None, "worker count 0"),
    ({2.5: 0.3}, 6.47, None, "worker count 2.5"),
])
def test_bad_inputs_raise_spec_error(points, ideal, colocated, says):
    with pytest.raises(SpecError, match=says):
        ThroughputModel.calibrate(points, ideal=ideal, colocated=colocated)
