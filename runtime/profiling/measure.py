"""One measured window of a running pipeline: warm-up, then snapshots of its autotune model and the OS's CPU.

The reading loop is the worker's consumer: it takes elements as fast as the pipeline gives them (or,
with `consumer_step_s`, waits that long per element, as a trainer's step does, to show what a prefetch
overlaps). The warm-up is not counted: autotuning settles its parallelism and buffers there, and
caches and files are opened. The window's CPU is the process's (all its threads, user and system) as
the OS counts it, the same clock whatever TensorFlow measures, less what taking the snapshots cost
(measured on the reading thread, which takes them).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from .chain import align, kind_of_model
from .model import ASYNC_CLASSES, PathTotal, Tracker, elements_in, read
from .record import ChainStep, Measurement, OpMeasure

SNAPSHOT_S = 0.02  # a snapshot costs well under a millisecond; iterators a repeat ends live about an epoch
SAMPLED_ELEMENTS = 16  # produced elements whose bytes are counted (converting every one would cost CPU)
PROGRESS_S = 0.5

Progress = Callable[[str, float, float, int], None]  # (phase, seconds so far, seconds in all, batches)


class ModelUnavailable(Exception):
    """The iterator keeps no autotune model (the pipeline's options turn autotuning off)."""


class _Snapshots:
    """Snapshots of the iterator's model, and the CPU taking them cost (on this thread: left out of the window's)."""

    def __init__(self, iterator):
        self.iterator = iterator
        self.cpu_s = 0.0

    def __call__(self):
        import tensorflow as tf

        start = time.thread_time()
        try:
            return read(tf.data.experimental.get_model_proto(self.iterator))
        except tf.errors.NotFoundError as exc:
            raise ModelUnavailable(str(exc)) from None
        finally:
            self.cpu_s += time.thread_time() - start


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def measure(ds, *, label: str, seconds: float, warmup_s: float, consumer_step_s: float = 0.0,
            chain: list[ChainStep] | None = None, progress: Progress = lambda *a: None,
            notes: tuple[str, ...] = ()) -> Measurement:
    """Read `ds` for a warm-up, then `seconds` more; the window's measurement (see the module docstring).
    StopIteration: the pipeline ended (callers repeat a finite one). ModelUnavailable: autotuning is off."""
    from ..autocache_profile import element_bytes

    iterator = iter(ds)
    started = time.perf_counter()
    told = 0.0
    n = 0
    while n < 2 or time.perf_counter() - started < warmup_s:
        next(iterator)
        n += 1
        if consumer_step_s:
            time.sleep(consumer_step_s)
        now = time.perf_counter()
        if now - told >= PROGRESS_S:
            told = now
            progress("warm-up", now - started, warmup_s, n)
    tracker = Tracker()
    snapshot = _Snapshots(iterator)
    tracker.start(*snapshot())
    cpu0, wall0 = time.process_time(), time.perf_counter()
    snapshot.cpu_s = 0.0
    batches = 0
    sampled_bytes = sampled = 0
    rows: float | None = None
    next_snapshot = wall0 + SNAPSHOT_S
    while True:
        element = next(iterator)
        batches += 1
        if sampled < SAMPLED_ELEMENTS:
            r, b = element_bytes(element)
            sampled, sampled_bytes = sampled + 1, sampled_bytes + b
            rows = r if rows is None else rows
        if consumer_step_s:
            time.sleep(consumer_step_s)
        now = time.perf_counter()
        if now >= next_snapshot:
            tracker.observe(*snapshot())
            next_snapshot = now + SNAPSHOT_S
        if now - told >= PROGRESS_S:
            told = now
            progress("measuring", now - wall0, seconds, batches)
        if now - wall0 >= seconds:
            break
    tracker.observe(*snapshot())
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0 - snapshot.cpu_s
    totals = tracker.totals()
    return Measurement(label=label, seconds=wall, warmup_s=wall0 - started, batches=batches, cpu_s=cpu, cores=cores(),
                       consumer_step_s=consumer_step_s, ops=tuple(ops_of(totals, chain or [])),
                       batch_bytes=sampled_bytes / sampled if sampled else 0.0,
                       examples_per_batch=float(rows) if rows and rows > 1 else None,
                       root_self_s=sum(t.self_ns for t in totals if t.parent is None) / 1e9, notes=notes)


def ops_of(totals: list[PathTotal], chain: list[ChainStep]) -> list[OpMeasure]:
    """The model's totals as transformations, labelled from the Python chain (the root, not one, left out). A
    sleep's delay, which the model leaves out of its self time, comes from the chain: elements times delay."""
    by_parent: dict[str, list[PathTotal]] = {}
    for t in totals:
        if t.parent is not None:
            by_parent.setdefault(t.parent, []).append(t)
    main = [t for t in totals if t.parent is not None and not t.inner]
    labels = align([(t.path, kind_of_model(t.name, bool(by_parent.get(t.path)))) for t in main],
                   [(c.kind, c.label) for c in chain])
    out = []
    for t in totals:
        if t.parent is None:
            continue
        index, label = labels.get(t.path, (None, ""))
        if not label:
            label = f"{t.name} (inside)" if t.inner else (f"{t.name} (added by tf.data)"
                                                          if t.name == "Prefetch" else t.name)
        par = t.param("parallelism")
        buf = t.param("buffer_size")
        kinds = kind_of_model(t.name, bool(by_parent.get(t.path)))
        out.append(OpMeasure(
            path=t.path, name=t.name, label=label, kind=kinds[0], parent=t.parent, inner=t.inner,
            asynchronous=t.node_class in ASYNC_CLASSES, py_index=index, self_s=t.self_ns / 1e9,
            elements_out=round(t.elements), elements_in=round(elements_in(t, by_parent)), bytes_in=round(t.bytes_in),
            bytes_out=round(t.bytes_out), parallelism=par[0] if par else None, tunable=bool(par and par[1]),
            buffer_size=buf[0] if buf else None, buffered_elements=t.buffered_elements, instances=t.instances,
            correction=t.correction,
            wait_s=round(t.elements) * chain[index].delay_s if index is not None and index < len(chain) else 0.0))
    return out
