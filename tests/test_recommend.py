"""Sweep recommendations from hand-made points: the knee, ties, noise, predicted points, cost."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from dsctl.orchestrator.recommend import recommend


def pts(rows):
    """rows: (workers, batches/s, cost per 1,000 batches or None, predicted)."""
    return [dict(workers=w, batches_per_s=b, cost_per_1000_batches=c, predicted=p) for w, b, c, p in rows]


# A latency-bound job where each worker serves a quarter of the trainer: 4 workers reach the ideal.
KNEE_AT_4 = pts([(1, 0.25, 4.0, False), (2, 0.50, 2.2, False), (3, 0.75, 1.6, False),
                 (4, 1.00, 1.3, False), (5, 1.00, 1.5, False), (6, 1.00, 1.7, False)])


def test_clean_knee_and_cheapest():
    r = recommend(KNEE_AT_4)
    assert r.smallest.workers == 4 and not r.smallest.predicted
    assert r.best_bps == 1.0 and r.best_workers == 4
    assert r.cheapest.workers == 4 and r.cheapest.cost_per_1000_batches == 1.3
    assert r.smallest.reason.startswith("4 workers give the sweep's best, 1.00 batches/s (measured)")
    assert "3 workers, falls short at 0.750 batches/s" in r.smallest.reason
    assert r.cheapest.reason == ("4 workers cost $1.30 per 1,000 batches (measured), the lowest of 6 priced "
                                 "points; next is 5 workers at $1.50 (measured).")


def test_noise_on_the_plateau_within_tolerance():
    noisy = pts([(1, 0.26, None, False), (2, 0.49, None, False), (3, 0.77, None, False),
                 (4, 0.985, None, False), (5, 1.01, None, False), (6, 0.995, None, False)])
    r = recommend(noisy)
    assert r.smallest.workers == 4 and r.best_workers == 5
    assert "within 3% of the best, 1.01 batches/s at 5 workers (measured)" in r.smallest.reason
    assert r.cheapest is None                       # nothing priced


def test_a_point_above_ideal_within_the_tolerance_is_noise_when_ideal_is_known():
    spiky = pts([(1, 0.25, None, False), (2, 0.5, None, False), (3, 0.75, None, False),
                 (4, 1.0, None, False), (5, 0.99, None, False), (6, 1.09, None, False)])
    assert recommend(spiky).smallest.workers == 6             # without the ideal, the spike sets the bar
    r = recommend(spiky, ideal_bps=1.07, tolerance=0.07)      # 1.09 is 1.9% above the ideal: noise
    assert r.smallest.workers == 4 and r.best_bps == 1.07 and r.refused is None
    assert "above ideal" in r.smallest.reason


def test_measurements_that_contradict_each_other_recommend_nothing_until_a_longer_window():
    """A model-bound job measured on a short window: its points, colocated and ideal differ by less than the
    window's noise (a sweep once printed 'within 3% of the ideal' at 155% of ideal)."""
    above = pts([(1, 1.50, 0.5, False), (2, 1.55, 0.6, False)])
    r = recommend(above, ideal_bps=1.0, colocated_bps=0.9)
    assert r.smallest is None and r.cheapest is None
    assert r.refused.startswith("2 workers measured 1.55 batches/s, 155% of the ideal baseline's 1.00 batches/s")
    assert "longer --window" in r.refused
    r = recommend(pts([(1, 1.0, None, False), (2, 1.0, None, False)]), ideal_bps=0.8, colocated_bps=1.0)
    assert r.smallest is None and r.refused.startswith("the ideal baseline measured 0.800 batches/s, below the "
                                                       "colocated one's 1.00 batches/s")
    # within the tolerance, both are noise, and the sweep recommends as usual
    assert recommend(KNEE_AT_4, ideal_bps=0.99, colocated_bps=1.0).refused is None


def test_a_sweep_still_scaling_at_its_largest_count_says_to_extend_it():
    r = recommend(pts([(1, 0.25, None, False), (2, 0.5, None, False), (4, 0.9, None, False)]), ideal_bps=2.0)
    assert r.smallest.workers == 4
    assert r.extend == ("still scaling at 4 workers (+80% over 2 workers), the largest count swept: more workers may "
                        "be faster still; extend --workers beyond 4.")
    assert recommend(KNEE_AT_4).extend is None  # the knee is inside the range
    assert recommend(pts([(1, 0.5, None, False), (2, 0.99, None, False)]), ideal_bps=1.0).extend is None  # at ideal


def test_tolerance_is_configurable():
    assert recommend(KNEE_AT_4, tolerance=0.30).smallest.workers == 3
    assert recommend(KNEE_AT_4, tolerance=0.0).smallest.workers == 4
    assert "within 30% of" in recommend(KNEE_AT_4, tolerance=0.30).smallest.reason
    for bad in (-0.1, 1.0, 2):
        with pytest.raises(ValueError):
            recommend(KNEE_AT_4, tolerance=bad)


def test_ties_pick_fewest_workers_for_speed_and_fastest_for_equal_cost():
    tied = pts([(8, 2.0, 0.5, False), (16, 2.0, 0.5, False), (32, 3.0, 0.5, False), (64, 3.0, 0.9, False)])
    r = recommend(tied)
    assert r.smallest.workers == 32 and r.best_workers == 32     # equal best: the smaller count
    assert r.cheapest.workers == 32                             # equal cost: the faster, then fewer
    even = pts([(8, 2.0, 0.5, False), (16, 2.0, 0.5, False)])
    assert recommend(even).cheapest.workers == 8


