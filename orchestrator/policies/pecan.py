"""Pecan's AutoPlacement (USENIX ATC'24, §4.2; its `local_worker_decision_utils.cc`), on dsctl's cost model.

A hybrid job reads from remote workers and from workers inside each trainer process (runtime/placement.py). The
trainer hosts are paid for whatever their CPUs do (Equation 1 charges them on what they have), so a local worker
costs nothing unless it slows the training step; a remote worker costs its machine. The policy moves the pipeline
to where it is cheapest, in three phases, each change judged on a measurement:

1. **Remote.** Add a remote worker while the time it saves pays for it: with relative batch-time improvement r,
   trainer hosts at T $/h and n remote workers at W $/h each, keep worker n+1 when r·(T + n·W) > W·(1 − r) (the
   cost of a batch, batch time × hourly cost, went down); otherwise remove it and go on.
2. **Local.** Add local workers, one at a time up to `local_cap` (the spec's service.local_workers), while batch
   time stays within `local_slowdown` (10%) of the best measured in this phase; a local worker that slows it more
   is removed (the model needs the trainer's CPU) and the phase ends.
3. **Trim.** Remove remote workers while the money saved exceeds the cost of the longer run (a batch's cost went
   down again); the removal that made a batch dearer is undone. Then hold.

Prices are those of the run's catalog, on either basis of Equation 1 (`basis`): `vm-hours` charges a remote worker
its machine's hourly price; `utilization` its CPU at the measured utilization plus its memory. Trainer hosts cost
the same on both (Equation 1 charges them on allocation).

dsctl's rules, where Pecan leaves them open:
- Noise: a change is judged on `window_batches` batches measured after a pause of `pause_batches` (Cachew's
  numbers), never on one window; phase 1 also asks the improvement to exceed `threshold` (3%, Cachew's search
  threshold), so a gain inside one window's noise on a shared machine does not buy a worker, and phase 3 takes a
  removal whose batch time rose by no more than `threshold` as one that cost no time (beside dear trainers a
  worker's price is under 2% of the hourly cost, and the money rule alone would keep or drop it on noise).
- The training step: the judgement is on batch time (what the money buys); each reason also says how the model's
  own step time (batch time less input wait) moved, so a local worker that steals the model's CPU shows.
- After the trim the policy holds: a worker count it did not ask for (a failed worker) restarts phase 1 from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import Field

from .base import Action, Decision, Limits, Measurement, Observation, Policy, ms, pct, summarize

Phase = Literal["remote", "remote-settle", "local", "trim", "hold"]
Basis = Literal["vm-hours", "utilization"]


class PecanConfig(Limits):
    """The policy's constants (Pecan's and dsctl's, see the module docstring) and the run's prices."""

    window_batches: int = Field(100, ge=1, description="batches averaged into one measurement")
    pause_batches: int = Field(150, ge=0, description="batches ignored after each change")
    threshold: float = Field(0.03, ge=0, lt=1, description="phase 1: a remote worker must cut batch time by more")
    local_slowdown: float = Field(0.10, gt=0, lt=1, description="phase 2: the most a local worker may slow batch time")
    local_cap: int = Field(1, ge=0, le=64, description="local workers per trainer at most (service.local_workers)")
    basis: Basis = Field("vm-hours", description="how remote workers are charged: Equation 1's vm-hours or utilization")
    trainers_per_hour: float = Field(0.0, ge=0, description="every trainer host together, $/h (set by dsctl)")
    worker_cpu_per_hour: float = Field(0.0, ge=0, description="one remote worker's CPU, $/h (set by dsctl)")
    worker_memory_per_hour: float = Field(0.0, ge=0, description="one remote worker's memory, $/h (set by dsctl)")


@dataclass(frozen=True)
class Point:
    """A measured placement: remote workers, local workers per trainer, and what a batch took and cost."""

    remote: int
    local: int
    m: Measurement
    cost_per_hour: float

    @property
    def batch_time_s(self) -> float:
        return self.m.batch_time_s

    @property
    def cost_per_batch(self) -> float:
        return self.m.batch_time_s * self.cost_per_hour / 3600.0

    @property
    def step_time_s(self) -> float:
        """The model's own time per batch: batch time less the time it waited for input."""
        return self.m.batch_time_s * (1.0 - self.m.input_stall_frac)

    def said(self) -> str:
        return (f"{self.remote} remote + {self.local} local: batch {ms(self.batch_time_s)}, step "
                f"{ms(self.step_time_s)} (measured), ${self.cost_per_batch * 1000:.4g} per 1,000 batches (at the "
                "catalog's prices)")


