"""What every scaling policy sees and says: one metrics window in, one decision out.

Policies are pure state machines over observations: no clocks, no I/O, no randomness.
Everything they know arrives in an `Observation` (including `t`, the time a window
ended), so a recorded sequence replayed through a fresh policy gives the same decisions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, model_validator

Action = Literal["add", "remove", "hold"]


@dataclass(frozen=True)
class Observation:
    """One metrics window, as the orchestrator aggregates it across trainers and workers.

    t: seconds since the job started, at the end of the window.
    workers: workers serving the job during the window (what the orchestrator has running).
    batch_time_s: mean time per batch over the window, across trainers (model step + input wait).
    input_stall_frac: fraction of that batch time the trainers spent waiting for input (0..1).
    batches: batches completed in the window (policies count batches, not seconds).
    queue_fill: ready batches buffered at the client, or None where it cannot be measured.
    worker_cpu_util: mean fraction of a worker's available CPU in use (0..1), or None.
    local_workers: workers inside each trainer process (hybrid placement), as the trainers reported them.
    """

    t: float
    workers: int
    batch_time_s: float
    input_stall_frac: float
    batches: int
    queue_fill: float | None = None
    worker_cpu_util: float | None = None
    local_workers: int = 0

    def __post_init__(self) -> None:
        if self.workers < 0 or self.batches < 0 or self.local_workers < 0:
            raise ValueError(f"workers and batches must be >= 0, got {self.workers} and {self.batches}")
        if not (math.isfinite(self.batch_time_s) and self.batch_time_s >= 0):
            raise ValueError(f"batch_time_s must be a finite time >= 0, got {self.batch_time_s}")
        if self.batches > 0 and self.batch_time_s == 0:
            raise ValueError("a window with batches must have a batch time > 0")
        if not 0.0 <= self.input_stall_frac <= 1.0:
            raise ValueError(f"input_stall_frac must be in 0..1, got {self.input_stall_frac}")
        if self.queue_fill is not None and self.queue_fill < 0:
            raise ValueError(f"queue_fill must be >= 0 or None, got {self.queue_fill}")
        if self.worker_cpu_util is not None and not 0.0 <= self.worker_cpu_util <= 1.0:
            raise ValueError(f"worker_cpu_util must be in 0..1 or None, got {self.worker_cpu_util}")


@dataclass(frozen=True)
class Decision:
    """What to do now: `target` is the total worker count wanted.

    On "hold" nothing new is asked: `target` is the count already asked for, which is the
    current one unless a change is still taking effect.

    `reason` is one sentence, with numbers, that the live view shows and the run record keeps.
    `local_target` is the local workers wanted in each trainer process (a placement policy); None leaves them be.
    """

    action: Action
    target: int
    reason: str
    local_target: int | None = None


@dataclass(frozen=True)
class Measurement:
    """Several windows averaged into one value per signal (what a policy compares)."""

    workers: int
    batches: int
    batch_time_s: float
    input_stall_frac: float
    queue_fill: float | None
    worker_cpu_util: float | None


def summarize(observations: Sequence[Observation]) -> Measurement:
    """Average windows that all ran with the same worker count.

    Batch time and queue fill are weighted by batches; stall and CPU fractions by the
    window's duration (batches x batch time), so they stay true fractions of time.
    Windows without a queue-fill or CPU reading are left out of that signal's mean.
    """
    obs = [o for o in observations if o.batches > 0]
    if not obs:
        raise ValueError("no windows with batches to summarize")
    if len({(o.workers, o.local_workers) for o in obs}) != 1:
        raise ValueError("windows to summarize ran with different worker counts")
    batches = sum(o.batches for o in obs)
    time = sum(o.batches * o.batch_time_s for o in obs)

    def weighted(values: list[tuple[float, float]]) -> float | None:
        total = sum(w for _, w in values)
        return sum(v * w for v, w in values) / total if values and total > 0 else None

    return Measurement(
        workers=obs[0].workers,
        batches=batches,
        batch_time_s=time / batches,
        input_stall_frac=sum(o.input_stall_frac * o.batches * o.batch_time_s for o in obs) / time,
        queue_fill=weighted([(o.queue_fill, o.batches) for o in obs if o.queue_fill is not None]),
        worker_cpu_util=weighted(
            [(o.worker_cpu_util, o.batches * o.batch_time_s) for o in obs if o.worker_cpu_util is not None]
        ),
    )


@runtime_checkable
class ScalingPolicy(Protocol):
    """A policy the orchestrator feeds every metrics window, in order.

    The orchestrator starts the job with `initial_workers`, calls `observe` once per window,
    and applies each add/remove by changing the worker count to `decision.target`; the next
    windows report the new count once it is running.
    """

    name: str

    @property
    def initial_workers(self) -> int: ...

    def observe(self, obs: Observation) -> Decision: ...


@dataclass(frozen=True)
class Policy:
    """A scaling policy as dsctl knows it (its module's POLICY): how to make one from its settings, and their model
    (Limits and the policy's own constants; unknown keys are errors)."""

    make: Callable[[Any], ScalingPolicy]
    settings: type[Limits]


@runtime_checkable
class ReadsQueue(Protocol):
    """A policy that reads how full the trainers' client queue is (Cachew's scale-down): the client needs a buffer
    with room to fill (orchestrator/autoscaling.py leave_queue_room), whose size the policy is told."""

    def queue_room(self, asked: int | None) -> int:
        """The buffer the client is to have (`asked`: the spec's service.max_outstanding_requests, if any), now the
        policy's to reckon with."""


class Limits(BaseModel):
    """Worker bounds every policy honours; configs extend this, and unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_workers: int = Field(1, ge=1, description="never fewer workers than this")
    max_workers: int = Field(32, ge=1, description="never more workers than this")
    start_workers: int | None = Field(None, ge=1, description="start here instead of min_workers (autoscale.start: "
                                                              "profile)")
    start_note: str | None = Field(None, description="why it starts there, for the run's events")

    @model_validator(mode="after")
    def _ordered(self) -> Limits:
        if self.min_workers > self.max_workers:
            raise ValueError(f"min_workers ({self.min_workers}) > max_workers ({self.max_workers})")
        if self.start_workers is not None and not self.min_workers <= self.start_workers <= self.max_workers:
            raise ValueError(f"start_workers ({self.start_workers}) is outside {self.min_workers}..{self.max_workers}")
        return self

    @property
    def initial(self) -> int:
        """The count a job starts at."""
        return self.start_workers or self.min_workers


def ms(seconds: float) -> str:
    """A batch time as people read it in the live view."""
    return f"{seconds * 1000:.1f} ms"


def pct(fraction: float, signed: bool = False) -> str:
    """A fraction as a percentage; signed ones are changes ("-27.0%"), never "-0.0%"."""
    return f"{round(fraction * 100, 1) + 0.0:+.1f}%" if signed else f"{fraction * 100:.0f}%"
