"""A sweep's two answers: the smallest worker count that is fast enough, and the cheapest one.

"Fast enough" follows Cachew's rule of thumb (more workers are not worth it once they buy less
than 3%): the smallest count whose throughput is within `tolerance` of the best point of the
sweep. Measured and predicted points both count; every answer says which kind it rests on.
A point faster than the ideal baseline can only be noise, so when `ideal_bps` is given the
best is capped there; otherwise one lucky point at the top sets the bar, and users should
look at the plot.

More workers never make a latency- or CPU-bound job slower by much, so a measured point slower
than one with fewer workers shows the noise of the measurement itself. When that dip is larger
than the tolerance, the pick rests on noise, and the recommendation says so (`warning`).

Some measurements cannot be recommended from at all: an ideal baseline slower than the colocated one
(input that never stalls cannot be slower than input made on the trainer), or a measured point faster
than the ideal by more than the tolerance. Both say the window was too short for this job (a model-bound
job's rates differ by less than a short window's noise): then nothing is recommended (`smallest` and
`cheapest` are None) and `refused` says to measure again with a longer --window. A sweep whose best point
is its largest count and still gained more than the tolerance over the one before may scale further:
`extend` says to sweep beyond it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace
from typing import Any

from dsctl.costmodel.money import usd


@dataclass(frozen=True)
class Pick:
    """One recommended worker count and the one sentence that justifies it."""

    workers: int
    batches_per_s: float
    cost_per_1000_batches: float | None
    predicted: bool
    reason: str
    local_workers: int | None = None  # a point of a sweep over --local-workers too


@dataclass(frozen=True)
class Recommendation:
    """`smallest`: fewest workers within tolerance of the best; `cheapest`: lowest cost per
    1,000 batches (None when no point was priced). `best_bps` is the bar they were held to."""

    smallest: Pick | None
    cheapest: Pick | None
    best_bps: float
    best_workers: int
    best_predicted: bool
    tolerance: float
    noise: float = 0.0  # the largest dip of a measured point below one with fewer workers, as a fraction
    warning: str | None = None
    refused: str | None = None  # why nothing is recommended (the measurements contradict each other)
    extend: str | None = None  # the sweep may scale beyond its largest count

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class _Point:
    workers: int
    bps: float
    cost: float | None
    predicted: bool

    @property
    def kind(self) -> str:
        return "predicted" if self.predicted else "measured"


def recommend(points: Iterable[Any], *, tolerance: float = 0.03, ideal_bps: float | None = None,
              colocated_bps: float | None = None) -> Recommendation:
    """Points are dicts or objects with workers, batches_per_s, cost_per_1000_batches, predicted.

    Points without a positive throughput (failed runs) are ignored; ValueError if none is left.
    """
    if not 0 <= tolerance < 1:
        raise ValueError(f"tolerance must be a fraction in [0, 1), not {tolerance!r}")
    pts = sorted((p for p in map(_point, points) if p is not None and p.bps > 0), key=lambda p: p.workers)
    if not pts:
        raise ValueError("no sweep point has a throughput to recommend from")

    best = max(pts, key=lambda p: (p.bps, -p.workers))
    bar, capped = best.bps, False
    if ideal_bps and best.bps > ideal_bps:
        bar, capped = ideal_bps, True
    need = (1 - tolerance) * bar * (1 - 1e-12)
    pick = next(p for p in pts if p.bps >= need)
    noise, warning = _noise(pts, tolerance)
    refused = _contradicted(pts, tolerance, ideal_bps, colocated_bps)
    return Recommendation(
        smallest=None if refused else _pick(pick, _smallest_reason(pick, pts, best, bar, capped, tolerance)),
        cheapest=None if refused else _cheapest(pts),
        best_bps=bar, best_workers=best.workers, best_predicted=best.predicted, tolerance=tolerance,
        noise=noise, warning=warning, refused=refused, extend=_still_scaling(pts, best, tolerance, ideal_bps),
    )


def _contradicted(pts: list[_Point], tolerance: float, ideal: float | None, colocated: float | None) -> str | None:
    """Why the measurements cannot be recommended from (beyond the tolerance, the ideal is slower than colocated,
    or a measured point faster than the ideal), or None."""
    again = ("the measurement window was too short for this job's rates to stand apart from its noise; nothing is "
             "recommended until the sweep is run again with a longer --window (e.g. --window 20s).")
    if ideal and colocated and ideal < (1 - tolerance) * colocated:
        return (f"the ideal baseline measured {_bps(ideal)}, below the colocated one's {_bps(colocated)}, which input "
                f"that never stalls cannot be: {again}")
    above = [p for p in pts if not p.predicted and ideal and p.bps > (1 + tolerance) * ideal]
    if above and ideal:
        p = max(above, key=lambda q: q.bps)
        return (f"{_n(p.workers)} measured {_bps(p.bps)}, {p.bps / ideal:.0%} of the ideal baseline's {_bps(ideal)}, "
                f"which no count of workers can pass: {again}")
    return None


def _still_scaling(pts: list[_Point], best: _Point, tolerance: float, ideal: float | None) -> str | None:
    """When the largest count is the best and still gained more than the tolerance over the count before it (and
    is short of the ideal): the range ends before the knee."""
    if len(pts) < 2 or best is not pts[-1]:
        return None
    before = pts[-2]
    gain = best.bps / before.bps - 1
    if gain <= tolerance or (ideal and best.bps >= (1 - tolerance) * ideal):
        return None
    return (f"still scaling at {_n(best.workers)} ({gain:+.0%} over {_n(before.workers)}), the largest count swept: "
            f"more workers may be faster still; extend --workers beyond {best.workers}.")


def _noise(pts: list[_Point], tolerance: float) -> tuple[float, str | None]:
    """The largest measured dip (a count slower than a smaller one) and, if above tolerance, what to do."""
    measured = [p for p in pts if not p.predicted]
    worst, where = 0.0, None
    for i, low in enumerate(measured):
        for high in measured[i + 1:]:
            dip = (low.bps - high.bps) / low.bps
            if dip > worst:
                worst, where = dip, (low, high)
    if where is None or worst <= tolerance:
        return worst, None
    low, high = where
    return worst, (f"{_n(high.workers)} measured {worst:.0%} slower than {_n(low.workers)}: the measurements vary "
                   f"by more than the {tolerance * 100:g}% tolerance, so the pick may rest on noise; a longer --window "
                   f"or a --tolerance above {worst:.0%} would steady it.")


def _smallest_reason(pick: _Point, pts: list[_Point], best: _Point, bar: float, capped: bool, tol: float) -> str:
    smaller = [p for p in pts if p.workers < pick.workers]
    below = (f"the next smaller count, {_n(smaller[-1].workers)}, falls short at {_bps(smaller[-1].bps)} "
             f"({smaller[-1].kind})" if smaller else "no smaller count was swept")
    if pick is best and not capped:
        return f"{_n(pick.workers)} {_verb(pick.workers, 'give')} the sweep's best, {_bps(pick.bps)} ({pick.kind}); {below}."
    where = (f"the ideal {_bps(bar)} (the fastest point, {_bps(best.bps)} at {_n(best.workers)}, is above "
             f"ideal, which only noise can do)") if capped else \
        f"the best, {_bps(best.bps)} at {_n(best.workers)} ({best.kind})"
    return (f"{_n(pick.workers)} {_verb(pick.workers, 'reach')} {_bps(pick.bps)} ({pick.kind}), "
            f"within {tol * 100:g}% of {where}; {below}.")


def _cheapest(pts: list[_Point]) -> Pick | None:
    priced = [p for p in pts if p.cost is not None and math.isfinite(p.cost)]
    if not priced:
        return None
    low = min(_cost(p) for p in priced)
    # Equal cost per batch: the faster one finishes sooner for the same money, then fewer machines.
    tied = [p for p in priced if math.isclose(_cost(p), low, rel_tol=1e-9, abs_tol=1e-12)]
    pick = max(tied, key=lambda p: (p.bps, -p.workers))
    others = sorted((p for p in priced if p is not pick), key=_cost)
    cost = f"{_n(pick.workers)} {_verb(pick.workers, 'cost')} {usd(pick.cost)} per 1,000 batches ({pick.kind})"
    if not others:
        return _pick(pick, f"{cost}, the only priced point.")
    nxt = others[0]
    return _pick(pick, f"{cost}, the lowest of {len(priced)} priced points; next is {_n(nxt.workers)} "
                       f"at {usd(nxt.cost)} ({nxt.kind}).")


def _cost(p: _Point) -> float:
    """A priced point's cost per 1,000 batches."""
    assert p.cost is not None, "only priced points are compared by cost"
    return p.cost


