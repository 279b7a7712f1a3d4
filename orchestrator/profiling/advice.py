"""What would make a pipeline faster or cheaper: candidate changes, each with the variant that measures it.

Pure rules over the first measurement (analysis.py's rows) and the pipeline's structure; the session
measures each candidate's variant and keeps the ones it measured, best first. The rules, from the papers
and tf.data's own behaviour in TensorFlow 2.21:

- Parallelize (Plumber): a `map` written without num_parallel_calls whose thread bounds throughput. TensorFlow
  parallelizes such a map itself (map_parallelization, on by default) unless its function has a stateful op,
  it was made `synchronous=True`, or the pipeline's options turn the optimization off. In the last case
  dsctl can turn it back on without the user's code (`pipeline.options.map_parallelization: true`); in the
  others only the code can, and dsctl measures what it would give by making that map parallel in the graph
  (runtime/profiling/rewrite.py). A map that waits more than it computes (its thread's time is mostly not
  CPU) gets an explicit number of calls: AUTOTUNE stops at the machine's cores.
- Prefetch: nothing asynchronous between the last transformation and the reader, while the reader does
  work of its own per batch (a trainer's step): the two then take turns instead of overlapping. TensorFlow
  injects a prefetch there itself (inject_prefetch) unless the options turn it off; measured with the
  job's step time per batch, which is what a prefetch overlaps.
- Cache (Cachew, Plumber): the deepest autocache hint whose data fits the storage given and before which
  a large share of the CPU goes: reading a cache there costs none of it. Measured by feeding the rest of
  the pipeline from memory at the hint (a read that costs nothing: the most a cache can give); applied with
  the spec's existing `autocache: {mode: HINT}` (or `mode: auto`, which decides per run on the workers).
- Reorder (Pecan's AutoOrder): in each reorderable section, steps ranked by bytes produced ÷ bytes
  consumed, each measured alone on the same sample: shrinking steps first, inflating ones last.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dsctl.runtime.profiling.record import ChainStep, Hint, Measurement, StepMeasure, Structure, Variant
from dsctl.specs.pipeline_options import PipelineOptions

from .record import OpRow, Recommendation, StepRow

MIN_CACHE_SHARE = 0.25  # a cache point must save at least this share of the pipeline's CPU to be worth a try
MAX_CALLS = 64
WAITING_SCALE = 0.5  # self time more than twice the CPU: the transformations wait more than they compute
MIN_READER_S, MIN_READER_SHARE = 2e-4, 0.1  # reader-thread work worth a prefetch: per batch, and of the step time
MAX_CACHE_WARMUP_S = 30.0  # an epoch written to a cache within this (1.5x, plus a second) is measured for real


@dataclass(frozen=True)
class Candidate:
    """A recommendation before it is measured, and the variant that measures it."""

    recommendation: Recommendation
    variant: Variant
    baseline_step_s: float = 0.0  # the 'before' is measured with this consumer step too (a prefetch's)
    warmup_s: float | None = None  # a longer warm-up than the profile's (a cache's first epoch)


def _options(current: PipelineOptions | None, **changes) -> PipelineOptions:
    return (current or PipelineOptions()).model_copy(update=changes)


def parallelize(structure: Structure, m: Measurement, rows: list[OpRow], scale: float,
                options: PipelineOptions | None) -> Candidate | None:
    """The sequential map whose thread bounds throughput, if one does."""
    at = next((i for i, r in enumerate(rows) if r.bounds), None)
    if at is None:
        return None
    bounding, op = rows[at], m.ops[at]
    step: ChainStep | None = structure.chain[op.py_index] if op.py_index is not None else None
    if step is None or not step.sequential_map:
        # the bounding transformation may share its thread with a sequential map that holds most of it
        same = [o for o, r in zip(m.ops, rows) if r.thread == bounding.thread and o.py_index is not None
                and structure.chain[o.py_index].sequential_map]
        if not same:
            return None
        op = max(same, key=lambda o: o.self_s + o.wait_s)
        step = structure.chain[op.py_index] if op.py_index is not None else None
        if step is None:
            return None
    waits = op.wait_s > 0 or scale < WAITING_SCALE
    calls = min(MAX_CALLS, max(2 * m.cores, math.ceil(2 * m.cores / max(scale, 1e-3)))) if waits else -1
    calls_text = "tf.data.AUTOTUNE" if calls == -1 else str(calls)
    fn = step.label[step.label.find("(") + 1:-1] if "(" in step.label else "fn"
    code = f".map({fn}, num_parallel_calls={calls_text})"
    why_wait = (f" It waits more than it computes (the transformations' self time is {1 / scale:.1f}× their CPU), "
                f"so it gets {calls} calls: AUTOTUNE stops at the machine's cores." if waits else "")
    title = f"run {step.label} in parallel"
    detail = (f"{step.label} runs one element at a time and its thread ({bounding.thread}) bounds throughput, busy "
              f"{min(bounding.utilization, 1):.0%} of the time.{why_wait}")
    if step.stateless and not step.force_synchronous and not structure.map_parallelization and calls == -1:
        return Candidate(Recommendation(
            kind="parallelize", title=title, detail=detail + " Its function is stateless, and the pipeline's options "
            "turn TensorFlow's map_parallelization off, so dsctl can turn it on without your code.",
            apply=f"pipeline.options.map_parallelization: true (or in your code: {code})",
            spec_patch={"pipeline": {"options": {"map_parallelization": True}}}),
            Variant(label=title, options=_options(options, map_parallelization=True)))
    reason = ("its function has a stateful op" if step.stateless is False else
              "it was made synchronous=True" if step.force_synchronous else
              "TensorFlow's map_parallelization does not take it")
    return Candidate(Recommendation(
        kind="parallelize", title=title,
        detail=detail + f" TensorFlow leaves it sequential ({reason}), so only the code can change it; measured "
                        "by making that map parallel in the dataset's graph.",
        apply=f"in your code: {code}"),
        Variant(label=title, parallelize=(step.index, calls)))


def prefetch(structure: Structure, m: Measurement, rows: list[OpRow], step_s: float,
             options: PipelineOptions | None) -> Candidate | None:
    """Work in the reader's thread (no asynchronous transformation above it) while the reader has a step of its own:
    the two take turns, and a prefetch would overlap them."""
    mine = [(o, r) for o, r in zip(m.ops, rows) if r.thread == "consumer"]
    bps = m.batches_per_s
    per_batch = mine[0][1].utilization / bps if mine and bps > 0 else 0.0
    if step_s <= 0 or per_batch < max(MIN_READER_S, MIN_READER_SHARE * step_s):
        return None
    heaviest = max(mine, key=lambda x: x[0].self_s + x[0].wait_s)[0]
    title = "prefetch at the end of the pipeline"
    detail = (f"{', '.join(o.label for o, _ in mine)} run in the reader's thread ({per_batch * 1e3:.3g} ms per batch, "
              f"most in {heaviest.label}): the pipeline and the trainer's step ({step_s * 1e3:g} ms per batch) take turns "
              "instead of overlapping"
              + ("" if structure.inject_prefetch else "; the pipeline's options turn TensorFlow's inject_prefetch off")
              + ". Measured with that step time per batch.")
    return Candidate(Recommendation(
        kind="prefetch", title=title, detail=detail,
        apply="pipeline.options.inject_prefetch: true (or end the pipeline with .prefetch(tf.data.AUTOTUNE))",
        spec_patch={"pipeline": {"options": {"inject_prefetch": True}}}),
        Variant(label=title, options=_options(options, inject_prefetch=True), consumer_step_s=step_s),
        baseline_step_s=step_s)


def hint_sizes(structure: Structure, m: Measurement, rows: list[OpRow], elements_per_epoch: int | None
               ) -> list[tuple[Hint, float, float | None]]:
    """(hint, share of the CPU before it, bytes of one epoch at it or None), in pipeline order."""
    out = []
    for hint in structure.hints:
        before = {o.path for o in m.ops if o.py_index is not None and o.py_index <= hint.after_index}
        inside = [o for o in m.ops if o.path in before or any(o.path.startswith(p + "/") for p in before)]
        paths = {o.path for o in inside}
        share = sum(r.share for o, r in zip(m.ops, rows) if o.path in paths)
        at = [o for o in m.ops if o.py_index is not None and o.py_index <= hint.after_index and o.elements_out]
        per = max(at, key=lambda o: o.py_index or 0) if at else None
        n = elements_per_epoch if elements_per_epoch is not None else (hint.cardinality if hint.cardinality >= 0 else None)
        size = per.bytes_out / per.elements_out * n if per is not None and n is not None else None
        out.append((hint, share, size))
    return out


def cache(structure: Structure, m: Measurement, rows: list[OpRow], *, elements_per_epoch: int | None,
          budget_bytes: float, budget_source: str, sharded: bool) -> Candidate | None:
    """The deepest hint that fits the budget and saves enough CPU."""
    fitting = [(h, share, size) for h, share, size in hint_sizes(structure, m, rows, elements_per_epoch)
               if size is not None and size <= budget_bytes and share >= MIN_CACHE_SHARE]
    if not fitting:
        return None
    hint, share, size = max(fitting, key=lambda x: x[0].after_index)
    epoch_s = _epoch_s(m, elements_per_epoch if elements_per_epoch is not None else hint.cardinality)
    real = epoch_s is not None and 1.5 * epoch_s + 1 <= MAX_CACHE_WARMUP_S
    note = ("measured as a job caches: a snapshot at the hint written during the warm-up (one epoch), read in the "
            "window" if real else
            "measured with the rest of the pipeline fed from memory at the hint (a cache read that costs nothing: the "
            "most a cache can give; reading it from disk costs some): one epoch takes too long to write here")
    if sharded:
        note += "; under distributed_epoch dsctl does not cache (each worker would hold only its share)"
    return Candidate(Recommendation(
        kind="cache", title=f"cache at the autocache hint '{hint.name}'",
        detail=(f"{share:.0%} of the pipeline's CPU goes before '{hint.name}', and one epoch there is "
                f"{size / 1e9:.3g} GB, which fits the {budget_bytes / 1e9:.3g} GB {budget_source}; it is the "
                "deepest hint that does."),
        apply=f"autocache: {{mode: {hint.name}}} (or mode: auto: dsctl profiles on the workers and decides per run)",
        spec_patch={"autocache": {"mode": hint.name}}, note=note),
        Variant(label=f"cache at {hint.name}", cache=hint.name) if real else
        Variant(label=f"cache at {hint.name}", replay=hint.name),
        warmup_s=1.5 * epoch_s + 1 if real and epoch_s is not None else None)


def _epoch_s(m: Measurement, elements: int | None) -> float | None:
    """Seconds one epoch takes at the measured rate, when the epoch's size is known."""
    per_batch = m.examples_per_batch or 1.0
    if elements is None or elements < 0 or m.batches_per_s <= 0:
        return None
    return elements / per_batch / m.batches_per_s


