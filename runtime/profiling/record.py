"""What the profiling process measures and is asked to measure: typed records that cross a JSON line.

The profiling process (child.py) runs a spec's pipeline as a worker would and reports facts only:
per-transformation time, elements and bytes from TensorFlow's autotune model, the process's CPU from
the OS, the pipeline's structure as its Python objects show it. Everything drawn from them (shares,
bounds, worker counts, recommendations) is the orchestrator's (orchestrator/profiling/). No TensorFlow
here: the orchestrator reads these records without importing it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from dsctl.specs.pipeline_options import PipelineOptions


@dataclass(frozen=True)
class OpMeasure:
    """One transformation of the pipeline over the measured window, as TensorFlow's autotune model saw it.

    Counts are over the window (differences of two snapshots, summed over the iterators a repeat or an
    interleave made and ended); `self_s` is the time the transformation's own code ran on a thread
    (its inputs' time excluded): CPU time, plus any time that thread waited inside it (for a core on a busy
    machine, for I/O, a sleep)."""

    path: str  # where it sits in the model's tree: Root/Prefetch/BatchV2/...
    name: str  # TensorFlow's name of the iterator: ParallelMapV2, MapAndBatch, Filter, ...
    label: str  # as the pipeline's code wrote it: map(_decode), batch(32); the name when tf.data added it
    kind: str  # map, filter, batch, prefetch, source, interleave, ... (chain.py)
    parent: str | None  # the path of the transformation that reads it
    inner: bool  # one of the iterators an interleave or flat_map makes per input element
    asynchronous: bool  # runs on threads of its own (prefetch, parallel map, parallel interleave)
    py_index: int | None  # its place in the pipeline's Python chain (post-order); None when tf.data added it
    self_s: float
    elements_out: int
    elements_in: int
    bytes_in: int
    bytes_out: int
    parallelism: float | None = None  # its `parallelism` parameter (autotuned or fixed); None: has none
    tunable: bool = False  # autotuning sets the parallelism (num_parallel_calls=AUTOTUNE)
    buffer_size: float | None = None  # a prefetch's buffer_size parameter
    buffered_elements: int = 0
    instances: int = 1  # iterators seen (a repeat makes one per epoch)
    correction: float = 1.0  # counts scaled to what its consumer received (iterators ended between snapshots)
    wait_s: float = 0.0  # time it waited using no CPU, which TensorFlow leaves out of self time (a sleep's delay)


@dataclass(frozen=True)
class Measurement:
    """One measured window of one version of the pipeline (as written, or a variant)."""

    label: str
    seconds: float  # wall time of the window
    warmup_s: float
    batches: int  # elements the pipeline produced in the window (its batches)
    cpu_s: float  # CPU the process used in the window (user + system, from the OS)
    cores: int  # CPUs this process may run on
    consumer_step_s: float  # time the reading loop spent per batch as a trainer's step would (0: none)
    ops: tuple[OpMeasure, ...]  # in pipeline order: sources first, the last transformation last
    batch_bytes: float  # mean bytes of one produced element
    examples_per_batch: float | None  # rows of the produced elements' first component (None: not batched)
    root_self_s: float = 0.0  # the iterator's own top-level time (not a transformation)
    notes: tuple[str, ...] = ()  # what the measurement changed to be made (autotuning turned on, ...)

    @property
    def batches_per_s(self) -> float:
        return self.batches / self.seconds if self.seconds > 0 else 0.0

    @property
    def cpu_s_per_batch(self) -> float | None:
        return self.cpu_s / self.batches if self.batches else None


@dataclass(frozen=True)
class ChainStep:
    """One transformation as the pipeline's Python objects show it, before TensorFlow's optimizations."""

    index: int  # post-order: sources first
    kind: str
    label: str
    sequential_map: bool = False  # a `map` without num_parallel_calls
    stateless: bool | None = None  # its function has no stateful op (TensorFlow's map_parallelization needs it)
    force_synchronous: bool = False  # map(..., synchronous=True)
    delay_s: float = 0.0  # a sleep's delay per element (TensorFlow's model leaves it out of the sleep's self time)


@dataclass(frozen=True)
class Hint:
    """An autocache hint (dsctl.autocache) and where it sits in the chain."""

    name: str
    after_index: int  # the chain step whose output is the hint's dataset
    cardinality: int  # elements per pass at the hint: tf.data's (-1 endless, -2 unknown)


@dataclass(frozen=True)
class SectionInfo:
    """A reorderable section (dsctl.reorderable) as built."""

    name: str
    written: tuple[str, ...]
    used: tuple[str, ...]


@dataclass(frozen=True)
class Structure:
    """What the pipeline is, found before it is measured."""

    chain: tuple[ChainStep, ...]
    hints: tuple[Hint, ...]
    sections: tuple[SectionInfo, ...]
    map_parallelization: bool  # in effect (the pipeline's options, else TensorFlow's default)
    inject_prefetch: bool
    autotune: bool
    finite: bool  # the pipeline ends (it is repeated for the measurement)
    element: str  # the produced element's structure, as TensorFlow prints it


@dataclass(frozen=True)
class StepMeasure:
    """One step of a reorderable section run alone on the same sample of its input (AutoOrder's profile)."""

    section: str
    step: str
    elements_in: int
    elements_out: int
    bytes_in: int
    bytes_out: int
    cpu_s: float  # CPU the process used running the step over the sample

    @property
    def byte_ratio(self) -> float | None:
        """Bytes produced ÷ bytes consumed (dropped elements count as no bytes): AutoOrder's rank."""
        return self.bytes_out / self.bytes_in if self.bytes_in else None


@dataclass(frozen=True)
class Variant:
    """One version of the pipeline to measure: the spec's, changed as the fields say."""

    label: str = "as written"
    options: PipelineOptions | None = None  # replaces the spec's pipeline.options
    order: dict[str, list[str]] = field(default_factory=dict)  # merged over the spec's pipeline.order
    replay: str | None = None  # feed the rest of the pipeline from memory at this autocache hint
    cache: str | None = None  # cache at this autocache hint as a job does (a snapshot, in a scratch folder)
    parallelize: tuple[int, int] | None = None  # (chain index of a sequential map, parallel calls; -1: AUTOTUNE)
    consumer_step_s: float = 0.0  # the reading loop waits this long per batch, as a trainer's step


def to_json(record: Any) -> dict:
    """A record as JSON-able data (dataclasses and pydantic models nested)."""
    if isinstance(record, PipelineOptions):
        return record.model_dump()
    out = {}
    for f in fields(record):
        value = getattr(record, f.name)
        if isinstance(value, PipelineOptions):
            value = value.model_dump()
        elif isinstance(value, tuple) and value and hasattr(value[0], "__dataclass_fields__"):
            value = [asdict(v) for v in value]
        elif hasattr(value, "__dataclass_fields__"):
            value = asdict(value)
        out[f.name] = value
    return out


def op_from(d: dict) -> OpMeasure:
    return OpMeasure(**d)


def measurement_from(d: dict) -> Measurement:
    return Measurement(**{**d, "ops": tuple(op_from(o) for o in d["ops"]), "notes": tuple(d.get("notes") or ())})


def structure_from(d: dict) -> Structure:
    return Structure(**{**d, "chain": tuple(ChainStep(**c) for c in d["chain"]),
                        "hints": tuple(Hint(**h) for h in d["hints"]),
                        "sections": tuple(SectionInfo(name=s["name"], written=tuple(s["written"]), used=tuple(s["used"]))
                                          for s in d["sections"])})


def step_from(d: dict) -> StepMeasure:
    return StepMeasure(**d)


def variant_from(d: dict) -> Variant:
    options = d.get("options")
    par = d.get("parallelize")
    return Variant(label=d.get("label", "as written"),
                   options=PipelineOptions.model_validate(options) if options is not None else None,
                   order={k: list(v) for k, v in (d.get("order") or {}).items()}, replay=d.get("replay"),
                   cache=d.get("cache"),
                   parallelize=(int(par[0]), int(par[1])) if par else None,
                   consumer_step_s=float(d.get("consumer_step_s") or 0.0))