def _bps(x: float) -> str:
    return f"{x:.0f} batches/s" if x >= 100 else f"{x:#.3g} batches/s"


def _pick(p: _Point, reason: str) -> Pick:
    return Pick(workers=p.workers, batches_per_s=p.bps, cost_per_1000_batches=p.cost, predicted=p.predicted,
                reason=reason)


def _n(workers: int) -> str:
    return f"{workers} worker" if workers == 1 else f"{workers} workers"


def _verb(workers: int, verb: str) -> str:
    """Agree with the count: '1 worker reaches', '4 workers reach'."""
    return verb + ("es" if verb.endswith("h") else "s") if workers == 1 else verb


def _point(p: Any) -> _Point | None:
    """A point to recommend from; None for one without a throughput (a failed run)."""
    get: Callable[..., Any] = p.get if isinstance(p, dict) else (lambda k, d=None: getattr(p, k, d))
    cost = get("cost_per_1000_batches")
    bps = get("batches_per_s")
    workers, cost, predicted = int(get("workers")), None if cost is None else float(cost), bool(get("predicted", False))
    return None if bps is None else _Point(workers=workers, bps=float(bps), cost=cost, predicted=predicted)


SURFACE_RULE = ("the cheapest measured point (cost per 1,000 batches) whose throughput is within {tol:g}% of the best "
                "measured throughput, over every remote and local worker count swept")