def step_rows(steps: list[StepMeasure]) -> list[StepRow]:
    return [StepRow(section=s.section, step=s.step, byte_ratio=s.byte_ratio,
                    keep=s.elements_out / s.elements_in if s.elements_in else None,
                    cpu_s_per_element=s.cpu_s / s.elements_in if s.elements_in else 0.0) for s in steps]


def auto_order(written: list[str], steps: list[StepMeasure]) -> list[str]:
    """AutoOrder's order: steps by bytes produced ÷ bytes consumed, shrinking first (ties: as written); steps that
    were not measured keep their written place after the measured ones before them."""
    ratio = {s.step: s.byte_ratio for s in steps if s.byte_ratio is not None}
    ranked = sorted((w for w in written if w in ratio), key=lambda w: (ratio[w], written.index(w)))
    out: list[str] = []
    for w in written:
        if w in ratio:
            out.append(ranked.pop(0))
        else:
            out.append(w)
    return out


def reorder(structure: Structure, steps: list[StepMeasure]) -> list[Candidate]:
    out = []
    for section in structure.sections:
        measured = [s for s in steps if s.section == section.name]
        order = auto_order(list(section.written), measured)
        if order == list(section.used) or not measured:
            continue
        ranks = ", ".join(f"{s.step} {s.byte_ratio:.2f}" for s in measured if s.byte_ratio is not None)
        out.append(Candidate(Recommendation(
            kind="reorder", title=f"reorder section '{section.name}': {' → '.join(order)}",
            detail=(f"bytes out ÷ bytes in of each step run alone on the same sample ({ranks}): AutoOrder runs the "
                    f"steps that shrink the data first, so that the others see less of it (now {' → '.join(section.used)})."),
            apply=f"pipeline.order: {{{section.name}: [{', '.join(order)}]}}",
            spec_patch={"pipeline": {"order": {section.name: order}}}),
            Variant(label=f"order {section.name}", order={section.name: order})))
    return out