def test_measured_and_predicted_both_count_and_are_named():
    sweep = pts([(8, 0.30, 3.0, False), (16, 0.64, 1.6, False), (64, 2.4, 0.5, True),
                 (128, 4.75, 0.3, True), (256, 6.44, 0.27, True), (512, 6.47, 0.4, True)])
    r = recommend(sweep)
    assert r.smallest.workers == 256 and r.smallest.predicted and r.best_predicted
    assert "(predicted)" in r.smallest.reason
    assert r.cheapest.workers == 256 and "(predicted)" in r.cheapest.reason


def test_accepts_objects_and_skips_failed_points():
    @dataclass
    class Point:
        workers: int
        batches_per_s: float | None
        cost_per_1000_batches: float | None = None
        predicted: bool = False

    r = recommend([Point(1, 0.5), Point(2, None), Point(3, 0.0), Point(4, 0.6, 2.0)])
    assert r.smallest.workers == 4 and r.cheapest.reason.endswith("the only priced point.")
    assert r.to_dict()["smallest"]["workers"] == 4
    assert recommend([Point(1, 0.5)]).smallest.reason.startswith("1 worker gives")
    with pytest.raises(ValueError, match="no sweep point"):
        recommend([Point(2, None)])
    with pytest.raises(ValueError):
        recommend([])


def test_tolerance_is_relative_to_the_best_at_any_scale():
    """Within 3% of the best means bps >= 0.97 x best, whatever the units: at 100 batches/s a point
    at 97.5 is within it, at 0.75 batches/s a point at 0.72 (4% short) is not."""
    fast = pts([(1, 40.0, None, False), (2, 80.0, None, False), (3, 97.5, None, False), (4, 100.0, None, False)])
    assert recommend(fast).smallest.workers == 3
    slow = pts([(1, 0.25, None, False), (2, 0.50, None, False), (3, 0.72, None, False), (4, 0.75, None, False)])
    assert recommend(slow).smallest.workers == 4
    # The same sweep in other units (batches/s x 1,000, or / 1,000) gives the same answer.
    for scale in (1e-3, 1.0, 1e3):
        for sweep, want in ((fast, 3), (slow, 4), (KNEE_AT_4, 4)):
            scaled = [{**p, "batches_per_s": p["batches_per_s"] * scale} for p in sweep]
            assert recommend(scaled).smallest.workers == want, (scale, want)
            assert recommend(scaled, tolerance=0.30).smallest.workers == recommend(sweep, tolerance=0.30).smallest.workers


def test_a_point_exactly_at_the_tolerance_counts():
    """0.09 is exactly 10% below 0.1: within a 10% tolerance, though (1 - 0.1) x 0.1 is 0.09000000000000001."""
    r = recommend(pts([(1, 0.05, None, False), (2, 0.09, None, False), (3, 0.1, None, False)]), tolerance=0.1)
    assert r.smallest.workers == 2 and "within 10% of the best" in r.smallest.reason


def test_points_in_any_order():
    shuffled = [KNEE_AT_4[i] for i in (5, 2, 0, 4, 3, 1)]
    r = recommend(shuffled, tolerance=0.30)
    assert r.smallest.workers == 3 and "the next smaller count, 2 workers, falls short at 0.500" in r.smallest.reason
    assert recommend(shuffled).smallest.workers == 4 and recommend(shuffled).cheapest.workers == 4


def test_the_best_at_exactly_ideal_is_not_called_noise():
    r = recommend(KNEE_AT_4, ideal_bps=1.0)
    assert r.best_bps == 1.0 and r.smallest.workers == 4
    assert r.smallest.reason.startswith("4 workers give the sweep's best") and "noise" not in r.smallest.reason


def test_points_without_throughput_are_never_recommended():
    with pytest.raises(ValueError, match="no sweep point"):
        recommend(pts([(1, 0.0, 1.0, False), (2, -1.0, 1.0, False)]))
    r = recommend(pts([(1, 0.0, 0.1, False), (2, 0.5, 2.0, False)]))
    assert r.smallest.workers == 2 and r.cheapest.workers == 2  # a failed point's cost is not a price


def test_cheapest_ignores_points_priced_at_infinity():
    r = recommend(pts([(1, 0.5, float("inf"), False), (2, 0.6, float("inf"), False)]))
    assert r.cheapest is None
    r = recommend(pts([(1, 0.5, float("inf"), False), (2, 0.6, 3.0, False)]))
    assert r.cheapest.workers == 2 and r.cheapest.reason.endswith("the only priced point.")


def test_a_dip_larger_than_the_tolerance_is_reported_as_noise():
    """5 workers measured 6% below 4: more workers do not slow such a job down, the measurement varies."""
    dipped = pts([(1, 0.25, None, False), (2, 0.5, None, False), (3, 0.75, None, False),
                  (4, 1.00, None, False), (5, 0.94, None, False), (6, 0.99, None, False)])
    r = recommend(dipped)
    assert r.noise == pytest.approx(0.06)
    assert r.warning.startswith("5 workers measured 6% slower than 4 workers")
    assert "--tolerance above 6%" in r.warning
    assert recommend(dipped, tolerance=0.07).warning is None  # within the tolerance: nothing to say
    assert recommend(KNEE_AT_4).warning is None and recommend(KNEE_AT_4).noise == 0.0
    # Predicted points are a model's, not measurements: their dips say nothing about noise.
    predicted_dip = pts([(4, 1.0, None, False), (8, 0.9, None, True)])
    assert recommend(predicted_dip).warning is None
