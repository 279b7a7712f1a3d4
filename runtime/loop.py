"""The measured loop: how every trainer that iterates its batches itself is timed.

dsctl's own harness (runtime/trainer.py) and a user's program (`dsctl.train.batches`) read their
batches through the same generator, so both write the same metrics: per window, batches,
batches/s, mean batch time, input stall (time blocked in next()), the step's time (the time the
consumer keeps each batch before asking for the next), tokens and padded tokens, the queue fill
of a tf.data service client, and the scalars the consumer reported (`report`). A warm-up window
is marked and kept out of the end record's throughput, as in every other trainer.

A loop can be run over several datasets in turn (a program's epoch loop calls `batches()` once per
epoch): its windows, warm-up, step budget and deadline carry over, and `finish()` writes the one
end record. Each pass read to its end is an epoch (an `epoch` record: its batches, elements and
seconds). The time between two passes is the program's own (evaluation, checkpoints): it is kept
apart, as the windows' `outside_s`, so that throughput can be said both per wall clock and per
training step time; creating a pass's iterator counts as the wait for its first batch. Per batch it
only reads the clock, counts and yields: the benchmark in benchmarks/ holds it to within a few
percent of a bare loop over the same dataset.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from . import placement
from .metrics import Epochs, MetricsWriter, NullWriter, Window, end_fields
from .queuefill import QueueFillSampler, read_model_fill


class Scalars:
    """What the consumer reported during a window (`dsctl.train.report`): the mean of each name."""

    def __init__(self) -> None:
        self._sums: dict[str, list[float]] = {}

    def add(self, values: dict[str, float]) -> None:
        for name, value in values.items():
            acc = self._sums.setdefault(name, [0.0, 0])
            acc[0] += value
            acc[1] += 1

    def take(self) -> tuple[float | None, dict[str, float]]:
        """(the window's mean loss, the window's means of the other names); empties the window."""
        means = {name: total / count for name, (total, count) in self._sums.items() if count}
        self._sums = {}
        return means.pop("loss", None), means


class MeasuredLoop:
    """One trainer's loop over its batches: `run(ds)` yields them and writes windows; `finish()` the end record.

    steps and duration_s bound it (None: unbounded); first_step is where a resumed run started, so the end
    record's `step` is the global one. `stats` is the current batch's counts (runtime/pipelines/stats.py).
    """

    def __init__(self, writer: MetricsWriter | None, *, steps: int | None, duration_s: float | None,
                 window_s: float, warmup_batches: int, queue_fill: bool = False, record_ids: str | None = None,
                 record_steps: str | None = None, stop: threading.Event | None = None, first_step: int = 0,
                 scalars: Scalars | None = None, pass_length: tuple[int | None, int | None] = (None, None)):
        self.writer = writer or NullWriter()
        self.steps = steps if steps is not None else float("inf")
        self.duration_s, self.window_s = duration_s, window_s
        self.warmup_left = warmup_batches
        self.queue_fill = queue_fill
        self.record_ids, self.record_steps = record_ids, record_steps
        self.stop = stop or threading.Event()
        self.first_step = first_step
        self.scalars = scalars or Scalars()
        self.stats: dict = {}
        self.ids: list[int] = []
        self.steps_log: dict[str, list] = {k: [] for k in ("wait_s", "step_s", "tokens", "padded_tokens", "examples")}
        self.batches = 0
        self.reason: str | None = None  # why the last run() stopped
        self.finished = False
        self.checkpoint_step: int | None = None
        self.iterator = None  # kept: destroying a tf.data service iterator waits on its outstanding requests
        self._t0: float | None = None
        self._window: Window | None = None
        self._measured: list[Window] = []
        self._measured_from: float | None = None
        self._deadline = float("inf")
        self._fill = QueueFillSampler(None)
        self._last_end: float | None = None  # when the last batch's step (or the wait for the data's end) ended
        self.epochs = Epochs(pass_batches=pass_length[0], pass_examples=pass_length[1])

    @property
    def exhausted(self) -> bool:
        """The budget (steps or duration) is spent, or the run was told to stop: no run() may read more."""
        return self.reason in ("steps", "duration", "signal")

    def _emit(self, event: str, **fields) -> None:
        self.writer.emit(event, **fields)

    def _start(self) -> None:
        self._t0 = t0 = time.perf_counter()
        self._window = Window(started=t0, warmup=self.warmup_left > 0)
        if not self.warmup_left:
            self._measure_from(t0, 0)

    def _measure_from(self, now: float, batches: int) -> None:
        self._measured_from = now
        self._emit("measure_start", batches=batches)
        if self.duration_s is not None:
            self._deadline = now + self.duration_s

    def _emit_window(self, now: float) -> None:
        loss, scalars = self.scalars.take()
        extra = {"loss": loss, "metrics": scalars} if loss is not None or scalars else {}
        assert self._window is not None and self._t0 is not None, "_start() made the first window"
        self._emit("window", **self._window.as_fields(now, self._t0), queue_fill=self._fill.take(), **extra,
                   **placement.on_window(self.writer))

    def run(self, ds, convert: Callable[[Any], Any] | None = None) -> Iterator[Any]:
        """Yield the batches of `ds` (each passed through `convert` first, if given: its time counts as input),
        until the budget is spent, the data ends, stop is set, or the consumer stops asking."""
        if self.finished:
            return
        entered = time.perf_counter()
        if self._t0 is None:
            self._start()
        elif self._last_end is not None and self._window is not None:
            self._window.outside_s += entered - self._last_end  # the program's own time since its last batch
        steps = self.steps
        record_ids, log_steps = self.record_ids is not None, self.record_steps is not None
        stats_of = _batch_stats()
        self.iterator = iterator = iter(ds)
        self._fill = fill = QueueFillSampler(read_model_fill(iterator) if self.queue_fill else None)
        window, t0 = self._window, self._t0
        assert window is not None and t0 is not None, "_start() made the first window"
        holding = None  # (wait, fetched at, stats) of the batch the consumer has now
        c = time.perf_counter()
        read, examples = self.batches, 0  # this pass's: batches before it, elements in it
        self.reason = "steps"
        try:
            while self.batches < steps:
                if self.stop.is_set():
                    self.reason = "signal"
                    break
                if c >= self._deadline:
                    self.reason = "duration"
                    break
                fill.maybe_sample()
                a = time.perf_counter() if self.batches > read else entered  # the first waits for the iterator too
                try:
                    batch = next(iterator)
                except StopIteration:  # waiting to learn that the data ended is waiting for input too
                    self.reason = "end_of_data"
                    self._last_end = ended = time.perf_counter()
                    window.input_wait_s += ended - a
                    self.epochs.add(self.batches - read, examples, ended - entered)
                    self._emit("epoch", epoch=self.epochs.count, batches=self.batches - read, examples=examples,
                               seconds=ended - entered)
                    break
                stats = self.stats = stats_of(batch)
                examples += int(stats.get("examples", 0))
                if record_ids and isinstance(batch, dict) and "id" in batch:
                    self.ids.extend(batch["id"].numpy().ravel().tolist())
                if convert is not None:
                    batch = convert(batch)
                b = time.perf_counter()
                holding = (b - a, b, stats)
                yield batch
                holding = None
                c = self._last_end = time.perf_counter()
                self.batches += 1
                if self.batches == 1:
                    self._emit("first_batch", since_start_s=c - t0)
                window.add(b - a, c - b, stats)
                if log_steps:
                    log = self.steps_log
                    log["wait_s"].append(b - a)
                    log["step_s"].append(c - b)
                    for k in ("tokens", "padded_tokens", "examples"):
                        log[k].append(int(stats.get(k, 0)))
                if window.warmup:
                    if self.batches >= self.warmup_left:
                        self._emit_window(c)
                        self._window = window = Window(started=c)
                        self._measure_from(c, self.batches)
                elif c - window.started >= self.window_s:
                    self._emit_window(c)
                    self._measured.append(window)
                    self._window = window = Window(started=c)
        except GeneratorExit:
            self.reason = "closed"  # the consumer stopped asking (a break, or an exception in its step)
            if holding is not None:  # it had the batch: count it, its step ending now
                self.batches += 1
                self._last_end = time.perf_counter()
                window.add(holding[0], self._last_end - holding[1], holding[2])
                if self.batches >= steps:
                    self.reason = "steps"  # its last batch was the budget's last: the budget is spent either way
            raise

    def finish(self) -> None:
        """The last window and the end record (once); the ids and per-step records, when asked for. The measurement
        ends with the last batch's step: what a program does after its loop (saving, evaluating) is not in it."""
        if self.finished:
            return
        self.finished = True
        if self._t0 is None:
            self._start()
        end = self._last_end if self._last_end is not None else time.perf_counter()
        window = self._window
        assert window is not None, "_start() made the first window"
        if window.batches:
            self._emit_window(end)
            if not window.warmup:
                self._measured.append(window)
        measured_s = (end - self._measured_from) if self._measured_from is not None else 0.0
        self._emit("end", **end_fields(self.reason or "steps", self.batches, self._measured, measured_s,
                                       step=self.first_step + self.batches, checkpoint_step=self.checkpoint_step,
                                       epochs=self.epochs, stop=self.stop))
        if self.record_ids:
            Path(self.record_ids).write_text(json.dumps(self.ids))
        if self.record_steps:
            Path(self.record_steps).write_text(json.dumps(self.steps_log))


def _batch_stats():
    from dsctl.runtime.pipelines import batch_stats

    return batch_stats
