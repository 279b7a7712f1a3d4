"""Cachew's autocaching policy (ATC'22 §4.4): compute, or cache at one hint, whichever is projected fastest.

Inputs, all measured by dsctl's profiling phase (runtime/autocache_profile.py) on the workers:
the seconds per element at the pipeline's end (active_time_L), at each hint (active_time_A), the
bytes per element at each hint (b_A), and the storage's read model g(b) (costmodel/storage.py).
For N elements, as in the paper:

    TotalComputeTime         = N x active_time_L
    PreAutocacheTime         = M x active_time_A
    PostAutocacheTime        = TotalComputeTime - PreAutocacheTime
    ProjectedCacheReadTime   = M x g(b_A)
    ProjectedTotalCacheTime  = ProjectedCacheReadTime + PostAutocacheTime

dsctl takes M = N (one element at the hint per element at the end, true of the builtins, whose
hints are followed by maps only). Where the profile measured it, PostAutocacheTime is not the
subtraction but the work after the hint timed alone: the pipeline's end with the hint replayed from
memory (`after:<hint>` points, runtime/autocache_profile.py). The subtraction misses post-hint work
that overlaps a slow source read (parallel maps run while the source waits): in dsctl's
constructed source case it projected the source cache 25x too fast. Without that point, the
subtraction is used, clamped at zero (two noisy times of nearly the same work can differ by a
negative amount). The fastest option is chosen; options
within `tolerance` of it count as equally fast, and among those the one whose cache costs least
to store wins (compute stores nothing), as Cachew prefers compute when source caching is no
faster (§6.3). Pure: no clocks, no I/O.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from dsctl.costmodel.storage import ReadModel, storage_month_cost


@dataclass(frozen=True)
class HintProfile:
    name: str
    s_per_element: float
    bytes_per_element: float
    after_s_per_element: float | None = None  # the work after the hint, timed alone (None: not measured)


def hints_from_points(points: dict, names) -> list[HintProfile]:
    """The hints a profile measured (`points`: name -> measured point, as autocache_profile records them)."""
    out = []
    for name in names:
        at = points.get(name) or {}
        if at.get("s_per_element"):
            after = (points.get(f"after:{name}") or {}).get("s_per_element")
            out.append(HintProfile(name, at["s_per_element"], at["bytes_per_element"], after))
    return out


@dataclass(frozen=True)
class Option:
    choice: str  # compute, or a hint's name
    projected_s: float  # for N elements
    pre_s: float = 0.0
    post_s: float = 0.0
    read_s: float = 0.0
    cache_bytes: float = 0.0
    storage_month_usd: float | None = 0.0


@dataclass(frozen=True)
class CachingDecision:
    choice: str
    n_elements: int
    options: tuple[Option, ...]
    reason: str

    def as_dict(self) -> dict:
        return {"choice": self.choice, "n_elements": self.n_elements, "reason": self.reason,
                "options": [asdict(o) for o in self.options]}


def project(end_s_per_element: float, hints: list[HintProfile], storage: ReadModel, n_elements: int,
            gb_month: float | None) -> list[Option]:
    """Every option's projected time for `n_elements` (Cachew's formulas above)."""
    total = n_elements * end_s_per_element
    options = [Option("compute", total)]
    for h in hints:
        pre = n_elements * h.s_per_element
        post = n_elements * h.after_s_per_element if h.after_s_per_element is not None else max(total - pre, 0.0)
        read = n_elements * storage.read_s(h.bytes_per_element)
        nbytes = n_elements * h.bytes_per_element
        cost = storage_month_cost(nbytes, gb_month) if gb_month is not None else None
        options.append(Option(h.name, read + post, pre, post, read, nbytes, cost))
    return options


def decide(end_s_per_element: float, hints: list[HintProfile], storage: ReadModel, *, n_elements: int,
           gb_month: float | None, tolerance: float = 0.05) -> CachingDecision:
    """The option to run the job with, and why (one sentence with the numbers)."""
    options = project(end_s_per_element, hints, storage, n_elements, gb_month)
    fastest = min(options, key=lambda o: o.projected_s)
    near = [o for o in options if o.projected_s <= fastest.projected_s * (1 + tolerance)]
    # Among the equally fast: the cheapest to store (unknown prices last), then the fastest.
    chosen = min(near, key=lambda o: (o.storage_month_usd is None, o.storage_month_usd or 0.0, o.projected_s))
    parts = ", ".join(f"{o.choice} {o.projected_s:.3g} s" for o in options)
    why = f"projected for {n_elements} elements: {parts}"
    if chosen is not fastest:
        why += (f"; {chosen.choice} is within {tolerance:.0%} of the fastest ({fastest.choice}) and cheaper to store")
    return CachingDecision(chosen.choice, n_elements, tuple(options), why)
