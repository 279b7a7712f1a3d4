"""The tf.data service client's result-queue fill: how many elements wait for the trainer.

Cachew (ATC'22 §4.3) scales a job down when this queue fills: the workers outpace the model.
TensorFlow exposes no Python API for it, but the iterator's autotuning model (the same model
tf.data's autotuner keeps, read with the IteratorGetModelProto op) has one node per dataset
stage, and the `DataService` node reports the elements buffered in the client's queue.

Reading the model costs 20-40 us for a service client's small model (benchmarks/bench_command.py, 2026-11-26;
up to about 0.5-1 ms measured earlier for larger pipelines), so the harness samples it at most every
`interval_s` (0.1 s: well under 1% of the training loop) and reports the mean of the samples
per metrics window. Where the node is missing (autotuning off, no service in the pipeline,
an iterator without the resource) the fill is None and nothing is sampled again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

INTERVAL_S = 0.1
NODE = "DataService"


def read_model_fill(iterator: Any) -> Callable[[], float | None] | None:
    """A reader of `iterator`'s DataService buffered elements, or None where there is none."""
    resource = getattr(iterator, "_iterator_resource", None)
    if resource is None:
        return None
    import tensorflow as tf
    from tensorflow.core.framework import model_pb2

    def read() -> float | None:
        model = model_pb2.ModelProto()
        model.ParseFromString(tf.raw_ops.IteratorGetModelProto(iterator=resource).numpy())
        for node in model.nodes.values():
            if node.name == NODE:
                return float(node.buffered_elements)
        return None

    return read


class QueueFillSampler:
    """Samples a queue-fill reader now and then; `take()` gives the mean since the last take."""

    def __init__(self, reader: Callable[[], float | None] | None, interval_s: float = INTERVAL_S,
                 clock: Callable[[], float] = time.perf_counter):
        self._read = reader
        self._interval = interval_s
        self._clock = clock
        self._next = 0.0
        self._sum = 0.0
        self._count = 0

    @property
    def active(self) -> bool:
        return self._read is not None

    def maybe_sample(self, force: bool = False) -> None:
        if self._read is None:
            return
        now = self._clock()
        if now < self._next and not force:
            return
        self._next = now + self._interval
        try:
            value = self._read()
        except Exception:  # noqa: BLE001 - a model that cannot be read turns the signal off, never the job
            value = None
        if value is None:
            self._read = None
            return
        self._sum += value
        self._count += 1

    def take(self) -> float | None:
        """The mean since the last take; a window with no sample yet (a slow batch spanned it) reads now."""
        if not self._count:
            self.maybe_sample(force=True)
        if not self._count:
            return None
        mean = self._sum / self._count
        self._sum, self._count = 0.0, 0
        return mean
