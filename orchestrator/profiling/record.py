"""A profile as dsctl keeps it: typed, saved in the run's record and read back by `dsctl runs show`.

Every number says where it comes from in its field's comment: measured here (in the profiling process, on
this machine), predicted (the worker formula, on the spec's worker machine), or from the spec.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

KIND = "dsctl-profile"  # a profile's JSON says what it is (sweep --profile reads files and runs alike)
VERSION = 1


@dataclass(frozen=True)
class OpRow:
    """One transformation, measured here over the window."""

    label: str  # as the code wrote it (map(_decode)); TensorFlow's name where tf.data added it
    name: str  # TensorFlow's iterator name
    kind: str
    inner: bool  # an interleave's per-element iterators, summed
    cpu_s_per_element: float | None  # CPU per element it produced
    cpu_s_per_batch: float  # its CPU per batch the pipeline produced
    wait_s_per_batch: float  # time it waited using no CPU, per batch (a sleep)
    share: float  # of the transformations' CPU
    elements_in: int
    elements_out: int
    bytes_in: int
    bytes_out: int
    inflation: float | None  # bytes out ÷ bytes in (above 1: it inflates the data; below 1: it shrinks it)
    parallelism: str  # "2 (autotuned)", "4", "1 (sequential)", "-" (a synchronous transformation)
    buffer: str
    thread: str  # the thread (group) it runs on: "consumer", "parallel calls", "prefetch thread of ..."
    utilization: float  # of its thread or its parallel calls: batches/s × time per batch ÷ parallelism
    bound_bps: float | None  # batches/s its thread (or its parallel calls) allows at most
    bounds: bool  # the transformation that bounds throughput
    correction: float = 1.0  # counts scaled for iterators ended between snapshots


@dataclass(frozen=True)
class Rate:
    """One worker-like process here (measured here)."""

    seconds: float
    batches: int
    batches_per_s: float
    examples_per_s: float | None
    cpu_s_per_batch: float  # the process's CPU (OS) ÷ batches
    wall_s_per_batch: float
    cores_here: int
    cores_used: float  # CPU ÷ wall
    self_coverage: float  # TensorFlow's self times added up ÷ the OS's CPU (1.0: they agree)
    scale: float  # self time × scale = the CPU column (1 unless self time exceeds CPU: threads waited for a core)
    outside_cpu_s_per_batch: float  # CPU in no transformation (the reading loop, tf.data's own threads)
    bound: str  # what bounds throughput here, in words
    batch_bytes: float


@dataclass(frozen=True)
class Bound:
    """One limit on a worker's batches/s (predicted for the spec's worker machine)."""

    what: str  # "CPU", "map(fetch)'s thread", ...
    bps: float
    how: str  # the arithmetic, in words


@dataclass(frozen=True)
class Prediction:
    """The workers the trainers' consumption needs: TensorFlow's dispatcher's rule (sum of consumers' rates ÷ one
    worker's rate), one worker's rate from CPU time measured here and the pipeline's sequential limits."""

    target_bps: float | None  # batches/s the trainers consume in all
    target_source: str  # --target-bps | from the spec | measured here (ideal mode)
    worker_machine: str
    cores_per_worker: int
    per_worker_bps: float  # predicted
    limit: str  # which bound sets it
    bounds: tuple[Bound, ...]
    workers: int | None  # predicted; None without a target
    formula: str
    here_cap_bps: float | None = None  # local workers share this machine's cores: at most this in all


@dataclass(frozen=True)
class Effect:
    """A recommendation's effect, measured here: the same window before and after."""

    before_bps: float
    after_bps: float
    before_cpu_s_per_batch: float
    after_cpu_s_per_batch: float
    consumer_step_s: float = 0.0  # both read with a trainer's step time per batch (a prefetch overlaps it)
    source: str = "measured here"

    @property
    def speedup(self) -> float:
        return self.after_bps / self.before_bps if self.before_bps else math.inf

    @property
    def cpu_cut(self) -> float:
        return self.before_cpu_s_per_batch / self.after_cpu_s_per_batch if self.after_cpu_s_per_batch else math.inf

    @property
    def gain(self) -> float:
        """What following it buys: batches/s up, or CPU per batch down, whichever is more (×)."""
        return max(self.speedup, self.cpu_cut)


