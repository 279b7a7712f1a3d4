"""Cachew's autoscaling policy (ATC'22 §4.3): scale on what the trainers feel, not on CPU.

Constants are `CachewConfig` defaults. Cachew's own rules, as the paper gives them:
- Search (from the start, and after a re-check asks for more): average `window_batches` (100)
  batches of batch time per worker count; add one worker at a time while the last one cut
  batch time by more than `threshold` (3%); when one did not, remove it and converge.
- Converged: remember batch time and the client's result-queue fill; every `recheck_batches`
  (1,000) compare the latest `window_batches` with them: add a worker (and search again)
  when batch time rose significantly above converged; remove one when queue fill is more than
  `queue_fill_trigger` (40%) above converged, then keep removing one at a time while batch
  time holds (within `threshold` of its value before the first removal); when a removal costs
  more, add it back.
- After every change nothing is measured for `pause_batches` (150) batches: windows that
  start inside the pause are skipped whole.

dsctl's own rules, each marked "dsctl's rule" where it is applied, and why:
- "Significantly" is `scale_up_trigger` (10%): the paper gives no number; 10% is three times
  the search threshold, above the noise of one window on a shared machine.
- Growing also needs the trainers to wait for input (stall >= `input_bound_stall`, 5%, and not
  below converged): a model that got slower raises batch time too, and the paper's rule would
  then add workers that buy nothing.
- Growing when input stall rose by more than `stall_rise_trigger` (10 points): a model that got
  faster leaves batch time where the workers hold it, so the paper's batch-time rule never sees
  the trainers start waiting.
- The queue-fill rise must also be at least `queue_fill_min_rise` (1 batch): 40% of a queue
  that held 0.2 elements is noise.
- The converged queue fill is read at the first re-check, not in the window that converged:
  after a change the queue drains or fills at the difference of two nearly equal rates, for
  longer than the pause (measured: 24.4 in the converging window, 0.0 from the first re-check
  on, of a 32-element buffer).
- Without a queue-fill reading (a client that cannot report it), batch time rising more than
  `scale_up_trigger` while the trainers do not wait is read as a slower model and removes a
  worker: the only slack signal left. With queue fill measured, the paper's rule alone decides,
  except when the queue was too full at convergence to rise by `queue_fill_trigger` within the
  client's buffer (`queue_capacity`): then the same batch-time rule decides. The client's queue
  is an integrator of (worker rate - model rate): at a steady worker count it sits near empty
  (the trainers wait) or near the buffer's size (the workers outpace the model), and Cachew's
  search often converges at a count whose workers slightly outpace the model, so the queue is
  already full there and the paper's rise can never happen (measured here: 27.0 of 32 at
  convergence, 30.0 with a model three times slower).
- Growing wins if both fire: a stalled accelerator costs more than an idle worker.
- A re-check's finding is acted on only when a fresh window measured after it says the same:
  the re-check's window may straddle the change it detected (half old job, half new), and a
  shrink measured against such a window would add back the worker it just removed.
- Shrink judges batch time against the mean of the counts that held it (one noisy reference
  does not stop the shrink early); a cost under twice the threshold is within one window's
  noise, so it is measured once more and judged on both windows.
A worker count the policy did not ask for (a failed worker, a manual change) restarts the
search from the observed count. The orchestrator joins the trainers' windows before they
arrive here (orchestrator/autoscaling.py), and sizes the client buffer so queue fill can rise
(`leave_queue_room`, dsctl's rule too).
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace
from typing import Literal

from pydantic import Field, model_validator

from .base import Decision, Limits, Measurement, Observation, Policy, ms, pct, summarize

QUEUE_ROOM = 32  # client buffer (elements) under this policy when the spec sets none (autoscaling.leave_queue_room)

Phase = Literal["search", "settle", "converged", "confirm", "shrink"]
FULL_FRACTION = 0.9  # a queue that reads this share of the client's buffer is full


class CachewConfig(Limits):
    """Published constants as defaults (Cachew §4.3); scale_up_trigger, stall_rise_trigger, input_bound_stall
    and queue_fill_min_rise are dsctl's (see the module docstring)."""

    threshold: float = Field(0.03, gt=0, lt=1, description="a worker must change batch time by more than this")
    window_batches: int = Field(100, ge=1, description="batches averaged into one measurement")
    pause_batches: int = Field(150, ge=0, description="batches ignored after each scaling event")
    recheck_batches: int = Field(1000, ge=1, description="after convergence, re-check this often")
    scale_up_trigger: float = Field(0.10, gt=0, description="batch-time rise over converged that counts")
    stall_rise_trigger: float = Field(0.10, gt=0, le=1, description="input-stall rise (fraction points)")
    input_bound_stall: float = Field(0.05, ge=0, le=1, description="stall at or above this: input-bound")
    queue_fill_trigger: float = Field(0.40, gt=0, description="queue-fill rise over converged that counts")
    queue_fill_min_rise: float = Field(1.0, ge=0, description="... and by at least this many batches")
    queue_capacity: int | None = Field(
        None, ge=1, description="the client's buffer in elements (dsctl sets it from service.max_outstanding_requests)")

    @model_validator(mode="after")
    def _recheck_covers_window(self) -> CachewConfig:
        if self.recheck_batches < self.window_batches:
            raise ValueError("recheck_batches must be >= window_batches: a re-check averages one window")
        return self


