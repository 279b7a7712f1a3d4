"""`dsctl.train.keras_callback()`: a program's own `model.fit`, measured as dsctl's keras trainer is.

The callback is keras_runner's Meter (windows from batch-begin stamps, input stall from a meter
inside the tf.data graph, the model's loss and metrics once per window), with what a program's fit
needs beyond dsctl's own one-epoch fit:
- the dataset must go through `callback.input(ds)`, which adds the input meter at its end and cuts
  it to the batches the run has left (trainer.steps less a resumed run's step);
- several epochs: batch indices restart each epoch and Keras resets the metrics, so each epoch
  ends its window and the next one counts on from the batches already done;
- the run's steps end training (stop_training) even if fit was asked for more;
- what the program reports itself (dsctl.train.report) joins each window's metrics;
- each epoch is recorded (its batches, elements and seconds, and the validation metrics fit computed for it);
- validation (`validation_data`): fit evaluates after an epoch's last batch with the same metric objects, which
  it resets; the window is closed before it (so it holds the training metrics) and the evaluation's time is
  the program's own, outside training (the window's `outside_s`), not a slow last step.
The end record is written when training ends (on_train_end), as for dsctl's keras trainer.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from .keras_input import InputMeter
from .keras_runner import Meter
from .metrics import Epochs, NullWriter


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
        self.epochs = Epochs(pass_batches=run.pass_length[0], pass_examples=run.pass_length[1])
        self._epoch_began = (time.perf_counter(), 0)  # when this epoch began, and the elements read before it
        self._evaluating_since: float | None = None
        self._validated = False  # this epoch's validation ran

    def input(self, ds):
        """The dataset to give model.fit: metered, and cut to the batches this run has left."""
        self.wrapped = True
        ds = self.meter.wrap(ds)
        return ds.take(self.budget) if self.budget is not None else ds

    # -- keras hooks -------------------------------------------------------------------------------
    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_base = self.done
        self.at_window = (self.done, self.at_window[1], self._metric_sums())  # Keras has just reset the metrics
        self._epoch_began = (time.perf_counter(), self.meter.read()[1])
        self._validated = False

    def _epoch_done(self, now: float) -> None:
        """The epoch's last batch has ended by now. When it had ended before (fit then tried a step that found the
        data's end: a finite dataset of a length Keras does not know), the time since is the wait for that end."""
        done = self.meter.read()[4]
        if done > self.done:
            self._finished(done, now)
        elif now > self.begun_at:
            self.end_wait += now - self.begun_at
        self.begun_at = now

    def on_test_begin(self, logs=None):
        """Validation inside fit (validation_data), after the epoch's last batch: that batch ends now, and its
        window closes while the metrics still hold the training's."""
        now = time.perf_counter()
        self._epoch_done(now)
        if self.window.batches or self.done > self.at_window[0]:
            self._close(now)
        self._evaluating_since, self._validated = now, True

    def on_test_end(self, logs=None):
        if self._evaluating_since is not None:
            self.window.outside_s += time.perf_counter() - self._evaluating_since
            self._evaluating_since = None

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
        if not self._validated:  # with validation, the batches ended when it began
            self._epoch_done(now)
        if self.window.batches or self.done > self.at_window[0]:
            self._close(now)  # Keras resets the metrics before the next epoch
        began, examples_before = self._epoch_began
        examples = self.meter.read()[1] - examples_before
        self.epochs.add(self.done - self._epoch_base, examples, now - began)
        validation = {k: float(v) for k, v in (logs or {}).items() if k.startswith("val_") and _number(v)}
        self.writer.emit("epoch", epoch=self.epochs.count, batches=self.done - self._epoch_base, examples=examples,
                         seconds=now - began, **({"metrics": validation} if validation else {}))

    def _finished(self, done: int, now: float) -> None:
        if not self.wrapped and self.done == 0:
            raise self.run.fail("dsctl.train.keras_callback(): model.fit reads a dataset that did not go through "
                                "callback.input(ds), so dsctl cannot see the time fit waits for its input. Train with "
                                "model.fit(callback.input(ds), callbacks=[callback, ...]).")
        super()._finished(done, now)

    def _end(self) -> None:
        self.emit_end(self.restored + self.done, self.budget, self.checkpoint_step)
        self._after()


def _number(value) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True