@dataclass(frozen=True)
class Recommendation:
    kind: str  # parallelize | prefetch | cache | reorder
    title: str
    detail: str
    apply: str  # what to change: a spec field dsctl applies, or the code change
    spec_patch: dict | None = None  # merged into the spec by `dsctl up` when the user sets it (None: code only)
    effect: Effect | None = None
    note: str | None = None  # why it could not be measured, or what the measurement assumed


@dataclass(frozen=True)
class StepRow:
    """A reorderable section's step run alone on one sample of the section's input (measured here)."""

    section: str
    step: str
    byte_ratio: float | None  # bytes out ÷ bytes in: AutoOrder's rank
    keep: float | None  # elements out ÷ elements in
    cpu_s_per_element: float


@dataclass(frozen=True)
class ServiceView:
    """The same pipeline on one real tf.data service worker (measured here, by the OS, in the worker's process)."""

    run_id: str
    batches_per_s: float  # at the trainer, through the service
    worker_cpu_s_per_batch: float | None  # the worker process's CPU ÷ batches
    overhead: float | None  # ÷ the profiling process's CPU per batch: what serving costs on top (Cachew: 1.3-1.5)
    trainer_view: str  # what the trainer's own autotune model holds (one DataService node)


@dataclass
class Profile:
    job: str
    spec_path: str
    run_id: str
    created_at: float
    seconds: float
    element: str
    finite: bool
    rows: list[OpRow]
    rate: Rate
    prediction: Prediction
    recommendations: list[Recommendation] = field(default_factory=list)
    steps: list[StepRow] = field(default_factory=list)
    service: ServiceView | None = None
    chart: str | None = None
    notes: list[str] = field(default_factory=list)
    recommended: bool = True  # candidate changes were looked for and measured (not --no-recommend)

    @property
    def bounding(self) -> OpRow | None:
        return next((r for r in self.rows if r.bounds), None)

    @property
    def heaviest(self) -> OpRow | None:
        """The transformation that holds most of the CPU."""
        return max(self.rows, key=lambda r: r.cpu_s_per_batch, default=None)

    def to_dict(self) -> dict:
        out = asdict(self)
        out["kind"], out["version"] = KIND, VERSION
        for rec, d in zip(self.recommendations, out["recommendations"]):
            if rec.effect is not None:
                d["effect"].update(speedup=rec.effect.speedup, cpu_cut=rec.effect.cpu_cut, gain=rec.effect.gain)
        return out

    @classmethod
    def from_dict(cls, d: dict) -> Profile:
        if d.get("kind") != KIND:
            raise ValueError("not a dsctl profile")

        def effect(e: dict | None) -> Effect | None:
            if e is None:
                return None
            return Effect(**{k: v for k, v in e.items() if k not in ("speedup", "cpu_cut", "gain")})

        pred = dict(d["prediction"])
        pred["bounds"] = tuple(Bound(**b) for b in pred["bounds"])
        return cls(job=d["job"], spec_path=d["spec_path"], run_id=d["run_id"], created_at=d["created_at"],
                   seconds=d["seconds"], element=d["element"], finite=d["finite"],
                   rows=[OpRow(**r) for r in d["rows"]], rate=Rate(**d["rate"]), prediction=Prediction(**pred),
                   recommendations=[Recommendation(**{**r, "effect": effect(r.get("effect"))})
                                    for r in d["recommendations"]],
                   steps=[StepRow(**s) for s in d.get("steps", [])],
                   service=ServiceView(**d["service"]) if d.get("service") else None,
                   chart=d.get("chart"), notes=list(d.get("notes", [])), recommended=d.get("recommended", True))


def is_profile(d: Any) -> bool:
    return isinstance(d, dict) and d.get("kind") == KIND
