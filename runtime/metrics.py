"""JSON-lines metrics written by the trainer harness, one window at a time.

Each line is flushed as soon as it is complete, so a launcher tailing the file
(locally or over SSH) sees progress live and loses nothing if a process dies.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import IO


class MetricsWriter:
    def __init__(self, path: str, trainer: int):
        self._f: IO[str] = open(path, "a", buffering=1)
        self.path: str | None = path
        self.trainer = trainer

    def emit(self, event: str, **fields) -> None:
        self._f.write(json.dumps({"event": event, "trainer": self.trainer, "wall": time.time(), **fields}) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


@dataclass
class Window:
    """Accumulates per-batch timings until the window is emitted."""

    started: float
    batches: int = 0
    examples: int = 0
    input_wait_s: float = 0.0
    step_s: float = 0.0
    tokens: int = 0
    padded_tokens: int = 0
    warmup: bool = False
    outside_s: float = 0.0  # time the consumer spent outside its loop over the batches (evaluating between epochs)

    def add(self, wait_s: float, step_s: float, stats: dict) -> None:
        self.batches += 1
        self.examples += int(stats.get("examples", 0))
        self.input_wait_s += wait_s
        self.step_s += step_s
        self.tokens += int(stats.get("tokens", 0))
        self.padded_tokens += int(stats.get("padded_tokens", 0))

    def as_fields(self, now: float, t0: float) -> dict:
        elapsed = max(now - self.started, 1e-9)
        return {
            "t_start": round(self.started - t0, 4),
            "t_end": round(now - t0, 4),
            "batches": self.batches,
            "examples": self.examples,
            "batches_per_s": self.batches / elapsed,
            "mean_batch_time_s": elapsed / self.batches if self.batches else None,
            "input_wait_s": self.input_wait_s,
            "step_s": self.step_s,
            "tokens": self.tokens,
            "padded_tokens": self.padded_tokens,
            "warmup": self.warmup,
            "outside_s": self.outside_s,
        }


MAX_EPOCHS_LISTED = 1000  # an end record lists this many epochs' lengths at most (it counts them all)


@dataclass
class Epochs:
    """The passes a consumer read to their end (a program's epochs): each one's batches, elements and seconds; and
    what one pass holds read alone (standalone: no service), when known."""

    batches: list[int] = field(default_factory=list)
    examples: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    count: int = 0
    pass_batches: int | None = None
    pass_examples: int | None = None

    def add(self, batches: int, examples: int, seconds: float) -> None:
        self.count += 1
        if self.count <= MAX_EPOCHS_LISTED:
            self.batches.append(batches)
            self.examples.append(examples)
            self.seconds.append(round(seconds, 4))

    def as_fields(self) -> dict:
        return {"epochs": self.count, "epoch_batches": self.batches, "epoch_examples": self.examples,
                "epoch_seconds": self.seconds, "pass_batches": self.pass_batches, "pass_examples": self.pass_examples}


class Stop(threading.Event):
    """A trainer told to stop before its budget is spent, and by which signal: its end record says so (reason
    "signal", `signal`: SIGTERM), so the run that reads it never takes the stop for a finished job."""

    signal: str | None = None

    def set_by(self, signum: int) -> None:
        self.signal = self.signal or signal.Signals(signum).name
        self.set()


def end_fields(reason: str, batches: int, measured: list[Window], measured_s: float, *, step: int,
               checkpoint_step: int | None, epochs: Epochs | None = None, stop: threading.Event | None = None) -> dict:
    """A trainer's end record (event "end"), the same for every kind of trainer: why it stopped, its batches,
    the throughput of its measured (post-warm-up) windows over the wall clock and over its training step time
    (inside its loop: input wait and steps), the time it spent outside its loop (evaluation, checkpoints), its
    epochs, its global step and the last step it saved; stopped by a signal (reason "signal"), which one."""
    measured_batches = sum(w.batches for w in measured)
    inside_s = sum(w.input_wait_s + w.step_s for w in measured)
    said = getattr(stop, "signal", None) if reason == "signal" else None
    return dict(
        reason=reason, batches=batches, measured_batches=measured_batches, measured_s=measured_s,
        batches_per_s=(measured_batches / measured_s) if measured_s > 0 and measured_batches else None,
        step_batches_per_s=(measured_batches / inside_s) if inside_s > 0 and measured_batches else None,
        input_wait_s=sum(w.input_wait_s for w in measured), step_s=sum(w.step_s for w in measured),
        outside_s=sum(w.outside_s for w in measured),
        tokens=sum(w.tokens for w in measured), padded_tokens=sum(w.padded_tokens for w in measured),
        step=step, checkpoint_step=checkpoint_step, **(epochs or Epochs()).as_fields(),
        **({"signal": said} if said else {}),
    )


class NullWriter:
    """A writer for a program run outside dsctl (dsctl.train without a run): nothing is recorded."""

    trainer = 0
    path: str | None = None

    def emit(self, event: str, **fields) -> None:
        pass

    def close(self) -> None:
        pass
