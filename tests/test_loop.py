"""The measured loop every trainer that iterates its own batches is timed by (runtime/loop.py): windows, warm-up,
the step budget across several runs, a consumer that stops early, the figures it reports, and one end record.
No TensorFlow: the loop reads any iterable of batches."""

from __future__ import annotations

import signal
import time

import numpy as np

from dsctl.runtime.loop import MeasuredLoop, Scalars
from dsctl.runtime.metrics import Stop


class Recorder:
    trainer = 0

    def __init__(self):
        self.events: list[tuple[str, dict]] = []

    def emit(self, event: str, **fields) -> None:
        self.events.append((event, fields))

    def of(self, kind: str) -> list[dict]:
        return [f for e, f in self.events if e == kind]


def batches(n: int, size: int = 4):
    return [{"x": np.zeros((size, 2)), "label": np.zeros(size)} for _ in range(n)]


def loop(rec: Recorder, **kw) -> MeasuredLoop:
    args = dict(steps=None, duration_s=None, window_s=1000.0, warmup_batches=0)
    args.update(kw)
    return MeasuredLoop(rec, **args)


def test_the_budget_carries_over_runs_and_the_end_record_is_written_once():
    rec = Recorder()
    lp = loop(rec, steps=10, warmup_batches=2, first_step=100)
    first = list(lp.run(batches(6)))  # an epoch of a finite dataset ends before the budget
    assert len(first) == 6 and lp.reason == "end_of_data" and not lp.exhausted and not rec.of("end")
    second = list(lp.run(batches(6)))  # the next epoch reads only what is left
    assert len(second) == 4 and lp.reason == "steps" and lp.exhausted
    lp.finish()
    lp.finish()
    [end] = rec.of("end")
    assert end["batches"] == 10 and end["step"] == 110 and end["measured_batches"] == 8 and end["reason"] == "steps"
    windows = rec.of("window")
    assert windows[0]["warmup"] and windows[0]["batches"] == 2
    assert sum(w["batches"] for w in windows) == 10 and sum(w["examples"] for w in windows) == 40
    assert len(rec.of("measure_start")) == 1 and len(rec.of("first_batch")) == 1
    assert list(lp.run(batches(3))) == []  # nothing more after the end


def test_a_consumer_that_stops_asking_has_the_batch_it_held_counted():
    rec = Recorder()
    lp = loop(rec, steps=50)
    for i, _ in enumerate(lp.run(batches(50))):
        if i == 6:
            break  # the 7th batch was handed over, and its step ran
    assert lp.reason == "closed" and lp.batches == 7 and not lp.exhausted
    lp.finish()
    assert rec.of("end")[0]["batches"] == 7


def test_wait_and_step_times_are_told_apart():
    class Slow:
        def __iter__(self):
            for b in batches(3):
                time.sleep(0.05)  # the input is slow
                yield b

    rec = Recorder()
    lp = loop(rec)
    for _ in lp.run(Slow()):
        time.sleep(0.01)  # the step is fast
    lp.finish()
    [end] = rec.of("end")
    assert end["input_wait_s"] >= 3 * 0.045 and 3 * 0.009 <= end["step_s"] < end["input_wait_s"]


def test_reported_figures_are_window_means_and_loss_is_its_own_field():
    rec = Recorder()
    scalars = Scalars()
    lp = loop(rec, scalars=scalars, window_s=0.0)  # every batch closes a window
    for i, _ in enumerate(lp.run(batches(2))):
        scalars.add({"loss": 2.0 + i, "accuracy": 0.5})
        scalars.add({"loss": 4.0 + i})
    lp.finish()
    windows = rec.of("window")
    assert [w["loss"] for w in windows] == [3.0, 4.0]
    assert windows[0]["metrics"] == {"accuracy": 0.5}


def test_stop_and_duration_end_a_loop_that_has_no_step_budget():
    rec = Recorder()
    stop = Stop()
    lp = loop(rec, stop=stop)
    for i, _ in enumerate(lp.run(iter(batches(1000)))):
        if i == 3:
            stop.set_by(signal.SIGTERM)
    assert lp.reason == "signal" and lp.batches == 4 and lp.exhausted
    lp.finish()
    [end] = rec.of("end")
    assert end["reason"] == "signal" and end["signal"] == "SIGTERM", "the end record names the signal that stopped it"

    rec = Recorder()
    lp = loop(rec, duration_s=0.05)

    def endless():
        while True:
            time.sleep(0.005)
            yield batches(1)[0]

    n = sum(1 for _ in lp.run(endless()))
    assert lp.reason == "duration" and 3 <= n < 100


def test_what_a_program_does_after_its_loop_is_not_measured():
    rec = Recorder()
    lp = loop(rec, steps=50)
    for i, _ in enumerate(lp.run(batches(50))):
        if i == 9:
            break
    time.sleep(0.3)  # saving, evaluating: after the last batch
    lp.finish()
    [end] = rec.of("end")
    assert end["batches"] == 10 and end["measured_s"] < 0.2, end