def remote_worker_pays(improvement: float, trainers_per_hour: float, remote: int, worker_per_hour: float) -> bool:
    """Pecan's phase-1 rule: worker remote+1, which cut batch time by `improvement` (a fraction), pays for itself
    when improvement·(T + remote·W) > W·(1 − improvement), i.e. a batch costs less with it."""
    return improvement * (trainers_per_hour + remote * worker_per_hour) > worker_per_hour * (1.0 - improvement)


class PecanPolicy:
    """Pecan's three phases as a state machine over observations (see the module docstring)."""

    name = "pecan"

    def __init__(self, config: PecanConfig | None = None) -> None:
        self.config = config or PecanConfig()
        self._phase: Phase = "remote"
        self._remote = self.config.initial  # the counts last asked for
        self._local = 0
        self._since_change = 0
        self._window: list[Observation] = []
        self._before: Point | None = None  # the point the change being measured is judged against
        self._best_local: Point | None = None  # phase 2: the best point so far
        self._event = "starting"

    @property
    def initial_workers(self) -> int:
        return self.config.initial

    @property
    def phase(self) -> Phase:
        return self._phase

    def worker_per_hour(self, cpu_util: float | None) -> float:
        """One remote worker's $/h on the policy's basis (utilization: its CPU as measured; 1.0 when unmeasured)."""
        c = self.config
        if c.basis == "utilization":
            return c.worker_cpu_per_hour * (1.0 if cpu_util is None else cpu_util) + c.worker_memory_per_hour
        return c.worker_cpu_per_hour + c.worker_memory_per_hour

    def observe(self, obs: Observation) -> Decision:
        c = self.config
        if (obs.workers, obs.local_workers) != (self._remote, self._local):
            self._since_change += obs.batches
            if self._since_change <= c.pause_batches:
                return self._hold(f"waiting for {self._remote} remote + {self._local} local worker(s) "
                                  f"(now {obs.workers} + {obs.local_workers})")
            # Not what was asked for (a worker failed, a change that did not happen): start again from here.
            self._remote, self._local = obs.workers, obs.local_workers
            self._phase, self._before, self._best_local, self._window = "remote", None, None, []
            self._since_change, self._event = 0, f"the placement changed to {obs.workers} + {obs.local_workers}"
            return self._hold(f"{self._event} outside the policy: measuring it")
        before, self._since_change = self._since_change, self._since_change + obs.batches
        if before < c.pause_batches:
            return self._hold(f"pausing after {self._event}: {min(self._since_change, c.pause_batches)} of "
                              f"{c.pause_batches} batches")
        if self._phase == "hold" or obs.batches == 0:
            return self._hold("holding: " + (self._before.said() if self._before else "no batches in this window"))
        self._window.append(obs)
        got = sum(o.batches for o in self._window)
        if got < c.window_batches:
            return self._hold(f"measuring {self._remote} remote + {self._local} local: {got} of {c.window_batches} "
                              "batches")
        m, self._window = summarize(self._window), []
        point = Point(self._remote, self._local, m,
                      c.trainers_per_hour + self._remote * self.worker_per_hour(m.worker_cpu_util))
        return {"remote": self._on_remote, "remote-settle": self._on_settle, "local": self._on_local,
                "trim": self._on_trim}[self._phase](point)

    # --- phases -------------------------------------------------------------------------------

    def _on_remote(self, p: Point) -> Decision:
        c, before = self.config, self._before
        if before is None:
            if p.remote >= c.max_workers:
                return self._start_local(p, f"{p.said()}; at max_workers")
            self._before = p
            return self._change(p.remote + 1, p.local, f"{p.said()}: adding remote worker {p.remote + 1} to see if "
                                "it pays", f"adding remote worker {p.remote + 1}")
        gain = (before.batch_time_s - p.batch_time_s) / before.batch_time_s
        w = self.worker_per_hour(p.m.worker_cpu_util)
        pays = gain > c.threshold and remote_worker_pays(gain, c.trainers_per_hour, before.remote, w)
        said = (f"remote worker {p.remote} changed batch time {ms(before.batch_time_s)} → {ms(p.batch_time_s)} "
                f"({pct(-gain, True)}), a batch ${before.cost_per_batch * 1000:.4g} → ${p.cost_per_batch * 1000:.4g}"
                " per 1,000")
        if pays:
            if p.remote >= c.max_workers:
                return self._start_local(p, f"{said}: it pays, at max_workers")
            self._before = p
            return self._change(p.remote + 1, p.local, f"{said}: it pays for itself, adding another",
                                f"adding remote worker {p.remote + 1}")
        self._before, self._phase = before, "remote-settle"
        return self._change(before.remote, p.local, f"{said}: it does not pay for itself, removing it",
                            f"removing remote worker {p.remote}")

    def _on_settle(self, p: Point) -> Decision:
        return self._start_local(p, p.said())

    def _start_local(self, p: Point, said: str) -> Decision:
        if self.config.local_cap <= p.local:
            return self._start_trim(p, f"{said}; no local worker may be added (local_cap {self.config.local_cap})")
        self._phase, self._best_local = "local", p
        return self._change(p.remote, p.local + 1, f"{said}; phase 2: adding local worker {p.local + 1} (the trainer "
                            "hosts are paid for already)", f"adding local worker {p.local + 1}")

    def _on_local(self, p: Point) -> Decision:
        c, best = self.config, self._best_local
        assert best is not None, "phase 2 starts from a measured point"
        slower = (p.batch_time_s - best.batch_time_s) / best.batch_time_s
        step = (p.step_time_s - best.step_time_s) / best.step_time_s if best.step_time_s > 0 else 0.0
        said = (f"local worker {p.local} changed batch time {ms(best.batch_time_s)} → {ms(p.batch_time_s)} "
                f"({pct(slower, True)}) and the model's step {pct(step, True)}")
        if slower > c.local_slowdown:
            self._phase, self._before = "trim", best
            why = " (the model's own step slowed: it needs the trainer's CPU)" if step > c.local_slowdown else ""
            return self._change(p.remote, p.local - 1, f"{said}: more than the {pct(c.local_slowdown)} allowed{why}; "
                                "removing it", f"removing local worker {p.local}")
        if p.batch_time_s <= best.batch_time_s:
            self._best_local = p
        if p.local >= c.local_cap:
            return self._start_trim(p, f"{said}: within {pct(c.local_slowdown)}; at local_cap {c.local_cap}")
        return self._change(p.remote, p.local + 1, f"{said}: within {pct(c.local_slowdown)}, adding another",
                            f"adding local worker {p.local + 1}")

    def _start_trim(self, p: Point, said: str) -> Decision:
        self._phase, self._before = "trim", p
        if p.remote <= self.config.min_workers:
            self._phase = "hold"
            return self._hold(f"{said}; at min_workers: holding at {p.said()}")
        return self._change(p.remote - 1, p.local, f"{said}; phase 3: removing remote worker {p.remote} to see if "
                            "the money saved pays for the longer run", f"removing remote worker {p.remote}")

    def _on_trim(self, p: Point) -> Decision:
        c, before = self.config, self._before
        assert before is not None, "phase 3 starts from a measured point"
        if p.remote == before.remote:  # phase 2's last local worker was removed: this is the point to trim from
            return self._start_trim(p, p.said())
        said = (f"without remote worker {before.remote} a batch took {ms(before.batch_time_s)} → "
                f"{ms(p.batch_time_s)} and cost ${before.cost_per_batch * 1000:.4g} → ${p.cost_per_batch * 1000:.4g} per "
                "1,000")
        rise = (p.batch_time_s - before.batch_time_s) / before.batch_time_s
        if rise <= c.threshold:  # dsctl's rule: within one measurement's noise, the run took no longer
            said += f" (batch time {pct(rise, True)}: within the {pct(c.threshold)} noise threshold, so no longer)"
        if rise <= c.threshold or p.cost_per_batch < before.cost_per_batch:
            self._before = p
            if p.remote <= c.min_workers:
                self._phase = "hold"
                return self._hold(f"{said}: cheaper; at min_workers, holding at {p.said()}")
            return self._change(p.remote - 1, p.local, f"{said}: cheaper, removing another",
                                f"removing remote worker {p.remote}")
        self._phase = "hold"
        return self._change(before.remote, p.local, f"{said}: dearer, adding it back and holding at {before.said()}",
                            f"adding back remote worker {before.remote}")

    # --- decisions -----------------------------------------------------------------------------

    def _change(self, remote: int, local: int, reason: str, event: str) -> Decision:
        grows = local > self._local if remote == self._remote else remote > self._remote
        action: Action = "add" if grows else "remove"
        self._remote, self._local = remote, local
        self._since_change, self._event, self._window = 0, event, []
        return Decision(action, remote, reason, local_target=local)

    def _hold(self, reason: str) -> Decision:
        return Decision("hold", self._remote, reason, local_target=self._local)


POLICY = Policy(make=PecanPolicy, settings=PecanConfig)  # this module's registration (policies/__init__.py)
