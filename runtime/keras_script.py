"""`dsctl.train.keras_callback()`: a program's own `model.fit`, measured as dsctl's keras trainer is.

The callback is keras_runner's Meter (windows from batch-begin stamps, input stall from a meter
inside the tf.data graph, the model's loss and metrics once per window), with what a program's fit
needs beyond dsctl's own one-epoch fit:
- the dataset must go through `callback.input(ds)`, which adds the input meter at its end and cuts
  it to the batches the run has left (trainer.steps less a resumed run's step);
- several epochs: batch indices restart each epoch and Keras resets the metrics, so each epoch
  ends its window and the next one counts on from the batches already done;
- the run's steps end training (stop_training) even if fit was asked for more;
- what the program reports itself (dsctl.train.report) joins each window's metrics.
The end record is written when training ends (on_train_end), as for dsctl's keras trainer.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from .keras_input import InputMeter
from .keras_runner import Meter
from .metrics import NullWriter


class ScriptMeter(Meter):
    """run: the program's run (runtime/client.py); first_step: where a resumed run continues from; on_end: what the
    client does once training ended (seal an autocache cache)."""

    def __init__(self, run, *, budget: int | None, duration_s: float | None, first_step: int,
                 on_end: Callable[[], None]):
        args = run.args
        window_s = args.window_s if args and args.window_s else run.spec.trainer.window_s
        super().__init__(run.spec, run.writer or NullWriter(), InputMeter(), window_s, run.stop, duration_s,
                         saver=None, restored=first_step)
        self.run, self.budget, self._after = run, budget, on_end
        self.scalars = run.scalars
        self.checkpoint_step = run.checkpoint_step
        self.wrapped = False
        self._epoch_base = 0  # batches done before this epoch
        self.on_end = self._end

    def input(self, ds):
        """The dataset to give model.fit: metered, and cut to the batches this run has left."""
        self.wrapped = True
        ds = self.meter.wrap(ds)
        return ds.take(self.budget) if self.budget is not None else ds

    # -- keras hooks -------------------------------------------------------------------------------
    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_base = self.done
        self.at_window = (self.done, self.at_window[1], self._metric_sums())  # Keras has just reset the metrics

    def on_train_batch_begin(self, batch, logs=None):
        done = self._epoch_base + batch
        now = time.perf_counter()
        if done > self.done:
            self._finished(done, now)
        self.begun_at = now
        if self.stop.is_set():
            self.stopped_by, self.model.stop_training = "signal", True
        elif now >= self.deadline:
            self.stopped_by, self.model.stop_training = "duration", True
        elif self.budget is not None and done + 1 >= self.budget:
            self.model.stop_training = True  # this batch is the run's last

    def on_epoch_end(self, epoch, logs=None):
        now = time.perf_counter()
        done = self.meter.read()[4]
        if done > self.done:
            self._finished(done, now)
        if self.window.batches or self.done > self.at_window[0]:
            self._close(now)  # Keras resets the metrics before the next epoch

    def _finished(self, done: int, now: float) -> None:
        if not self.wrapped and self.done == 0:
            raise self.run.fail("dsctl.train.keras_callback(): model.fit reads a dataset that did not go through "
                                "callback.input(ds), so dsctl cannot see the time fit waits for its input. Train with "
                                "model.fit(callback.input(ds), callbacks=[callback, ...]).")
        super()._finished(done, now)

    def _end(self) -> None:
        self.emit_end(self.restored + self.done, self.budget, self.checkpoint_step)
        self._after()
