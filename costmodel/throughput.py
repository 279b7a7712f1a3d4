"""Throughput model for predicted sweep points: how fast a job goes with n tf.data service workers.

The model (one formula, three fitted or measured numbers):

    T(n) = softmin( max(r · (n − n0), 0), T_ideal )
    softmin(a, b) = (a^-p + b^-p)^(-1/p),   p = 8

- r, batches/s per worker. The input pipeline is embarrassingly parallel across workers
  (the paper's §4.2 scale-out), so while the trainer is starved each worker adds the same rate.
- n0, workers' worth of throughput lost to a fixed service overhead that more workers do not
  shrink (dispatcher round trips, the trainer's fan-in of many streams), so the service pays
  off only past a few workers. Never negative. Per-element costs (serialization, RPC; Cachew
  measures 30-50% more CPU than running the pipeline locally) are already inside r. On M1 the
  paper's own points fit n0 = 0.13: its 8 workers are slower than colocated because they have
  less CPU than the trainer host (§4.2), not because of overhead.
- T_ideal, the trainer's rate when input is free (the "ideal" baseline, measured by running the
  model on synthetic in-memory data). More workers can never beat it.
- p, how sharp the turn into saturation is. With p = 8 a deployment whose workers exactly match
  the trainer delivers 2^(-1/8) = 92% of ideal: the stall one expects from a bounded prefetch
  buffer between two equal-rate stages (an M/M/1/k queue with k ≈ 11 is empty 1/(k+1) ≈ 8% of
  the time, tf.data paper §3.3). Getting within 3% of ideal takes about 1.18× that many workers.

Calibration (`ThroughputModel.calibrate`) uses only measured points below 90% of ideal; nearer
the ceiling a point says little about r and much about noise. Each is first mapped back
through the softmin to the linear rate it implies, then r and n0 come from a least-squares
line through (n, rate): exact for points the model itself generated. One such point fixes
r = rate/n with n0 = 0; with none (every point saturated) r = T_ideal / smallest n, a lower
bound on r, so every unsaturated prediction is a lower bound too. `notes` records which case
applied.

A model is judged on points it never saw: `hold_out` fits on some measured counts and returns
the relative error at the others (experiments/fig9.py does this on the paper's M1 sweep).

Assumptions a prediction rests on: workers are alike and do not contend with each other
(true across VMs, only roughly on one shared machine); the trainer's rate does not depend on
the worker count; the one dispatcher does not become the bottleneck (the paper's M1 sweep reaches
its ideal at 512 and 640 workers). The model is pure arithmetic: no I/O, no TensorFlow.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from dsctl.specs.errors import SpecError

SHARPNESS = 8.0
SATURATED_ABOVE = 0.9  # a measured point at or above this fraction of ideal is not used to fit r


def softmin(a: float, b: float, p: float = SHARPNESS) -> float:
    """(a^-p + b^-p)^(-1/p), computed without overflow; never above min(a, b), 0 if either is 0."""
    lo, hi = min(a, b), max(a, b)
    if lo <= 0:
        return 0.0
    return min(lo, lo * (1.0 + (lo / hi) ** p) ** (-1.0 / p))


def unsoftmin(t: float, b: float, p: float = SHARPNESS) -> float:
    """The a with softmin(a, b) = t, for 0 < t < b: the rate a measured t implies before the cap."""
    return t * (1.0 - (t / b) ** p) ** (-1.0 / p)


@dataclass(frozen=True)
class ThroughputModel:
    """Batches/s per trainer as a function of the worker count; see the module docstring."""

    per_worker_bps: float           # r
    overhead_workers: float         # n0
    ideal_bps: float                # T_ideal
    colocated_bps: float | None = None
    sharpness: float = SHARPNESS    # p
    fitted_from: tuple[tuple[int, float], ...] = ()
    notes: tuple[str, ...] = field(default=())

    @classmethod
    def calibrate(cls, points: dict[int, float], ideal: float, colocated: float | None = None,
                  *, sharpness: float = SHARPNESS) -> ThroughputModel:
        """Fit r and n0 to measured {workers: batches/s}; ideal and colocated are the baselines."""
        _check(points, ideal, colocated)
        pts = tuple(sorted((int(n), float(t)) for n, t in points.items()))
        usable = [(n, unsoftmin(t, ideal, sharpness)) for n, t in pts if t < SATURATED_ABOVE * ideal]
        notes: list[str] = []
        if not usable:
            r, n0 = ideal / pts[0][0], 0.0
            notes.append(f"every measured point is within {1 - SATURATED_ABOVE:.0%} of ideal, so the "
                         f"per-worker rate is only known to be at least ideal / {pts[0][0]} workers; "
                         "predictions below that count are lower bounds")
        elif len(usable) == 1:
            n, a = usable[0]
            r, n0 = a / n, 0.0
            notes.append(f"one unsaturated worker count ({n}) fixes the per-worker rate; "
                         "the small-count overhead is taken as 0")
        else:
            r, n0 = _fit_line(usable)
            if r <= 0:  # throughput did not grow with workers: noise dominates, fall back to a mean rate
                r, n0 = sum(a / n for n, a in usable) / len(usable), 0.0
                notes.append("measured throughput did not rise with workers; using the mean per-worker rate")
            elif n0 < 0:  # better than linear at small counts: no overhead, refit through the origin
                r, n0 = sum(n * a for n, a in usable) / sum(n * n for n, _ in usable), 0.0
                notes.append("no small-count overhead found (fit through zero)")
            else:
                notes.append(f"least-squares fit on {len(usable)} unsaturated worker counts")
        return cls(per_worker_bps=r, overhead_workers=n0, ideal_bps=float(ideal),
                   colocated_bps=None if colocated is None else float(colocated),
                   sharpness=sharpness, fitted_from=pts, notes=tuple(notes))

    def predict(self, n: float) -> float:
        """Predicted batches/s with n workers: non-decreasing in n, never above the ideal."""
        return softmin(max(self.per_worker_bps * (n - self.overhead_workers), 0.0), self.ideal_bps, self.sharpness)

    def speedup(self, n: float) -> float | None:
        """Predicted speedup over the colocated baseline, or None when it was not given."""
        return self.predict(n) / self.colocated_bps if self.colocated_bps else None

    def knee(self, threshold: float = 0.03) -> int:
        """Smallest whole worker count predicted within `threshold` (a fraction) of the ideal."""
        if not 0 < threshold < 1:
            raise SpecError(f"the knee threshold must be a fraction between 0 and 1, not {threshold!r}")
        target = (1 - threshold) * self.ideal_bps
        # Linear rate needed so the softmin reaches the target, then the count that delivers it.
        need = unsoftmin(target, self.ideal_bps, self.sharpness)
        n = max(1, math.ceil(self.overhead_workers + need / self.per_worker_bps - 1e-9))
        while n > 1 and self.predict(n - 1) >= target:
            n -= 1
        while self.predict(n) < target:
            n += 1
        return n

    def to_dict(self) -> dict:
        """Fitted parameters for JSON output and the sweep record."""
        return {
            "model": "T(n) = softmin(r*(n - n0), ideal), p-norm softmin",
            "per_worker_bps": self.per_worker_bps,
            "overhead_workers": self.overhead_workers,
            "ideal_bps": self.ideal_bps,
            "colocated_bps": self.colocated_bps,
            "sharpness": self.sharpness,
            "knee_3pct": self.knee(0.03),
            "fitted_from": {str(n): t for n, t in self.fitted_from},
            "notes": list(self.notes),
        }


def hold_out(points: dict[int, float], fit_on, ideal: float, colocated: float | None = None
             ) -> tuple[ThroughputModel, dict[int, float]]:
    """Fit on the counts in `fit_on` only; return the model and its relative error (predicted / measured - 1)
    at every other count of `points`. The held-out rates never reach the fit, so the errors are honest."""
    _check(points, ideal, colocated)
    fit_on = sorted(set(fit_on))
    if not fit_on or any(n not in points for n in fit_on):
        raise SpecError(f"the counts to fit on, {fit_on}, must be a non-empty subset of the measured counts "
                        f"{sorted(points)}")
    held = {n: t for n, t in points.items() if n not in fit_on}
    if not held:
        raise SpecError("every measured count was fitted on: hold at least one out to check the model against")
    model = ThroughputModel.calibrate({n: points[n] for n in fit_on}, ideal, colocated)
    return model, {n: model.predict(n) / t - 1 for n, t in sorted(held.items())}


def _fit_line(pts: list[tuple[int, float]]) -> tuple[float, float]:
    """Least squares a = r·n − r·n0 over two or more distinct counts; returns (r, n0)."""
    k = len(pts)
    mn = sum(n for n, _ in pts) / k
    ma = sum(a for _, a in pts) / k
    sxx = sum((n - mn) ** 2 for n, _ in pts)
    sxy = sum((n - mn) * (a - ma) for n, a in pts)
    r = sxy / sxx
    if r <= 0:
        return r, 0.0
    return r, mn - ma / r


def _check(points, ideal, colocated) -> None:
    def bad(x) -> bool:
        return isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x <= 0

    if bad(ideal):
        raise SpecError(f"the ideal rate must be a positive number of batches/s, not {ideal!r}; "
                        "it is measured by the ideal baseline (the model on synthetic in-memory data)")
    if colocated is not None and bad(colocated):
        raise SpecError(f"the colocated rate must be a positive number of batches/s, not {colocated!r}")
    if not points:
        raise SpecError("the throughput model needs at least one measured worker count to calibrate "
                        "from, such as {8: 0.30} (8 workers, 0.30 batches/s)")
    for n, t in points.items():
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise SpecError(f"worker count {n!r} is not a whole number of at least 1")
        if bad(t):
            raise SpecError(f"the measured rate with {n} workers must be a positive number of "
                            f"batches/s, not {t!r}")