class CachewPolicy:
    """Cachew's batch-time policy as a state machine over observations (see module docstring)."""

    name = "cachew"

    def __init__(self, config: CachewConfig | None = None) -> None:
        self.config = config or CachewConfig()
        self._workers: int | None = None  # last observed count
        self._target = self.config.min_workers  # last count asked for
        self._phase: Phase = "search"
        self._event = "starting"  # what the current pause follows, for reasons
        self._since_change = 0  # batches observed at the current count
        self._pending = 0  # batches observed while a change had not taken effect yet
        self._window: list[Observation] = []
        self._prev: Measurement | None = None  # search: measurement at one worker fewer
        self._held: list[float] = []  # shrink: batch times before the first removal and at each count that held
        self._at_count: list[float] = []  # shrink: batch times measured at the current count
        self._converged: Measurement | None = None
        self._fill_settled = False  # converged queue fill read at the first re-check, not at convergence
        self._since_check = 0
        self._recent: deque[Observation] = deque()

    @property
    def initial_workers(self) -> int:
        return self.config.initial

    def queue_room(self, asked: int | None) -> int:
        """ReadsQueue: the client buffer its queue-fill signal needs (the spec's, else max(QUEUE_ROOM, max_workers)),
        and the policy told its size, to know when the queue is too full to rise."""
        room = asked or max(QUEUE_ROOM, self.config.max_workers)
        self.config = self.config.model_copy(update={"queue_capacity": room})
        return room

    @property
    def phase(self) -> Phase:
        return self._phase

    @property
    def converged(self) -> Measurement | None:
        """What batch time, stall and queue fill were when the count last converged."""
        return self._converged

    def observe(self, obs: Observation) -> Decision:
        c, n = self.config, obs.workers
        if self._workers is None:
            self._workers = self._target = n
        if not c.min_workers <= n <= c.max_workers and self._target == n:
            want = min(max(n, c.min_workers), c.max_workers)
            self._prev = None
            return self._change(want, f"{n} workers is outside {c.min_workers}..{c.max_workers}: going to {want}",
                                "search", f"going to {want} workers")
        if n != self._workers:
            self._workers = n
            self._since_change = 0
            if n != self._target:  # nobody asked for this count: search again from it
                self._target, self._phase, self._prev = n, "search", None
                self._event, self._window = f"the worker count changed to {n} outside the policy", []
        elif n != self._target:
            self._pending += obs.batches
            if self._pending <= c.pause_batches:
                return self._hold(f"waiting for the worker count to go from {n} to {self._target}")
            self._event = f"the change to {self._target} workers did not happen"
            self._target, self._phase, self._window, self._since_change = n, "settle", [], 0
            return self._hold(f"worker count still {n} after {self._pending} batches: staying at {n}")
        before, self._since_change = self._since_change, self._since_change + obs.batches
        if before < c.pause_batches:
            return self._hold(f"pausing after {self._event}: {min(self._since_change, c.pause_batches)}"
                              f" of {c.pause_batches} batches")
        if obs.batches == 0:
            return self._hold("no batches in this window")
        if self._phase == "converged":
            return self._on_converged(obs)
        self._window.append(obs)
        got = sum(o.batches for o in self._window)
        if got < c.window_batches:
            return self._hold(f"measuring {n} workers: {got} of {c.window_batches} batches")
        m, self._window = summarize(self._window), []
        return {"search": self._on_search, "settle": self._on_settle, "shrink": self._on_shrink,
                "confirm": self._on_confirm}[self._phase](m)

    # --- phases -------------------------------------------------------------------------------

    def _on_search(self, m: Measurement) -> Decision:
        c, n, prev = self.config, m.workers, self._prev
        if prev is None:
            if n >= c.max_workers:
                return self._converge(m, f"at max_workers={n}: ")
            self._prev = m
            return self._change(n + 1, f"batch time {ms(m.batch_time_s)} with {n} worker(s): adding worker {n + 1}"
                                " to see if it helps", "search", f"adding worker {n + 1}")
        gain = (prev.batch_time_s - m.batch_time_s) / prev.batch_time_s
        said = (f"batch time {ms(prev.batch_time_s)} → {ms(m.batch_time_s)} ({pct(-gain, True)}) after adding"
                f" worker {n}")
        if gain > c.threshold:
            if n >= c.max_workers:
                return self._converge(m, f"{said}: more than the {pct(c.threshold)} threshold but max_workers={n}; ")
            self._prev = m
            return self._change(n + 1, f"{said}: more than the {pct(c.threshold)} threshold, adding another",
                                "search", f"adding worker {n + 1}")
        if n - 1 < c.min_workers:
            return self._converge(m, f"{said}: at min_workers; ")
        return self._change(n - 1, f"{said}: less than the {pct(c.threshold)} threshold, removing it",
                            "settle", f"removing worker {n}")

    def _on_settle(self, m: Measurement) -> Decision:
        return self._converge(m, "")

    def _on_shrink(self, m: Measurement) -> Decision:
        c, n = self.config, m.workers
        ref = sum(self._held) / len(self._held)
        self._at_count.append(m.batch_time_s)
        now = sum(self._at_count) / len(self._at_count)
        rise = (now - ref) / ref
        said = f"batch time {ms(ref)} → {ms(now)} ({pct(rise, True)}) after removing worker {n + 1}"
        if c.threshold < rise <= 2 * c.threshold and len(self._at_count) == 1:
            return self._hold(f"{said}: within one window's noise of the {pct(c.threshold)} threshold,"
                              " measuring again")
        self._at_count = []
        if rise > c.threshold:
            return self._change(n + 1, f"{said}: more than the {pct(c.threshold)} threshold, adding it back",
                                "settle", f"adding worker {n + 1} back")
        self._held.append(now)
        if n <= c.min_workers:
            return self._converge(m, f"{said}: held, and at min_workers={n}; ")
        return self._change(n - 1, f"{said}: within the {pct(c.threshold)} threshold, removing another",
                            "shrink", f"removing worker {n}")

    def _on_converged(self, obs: Observation) -> Decision:
        c = self.config
        self._recent.append(obs)
        while sum(o.batches for o in self._recent) - self._recent[0].batches >= c.window_batches:
            self._recent.popleft()
        self._since_check += obs.batches
        if self._since_check < c.recheck_batches:
            return self._hold(f"converged at {obs.workers} workers; re-check in"
                              f" {c.recheck_batches - self._since_check} batches")
        self._since_check = 0
        return self._recheck(summarize(list(self._recent)))

    def _on_confirm(self, m: Measurement) -> Decision:
        self._phase, self._since_check = "converged", 0
        self._recent.clear()
        return self._recheck(m, confirmed=True)

    def _recheck(self, cur: Measurement, confirmed: bool = False) -> Decision:
        c, conv, n = self.config, self._converged, cur.workers
        assert conv is not None
        settling = not self._fill_settled
        if settling:
            # dsctl's rule: the queue drains or fills for a while after a change (at the difference of two
            # near-equal rates), so its converged level is the first re-check's, well clear of the change.
            self._fill_settled = True
            self._converged = conv = replace(conv, queue_fill=cur.queue_fill)
        rise = (cur.batch_time_s - conv.batch_time_s) / conv.batch_time_s
        stall_rise = cur.input_stall_frac - conv.input_stall_frac
        input_bound = cur.input_stall_frac >= c.input_bound_stall and stall_rise >= 0
        said = (f"{'confirmed' if confirmed else 're-check'} at {n} workers: batch time {ms(cur.batch_time_s)}"
                f" ({pct(rise, True)} vs converged {ms(conv.batch_time_s)}), input stall"
                f" {pct(cur.input_stall_frac)} (converged {pct(conv.input_stall_frac)})")
        if cur.queue_fill is not None and conv.queue_fill is not None:
            said += f", queue fill {cur.queue_fill:.1f} (converged {conv.queue_fill:.1f}{', read now' if settling else ''})"
        # Cachew: batch time rose significantly. dsctl's rules: only while input-bound, or stall rose.
        grow = (rise > c.scale_up_trigger and input_bound) or stall_rise > c.stall_rise_trigger
        if grow and not confirmed and n < c.max_workers:
            return self._confirm(f"{said}: trainers wait for input")
        if grow:
            if n >= c.max_workers:
                return self._hold(f"{said}: trainers wait for input, but max_workers={n} reached")
            self._prev = cur
            return self._change(n + 1, f"{said}: trainers wait for input, adding worker {n + 1}",
                                "search", f"adding worker {n + 1}")
        why = None
        if cur.queue_fill is not None and conv.queue_fill is not None and not settling:
            grew = cur.queue_fill - conv.queue_fill
            if cur.queue_fill > conv.queue_fill * (1 + c.queue_fill_trigger) and grew >= c.queue_fill_min_rise:
                why = (f"queue fill {cur.queue_fill:.1f} batches vs converged {conv.queue_fill:.1f}: more than"
                       f" {pct(c.queue_fill_trigger)} above, workers outpace the model")
        if why is None and rise > c.scale_up_trigger and not input_bound:
            if cur.queue_fill is None or conv.queue_fill is None:
                why = ("batch time rose while trainers do not wait for input and queue fill is not measured:"
                       " the model got slower (dsctl's rule)")
            elif not self._fill_can_rise(conv.queue_fill):
                why = (f"batch time rose while trainers do not wait for input, and queue fill at convergence"
                       f" ({conv.queue_fill:.1f} of a {c.queue_capacity}-element buffer) was too full to rise"
                       f" {pct(c.queue_fill_trigger)}: the model got slower (dsctl's rule)")
        if why is None:
            return self._hold(f"{said}: holding")
        if n <= c.min_workers:
            return self._hold(f"{said}; {why}, but at min_workers={n}")
        if not confirmed:
            return self._confirm(f"{said}; {why}")
        self._held, self._at_count = [cur.batch_time_s], []
        return self._change(n - 1, f"{said}; {why}: removing worker {n}", "shrink", f"removing worker {n}")

    # --- helpers ------------------------------------------------------------------------------

    def _fill_can_rise(self, converged_fill: float) -> bool:
        """Whether the paper's queue-fill rule can fire at all: the rise it asks for fits in the client's
        buffer (a full queue reads a little under its size: 30.0 of 32 here, so 90% counts as full)."""
        c = self.config
        if c.queue_capacity is None:
            return True
        needed = max(converged_fill * (1 + c.queue_fill_trigger), converged_fill + c.queue_fill_min_rise)
        return needed <= FULL_FRACTION * c.queue_capacity

    def _confirm(self, reason: str) -> Decision:
        self._phase, self._window = "confirm", []
        return self._hold(f"{reason}; measuring a fresh window before acting")

    def _converge(self, m: Measurement, prefix: str) -> Decision:
        self._converged, self._phase, self._since_check = m, "converged", 0
        self._fill_settled = False
        self._recent.clear()
        qf = "" if m.queue_fill is None else f", queue fill {m.queue_fill:.1f} batches"
        return self._hold(f"{prefix}converged at {m.workers} workers: batch time {ms(m.batch_time_s)},"
                          f" input stall {pct(m.input_stall_frac)}{qf}")

    def _change(self, target: int, reason: str, phase: Phase, event: str) -> Decision:
        action: Literal["add", "remove"] = "add" if target > (self._workers or 0) else "remove"
        self._target, self._phase, self._event = target, phase, event
        self._window, self._pending = [], 0
        return Decision(action, target, reason)

    def _hold(self, reason: str) -> Decision:
        return Decision("hold", self._target, reason)


POLICY = Policy(make=CachewPolicy, settings=CachewConfig)  # this module's registration (policies/__init__.py)
