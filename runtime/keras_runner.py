"""Train the user's Keras model (trainer.model.kind: keras) with `model.fit`, measured like every other model.

The model is built by the user's function inside the strategy's scope (runtime/strategy.py),
optionally restored from a checkpoint, and trained with one `fit` call for exactly the steps
left (`steps_per_epoch` = trainer.steps - the restored step, `epochs=1`), or until
trainer.duration_s, the end of a finite pipeline, or SIGTERM. The dataset is the harness's own
(`build_input`: service, colocated or ideal), mapped to (features, label) and metered
(runtime/keras_input.py); `fit` distributes it for the strategy.

The metrics come from `Meter`, a callback that only implements `on_train_batch_begin`: the
begin of execution k+1 is the end of execution k, stamped with perf_counter. Keras keeps its
asynchronous dispatch of batch-end callbacks as long as no callback implements
`on_train_batch_end`, so nothing here makes fit convert its logs per batch. At a window's end
(trainer.window_s) the callback reads the input meter, the loss and the metrics once: the
window's batches, batches/s, mean batch time, input stall (time blocked fetching the batch,
from the meter) and step time (the executions' time minus that), the window's mean loss and
the model's other metrics. Warm-up batches go into a window marked warmup, as in the harness.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import keras

from dsctl.specs.schema import JobSpec

from . import placement
from .metrics import Epochs, MetricsWriter, NullWriter, Window, end_fields
from .models import ModelError, load_function


def train(spec: JobSpec, ds, writer: MetricsWriter, *, base_dir: Path, steps: int | None, duration_s: float | None,
          window_s: float | None, stop: threading.Event, accelerator: str = "none", accelerators: int = 0,
          checkpoint_dir: str | None = None, restore_from: str | None = None, mode: str = "service",
          then: Callable[[], None] | None = None) -> str:
    """Build (and restore) the model, fit it, and write start/window/end events; the reason training ended.

    The last checkpoint and the `end` event are written when the last batch is done, inside `fit`
    (on_train_end): when `fit` returns it drops its iterator over the service dataset, which waits on
    the requests still out (0 to 19 s measured here) and must count neither in the run's batches/s nor
    before its checkpoint. `then` runs right after; the trainer passes one that exits the process, so
    that wait never happens at all (as the harness's own loop does)."""
    from . import checkpoint, strategy
    from .keras_input import InputMeter, static_batches, to_xy

    choice = strategy.choose(accelerator, accelerators)
    strat = strategy.make(choice)
    assert spec.trainer.model.entrypoint is not None, "rules.py: a keras model has its entrypoint"
    build = load_function(spec.trainer.model.entrypoint, base_dir)
    with strat.scope():
        model = _build(build, spec.trainer.model.params)
        model.optimizer.build(model.trainable_variables)  # its slots exist before a restore fills them
    found = checkpoint.restore_newest(model, restore_from) if restore_from else None
    restored = found.step if found is not None else 0
    every = spec.trainer.checkpoint.every_steps if spec.trainer.checkpoint else None
    saver = checkpoint.Saver(model, checkpoint_dir, every, restored) if checkpoint_dir else None
    notice = found.notice if found is not None else None  # a damaged newest checkpoint was skipped: which, and why
    if notice:
        print(f"dsctl trainer: {notice}", file=sys.stderr, flush=True)
    writer.emit("start", pid=os.getpid(), mode=mode, restored_step=restored, strategy=type(strat).__name__,
                **({"restore_notice": notice} if notice else {}))

    remaining = None if steps is None else max(steps - restored, 0)
    meter = InputMeter()
    ds = static_batches(ds, choice.kind, (spec.pipeline.params or {}).get("batch_size"))
    data = meter.wrap(ds, to_xy(spec.pipeline.builtin))
    callback = Meter(spec, writer, meter, window_s or spec.trainer.window_s, stop, duration_s, saver, restored)
    wrapped_up: list[bool] = []

    def wrap_up() -> None:
        if wrapped_up:
            return
        wrapped_up.append(True)
        step = restored + callback.done
        if int(model.optimizer.iterations.numpy()) != step:
            model.optimizer.iterations.assign(step)  # Keras's extra count at the end of data; a restore must see `step`
        if saver is not None and step != restored:
            saver.save(step)
        callback.emit_end(step, remaining, saver.last_step if saver is not None else None)
        if then is not None:
            then()

    callback.on_end = wrap_up
    if remaining == 0:
        callback.finish_without_training()
    else:
        model.fit(data, epochs=1, steps_per_epoch=remaining, callbacks=[callback], verbose=0, shuffle=False)
    wrap_up()
    return callback.reason


def _build(build, params: dict):
    name = getattr(build, "__name__", "the model function")
    try:
        model = build(**params)
    except ModelError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's function failed: theirs to fix
        raise ModelError(f"trainer.model.entrypoint: {name}(**trainer.model.params) raised {type(exc).__name__}: "
                         f"{exc} (it was called with params {sorted(params) or 'none'}).") from None
    if not isinstance(model, keras.Model):
        raise ModelError(f"trainer.model.entrypoint: {name} returned {type(model).__module__}.{type(model).__qualname__}, "
                         "not a keras.Model; return the model itself, compiled (model.compile(optimizer=..., loss=...)).")
    if not getattr(model, "compiled", False) or model.optimizer is None:
        raise ModelError(f"trainer.model.entrypoint: {name} returned a model that is not compiled; call "
                         "model.compile(optimizer=..., loss=...) before returning it, as dsctl trains it with model.fit.")
    if not model.built:
        raise ModelError(f"trainer.model.entrypoint: {name} returned a model that is not built; give it its input "
                         "shape (keras.Input(shape=...) or model.build(...)) so that dsctl can create and restore its "
                         "variables before training.")
    return model


class Meter(keras.callbacks.Callback):
    """The callback that writes the harness's windows; see the module docstring for what it measures."""

    def __init__(self, spec: JobSpec, writer: MetricsWriter | NullWriter, meter, window_s: float, stop: threading.Event,
                 duration_s: float | None, saver, restored: int):
        super().__init__()
        self.spec, self.writer, self.meter, self.window_s = spec, writer, meter, window_s
        self.stop, self.duration_s, self.saver, self.restored = stop, duration_s, saver, restored
        self.warmup_left = spec.trainer.warmup_batches
        self.reason = "steps"
        self.t0 = time.perf_counter()
        self.window = Window(started=self.t0, warmup=self.warmup_left > 0)
        self.measured: list[Window] = []
        self.measured_from: float | None = None if self.warmup_left else self.t0
        self.deadline = float("inf")
        self.done = 0  # batches finished
        self.begun_at = self.t0  # when the running execution began
        self.busy = 0.0  # seconds inside executions, this window
        self.end_wait = 0.0  # seconds spent learning that the data ended (a step that found none), this window
        # batches, meter sums, metric sums at the window's start
        self.at_window: tuple[int, tuple[float, int, int, int, int], dict | None] = (0, (0.0, 0, 0, 0, 0), None)
        self.stopped_by: str | None = None
        self.ended_at: float | None = None  # when the last batch was done
        self.on_end: Callable[[], None] = lambda: None  # run then (train() sets it)
        self.scalars = None  # a program's own reported figures (runtime/keras_script.py), joined to each window
        self.epochs: Epochs | None = None  # a program's epochs (runtime/keras_script.py)

    # -- keras hooks -------------------------------------------------------------------------------
    def on_train_begin(self, logs=None):
        self.t0 = self.begun_at = time.perf_counter()
        self.window = Window(started=self.t0, warmup=self.warmup_left > 0)
        self.at_window = (0, (0.0, 0, 0, 0, 0), self._metric_sums())
        if self.measured_from is not None:
            self.measured_from = self.t0
            self.writer.emit("measure_start", batches=0)
            self._arm_deadline()

    def on_train_batch_begin(self, batch, logs=None):
        now = time.perf_counter()
        if batch:
            self._finished(batch, now)
        self.begun_at = now
        if self.stop.is_set():
            self.stopped_by, self.model.stop_training = "signal", True
        elif now >= self.deadline:
            self.stopped_by, self.model.stop_training = "duration", True

    def on_train_end(self, logs=None):
        # The batches the model took, from the meter: at the end of a pipeline of unknown length Keras counts
        # one optimizer iteration more than it trained (train() puts the step back).
        now = time.perf_counter()
        done = self.meter.read()[4]
        if done > self.done:
            self._finished(done, now)
        self.ended_at = now
        self.on_end()

    # -- bookkeeping ---------------------------------------------------------------------------------
    def _finished(self, done: int, now: float) -> None:
        """Executions up to batch `done` (exclusive) ended at `now`."""
        first = self.done == 0
        self.busy += now - self.begun_at
        self.done = done
        if first:
            self.writer.emit("first_batch", since_start_s=now - self.t0)
        if self.saver is not None and self.saver.due(self.restored + done):
            path = self.saver.save(self.restored + done)
            self.writer.emit("checkpoint", step=self.restored + done, path=path)
        if self.window.warmup:
            if done >= self.warmup_left:
                self._close(now)
                self.writer.emit("measure_start", batches=done)
                self.measured_from = now
                self._arm_deadline()
        elif now - self.window.started >= self.window_s:
            self._close(now)

    def _arm_deadline(self) -> None:
        if self.duration_s is not None:
            assert self.measured_from is not None, "armed when the measurement starts"
            self.deadline = self.measured_from + self.duration_s

    def _close(self, now: float) -> None:
        """Emit the window that ends now and start the next one."""
        batches0, sums0, metrics0 = self.at_window
        sums = self.meter.read()
        metrics = self._metric_sums()
        w = self.window
        w.batches = self.done - batches0
        w.input_wait_s = sums[0] - sums0[0]
        w.examples, w.tokens, w.padded_tokens = (sums[i] - sums0[i] for i in (1, 2, 3))
        w.step_s = max(self.busy - w.input_wait_s, 0.0)
        w.input_wait_s += self.end_wait
        self.end_wait = 0.0
        loss, others = _window_metrics(metrics0, metrics)
        if self.scalars is not None:  # what a program reported itself (dsctl.train.report)
            reported_loss, reported = self.scalars.take()
            others.update(reported)
            loss = loss if loss is not None else reported_loss
        self.writer.emit("window", **w.as_fields(now, self.t0), queue_fill=None, loss=loss, metrics=others,
                         **placement.on_window(self.writer))
        if not w.warmup:
            self.measured.append(w)
        self.window = Window(started=now)
        self.busy = 0.0
        self.at_window = (self.done, sums, metrics)

    def _metric_sums(self) -> dict:
        return _metric_state(self.model)

    def finish_without_training(self) -> None:
        """Nothing left to train (a restored run already at trainer.steps)."""
        self.reason = "steps"

    def emit_end(self, step: int, remaining: int | None, checkpoint_step: int | None) -> None:
        end = self.ended_at if self.ended_at is not None else time.perf_counter()
        if self.window.batches or self.done > self.at_window[0]:
            self._close(end)
        if self.stopped_by:
            self.reason = self.stopped_by
        elif remaining is not None and self.done < remaining:
            self.reason = "end_of_data"
        elif remaining is None:
            self.reason = "end_of_data"
        measured_s = (end - self.measured_from) if self.measured_from is not None else 0.0
        self.writer.emit("end", **end_fields(self.reason, self.done, self.measured, measured_s, step=step,
                                             checkpoint_step=checkpoint_step, epochs=self.epochs, stop=self.stop))


def _metric_state(model) -> dict:
    """{name: (total, count)} of the model's mean-type metrics (the loss tracker and, e.g., accuracy), and
    {name: value} of the others; read once per window."""
    out: dict[str, tuple[float, float] | float] = {}
    for metric in _leaf_metrics(model):
        total, count = getattr(metric, "total", None), getattr(metric, "count", None)
        try:
            if total is not None and count is not None:
                out[metric.name] = (float(total.numpy()), float(count.numpy()))
            else:
                value = metric.result()
                out[metric.name] = float(value.numpy() if hasattr(value, "numpy") else value)
        except (TypeError, ValueError, AttributeError):
            continue  # a metric that is not one number (e.g. per-class results) is left out
    return out


def _leaf_metrics(model) -> list:
    leaves = []
    for metric in model.metrics:
        inner = getattr(metric, "metrics", None)
        if inner and type(metric).__name__ == "CompileMetrics":
            leaves += [m for m in inner if m is not None]
        else:
            leaves.append(metric)
    return leaves


def _window_metrics(before: dict | None, after: dict) -> tuple[float | None, dict]:
    """The window's mean of each mean-type metric (from the change in its total and count); others as they read."""
    values = {}
    for name, now in after.items():
        if isinstance(now, tuple):
            prev = (before or {}).get(name, (0.0, 0.0))
            dcount = now[1] - prev[1]
            values[name] = (now[0] - prev[0]) / dcount if dcount > 0 else None
        else:
            values[name] = now
    loss = values.pop("loss", None)
    return loss, values
