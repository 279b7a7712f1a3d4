"""The cache's storage: how long an element takes to read, and what keeping it costs.

Cachew (ATC'22 §4.4) projects a cached pipeline's time with a model of its cache's read time as
a function of an element's bytes (`g_GFS`, for GlusterFS). dsctl's is linear in bytes:

    read_s(b) = fixed_s + s_per_byte * b

fitted by least squares on measured sizes (runtime/autocache_storage.py measures them on the
cache's own storage) and checked on sizes it was not fitted on. Negative fitted coefficients
are clamped to zero: an element never reads in negative time. Pure functions, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

GB = 1e9
STORAGE_KINDS = ("local-disk", "persistent-disk", "gcs")


@dataclass(frozen=True)
class ReadModel:
    fixed_s: float  # per element, whatever its size
    s_per_byte: float

    def read_s(self, nbytes: float) -> float:
        return self.fixed_s + self.s_per_byte * nbytes


def fit_read_model(points: list[tuple[float, float]]) -> ReadModel:
    """Least squares over (bytes, seconds per element); needs two distinct sizes."""
    if len({b for b, _ in points}) < 2:
        raise ValueError("fitting the storage read model needs at least two element sizes")
    n = len(points)
    mb = sum(b for b, _ in points) / n
    ms = sum(s for _, s in points) / n
    slope = sum((b - mb) * (s - ms) for b, s in points) / sum((b - mb) ** 2 for b, _ in points)
    slope = max(slope, 0.0)
    return ReadModel(fixed_s=max(ms - slope * mb, 0.0), s_per_byte=slope)


def held_out_errors(model: ReadModel, points: list[tuple[float, float]]) -> list[float]:
    """Relative error of the model at sizes it was not fitted on: (predicted - measured) / measured."""
    return [(model.read_s(b) - s) / s for b, s in points]


HOURS_PER_MONTH = 730.0  # how Google Cloud turns GB-month prices into hours


def storage_month_cost(nbytes: float, gb_month: float) -> float:
    """Dollars to keep `nbytes` for a month at `gb_month` $/GB-month."""
    return nbytes / GB * gb_month


def storage_cost(nbytes: float, gb_month: float, seconds: float) -> float:
    """Dollars to keep `nbytes` for `seconds`."""
    return storage_month_cost(nbytes, gb_month) * seconds / (HOURS_PER_MONTH * 3600.0)
