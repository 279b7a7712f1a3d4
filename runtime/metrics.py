"""JSON-lines metrics written by the trainer harness, one window at a time.

Each line is flushed as soon as it is complete, so a launcher tailing the file
(locally or over SSH) sees progress live and loses nothing if a process dies.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from dataclasses import dataclass
from typing import IO


class MetricsWriter:
    def __init__(self, path: str, trainer: int):
        self._f: IO[str] = open(path, "a", buffering=1)
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
        }


class Stop(threading.Event):
    """A trainer told to stop before its budget is spent, and by which signal: its end record says so (reason
    "signal", `signal`: SIGTERM), so the run that reads it never takes the stop for a finished job."""

    signal: str | None = None

    def set_by(self, signum: int) -> None:
        self.signal = self.signal or signal.Signals(signum).name
        self.set()


def end_fields(reason: str, batches: int, measured: list[Window], measured_s: float, *, step: int,
               checkpoint_step: int | None, stop: threading.Event | None = None) -> dict:
    """A trainer's end record (event "end"), the same for every kind of trainer: why it stopped, its batches,
    the throughput of its measured (post-warm-up) windows, its global step and the last step it saved; stopped by a
    signal (reason "signal"), which one."""
    measured_batches = sum(w.batches for w in measured)
    said = getattr(stop, "signal", None) if reason == "signal" else None
    return dict(
        reason=reason, batches=batches, measured_batches=measured_batches, measured_s=measured_s,
        batches_per_s=(measured_batches / measured_s) if measured_s > 0 and measured_batches else None,
        input_wait_s=sum(w.input_wait_s for w in measured), step_s=sum(w.step_s for w in measured),
        tokens=sum(w.tokens for w in measured), padded_tokens=sum(w.padded_tokens for w in measured),
        step=step, checkpoint_step=checkpoint_step, **({"signal": said} if said else {}),
    )


class NullWriter:
    """A writer for a program run outside dsctl (dsctl.train without a run): nothing is recorded."""

    trainer = 0

    def emit(self, event: str, **fields) -> None:
        pass

    def close(self) -> None:
        pass