def cheapest_within(points: Iterable[Any], *, tolerance: float = 0.03) -> tuple[Pick | None, str]:
    """A sweep over remote and local workers (`--local-workers`): the cheapest measured point within `tolerance` of
    the best measured throughput (predicted points never set the bar nor win), with the rule in words. Equal costs:
    the faster, then fewer machines (remote workers, then local). None when no measured point is priced."""
    rule = SURFACE_RULE.format(tol=tolerance * 100)
    measured = [(q, int(_get(p, "local_workers") or 0)) for p in points
                if (q := _point(p)) is not None and not q.predicted and q.bps > 0]
    if not measured:
        return None, rule
    best = max(q.bps for q, _ in measured)
    need = (1 - tolerance) * best * (1 - 1e-12)
    fast = [(q, local) for q, local in measured if q.bps >= need and q.cost is not None and math.isfinite(q.cost)]
    if not fast:
        return None, rule
    fast.sort(key=lambda m: (_cost(m[0]), -m[0].bps, m[0].workers, m[1]))
    (pick, local), others = fast[0], fast[1:]
    nxt = (f"next cheapest within it: {_place(others[0][0].workers, others[0][1])} at {usd(others[0][0].cost)}."
           if others else f"the only one of {len(measured)} measured points within it.")
    reason = (f"{_place(pick.workers, local)}: {usd(pick.cost)} per 1,000 batches at {_bps(pick.bps)} (measured), "
              f"within {tolerance * 100:g}% of the best measured {_bps(best)}; {nxt}")
    return replace(_pick(pick, reason), local_workers=local), rule


def _place(workers: int, local: int) -> str:
    """'2 remote workers + 1 local worker per trainer', or '2 remote workers' alone."""
    remote = f"{workers} remote worker{'' if workers == 1 else 's'}"
    return remote + (f" + {local} local worker{'' if local == 1 else 's'} per trainer" if local else "")


def _get(p: Any, key: str, default: Any = None) -> Any:
    return p.get(key, default) if isinstance(p, dict) else getattr(p, key, default)
