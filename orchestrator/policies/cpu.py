"""The Kubernetes Horizontal Pod Autoscaler on worker CPU: the baseline Cachew is compared with.

    desired = ceil(current × mean_worker_cpu_util / target)      (target 0.8 by default)

held when the ratio is within `tolerance` (10%) of 1, evaluated once per `sync_period_s`
(15 s), at most doubling or +4 workers per evaluation, never below the highest
recommendation of the last `downscale_stabilization_s` (300 s, which also means no
scale-down in the first 300 s), and ignoring CPU for `pause_after_change_s` (30 s) after a
change while new workers start. These are HPA's defaults; times come from `Observation.t`.

Why it mis-provisions input pipelines (Cachew §6.2): CPU is not what limits them.
- Latency-bound workers (reading remote storage, waiting on I/O or memory bandwidth) run at
  low CPU even while each one adds throughput: the formula sees idle CPU and holds or
  shrinks, so the job is under-provisioned and the accelerators stall.
- CPU-heavy workers that are not the bottleneck still look busy: the formula adds workers
  to bring utilization to the target, 1/0.8 = 1.25× what the trainers can consume or more.
Neither the trainers' batch time nor their input stall enters the formula.
"""

from __future__ import annotations

import math

from pydantic import Field

from .base import Decision, Limits, Observation, Policy, pct


class CpuConfig(Limits):
    """HPA's defaults (Kubernetes autoscaling/v2 behaviour and kube-controller-manager flags)."""

    target_util: float = Field(0.8, gt=0, le=1, description="mean worker CPU utilization to aim for")
    tolerance: float = Field(0.1, ge=0, lt=1, description="no change while |util/target - 1| <= this")
    sync_period_s: float = Field(15.0, ge=0, description="evaluate at most this often")
    downscale_stabilization_s: float = Field(300.0, ge=0, description="scale down to the highest recent rec.")
    pause_after_change_s: float = Field(30.0, ge=0, description="ignore CPU this long after a change")
    scale_up_max_factor: float = Field(2.0, ge=1, description="grow at most to this multiple per evaluation")
    scale_up_max_step: int = Field(4, ge=1, description="... or by this many workers, whichever is more")


def hpa_desired(current: int, util: float, target: float = 0.8, tolerance: float = 0.1) -> int:
    """HPA's replica formula, before limits: ceil(current × util / target), or current within tolerance."""
    ratio = util / target
    if abs(ratio - 1) <= tolerance:
        return current
    return math.ceil(round(current * ratio, 9))  # round: 4 × 1.0/0.8 must be 5, not 6


class CpuUtilizationPolicy:
    """HPA on mean worker CPU (see module docstring); every number it uses comes from observations."""

    name = "cpu"

    def __init__(self, config: CpuConfig | None = None) -> None:
        self.config = config or CpuConfig()
        self._workers: int | None = None
        self._target = self.config.min_workers
        self._changed_t = 0.0  # when the observed worker count last changed
        self._last_t = 0.0  # end of the previous window = start of the current one
        self._bucket: list[float] = []  # CPU samples since the last evaluation
        self._bucket_start = 0.0
        self._history: list[tuple[float, int]] = []  # (t, recommendation), for stabilization

    @property
    def initial_workers(self) -> int:
        return self.config.initial

    def observe(self, obs: Observation) -> Decision:
        c, n, t = self.config, obs.workers, obs.t
        window_start, self._last_t = self._last_t, t
        if self._workers is None:
            self._workers = self._target = n
            self._changed_t = window_start  # starting counts as a change: all workers are new
            self._history = [(t, n)]  # as HPA: the starting count is the first recommendation
        if not c.min_workers <= n <= c.max_workers and self._target == n:
            want = min(max(n, c.min_workers), c.max_workers)
            return self._change(n, want, f"{n} workers is outside {c.min_workers}..{c.max_workers}: going to {want}")
        if n != self._workers:  # the new count runs from this window on (asked for or not)
            self._workers, self._target, self._changed_t, self._bucket = n, n, window_start, []
        if window_start - self._changed_t < c.pause_after_change_s:  # skip windows that start inside it
            return self._hold(f"ignoring worker CPU for {c.pause_after_change_s:.0f} s after scaling to {n}:"
                              f" {t - self._changed_t:.0f} s so far")
        if obs.worker_cpu_util is None:
            return self._hold("no worker CPU reading in this window")
        if not self._bucket:
            self._bucket_start = window_start
        self._bucket.append(obs.worker_cpu_util)
        if t - self._bucket_start < c.sync_period_s:
            return self._hold(f"measuring worker CPU at {n} workers: next evaluation in"
                              f" {c.sync_period_s - (t - self._bucket_start):.0f} s")
        util = sum(self._bucket) / len(self._bucket)
        self._bucket = []
        return self._evaluate(n, util, t)

    def _evaluate(self, n: int, util: float, t: float) -> Decision:
        c = self.config
        formula = math.ceil(round(n * util / c.target_util, 9))
        raw = hpa_desired(n, util, c.target_util, c.tolerance)
        rec = min(max(raw, c.min_workers), c.max_workers)
        if rec > n:
            rec = min(rec, max(math.ceil(n * c.scale_up_max_factor), n + c.scale_up_max_step))
        self._history = [(ht, r) for ht, r in self._history if ht >= t - c.downscale_stabilization_s]
        self._history.append((t, rec))
        said = (f"mean worker CPU {pct(util)} vs target {pct(c.target_util)}: ceil({n} × {util:.2f} /"
                f" {c.target_util:.2f}) = {formula}")
        if raw == n and formula != n:
            return self._hold(f"{said}, within the {pct(c.tolerance)} tolerance: holding at {n}")
        if rec > n:
            return self._change(n, rec, f"{said}: adding {rec - n} worker(s) to reach {rec}")
        if rec == n:
            limited = f", limited to {c.min_workers}..{c.max_workers}" if formula != n else ""
            return self._hold(f"{said}{limited}: holding at {n}")
        floor = min(n, max(r for _, r in self._history))
        if floor >= n:
            return self._hold(f"{said}, but {floor} was recommended within the last"
                              f" {c.downscale_stabilization_s:.0f} s: holding at {n}")
        return self._change(n, floor, f"{said}: removing {n - floor} worker(s) to reach {floor}")

    def _change(self, n: int, target: int, reason: str) -> Decision:
        self._target = target
        return Decision("add" if target > n else "remove", target, reason)

    def _hold(self, reason: str) -> Decision:
        return Decision("hold", self._target, reason)


POLICY = Policy(make=CpuUtilizationPolicy, settings=CpuConfig)  # this module's registration (policies/__init__.py)
