"""How a run ended, judged once from the evidence its trainers and `dsctl down` left, for every way a run closes.

`dsctl up` judges it when its trainers have exited (run.py), `dsctl down` when it closes a run whose `dsctl up` is
gone (closing.py); both call `judge`. The evidence, and what decides over what:

- Every trainer's own end record saying it finished its job (steps reached, its data or duration ended) makes the
  run succeeded, even where its exit status was lost (a launcher killed before it could reap it) and even where
  `dsctl down` came after: the job was done.
- `dsctl down` leaves a request in the run dir before it stops anything (`request_down`). Whatever fails after it
  (a launcher it stopped, a trainer it signalled, a worker it took away) is its doing: the run is interrupted,
  whatever phase it met. A failure a trainer recorded before it still fails the run.
- A trainer's error record fails the run with its message (the user's to fix when it says so: exit 2).
- A trainer stopped by a signal before its last step (its end record's reason "signal", the signal named) did not
  finish: the run failed, saying which signal after how many of its steps; never succeeded. (Interrupted where no
  `dsctl up` saw it end: a `dsctl down` that could not leave its request, on a full disk, may have sent it.)
- Otherwise its exit status: a non-zero one fails the run with how the process ended (the provider's words: an
  out-of-memory kill named); one that was lost fails it saying so, unless its end record says it finished.

A loss that stops being a finite number (NaN, infinite) is recorded as such (summary.loss_summary); with
`trainer.nonfinite_loss: fail` the first window that has one fails the run (`diverged`).
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

from dsctl.specs import exits

from .reconcile import CLEAN_ENDS
from .records import Ending

LOST = -1  # an exit status that could not be read (the local provider's: its launcher ended first)
DOWN_REQUEST = "down-requested.json"  # in the run dir: `dsctl down` took the run down (who, when)


@dataclass
class DownRequest:
    """`dsctl down` asked for the run's teardown: which process, and when (wall clock)."""

    pid: int
    at: float

    def says(self, phase: str | None = None) -> str:
        when = time.strftime("%H:%M:%S", time.localtime(self.at))
        during = f" while the run was {phase}" if phase else ""
        return (f"taken down by `dsctl down` (pid {self.pid}) at {when}{during}: everything the run started is "
                "stopped, and what it measured is recorded")


def request_down(run_dir: str | Path) -> None:
    """Say, before anything is stopped, that `dsctl down` takes the run down; a run dir that cannot be written (a
    full or read-only disk) goes without, and the teardown goes on."""
    path = Path(run_dir) / DOWN_REQUEST
    try:
        tmp = path.with_name(f".{DOWN_REQUEST}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"pid": os.getpid(), "at": time.time()}))
        os.replace(tmp, path)
    except OSError:
        pass


def down_requested(run_dir: str | Path) -> DownRequest | None:
    try:
        data = json.loads((Path(run_dir) / DOWN_REQUEST).read_text())
        return DownRequest(pid=int(data["pid"]), at=float(data["at"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


@dataclass
class Trainer:
    """What one trainer left: its exit status (LOST where it was lost; None where nothing saw it end, dsctl up being
    gone), its own end and error records (runtime/metrics.py), and the provider's words on how its process ended."""

    index: int
    code: int | None = None
    end: dict | None = None
    error: dict | None = None
    ending: str | None = None

    @property
    def finished(self) -> bool:
        """Its end record says it finished its job, and no real exit status says otherwise."""
        return (self.end is not None and self.end.get("reason") in CLEAN_ENDS and self.error is None
                and self.code in (None, 0, LOST))


@dataclass
class Verdict:
    status: Ending
    detail: str | None = None  # why, in words (a trainer's own error message, as it wrote it)
    index: int | None = None  # the trainer that decided it
    user: bool = False  # the trainer's error is the user's to fix (bad input: exit 2)

    @property
    def message(self) -> str | None:
        """The run's error as recorded: a trainer's failure names the trainer."""
        if self.status == "failed" and self.index is not None and self.detail is not None and not self.user:
            return f"trainer {self.index} failed: {self.detail}"
        return self.detail


def _after(down: DownRequest | None, wall: object) -> bool:
    """Whether something that happened at `wall` (None: no time known) came after `dsctl down` asked."""
    return down is not None and (not isinstance(wall, (int, float)) or wall >= down.at)


def _stopped(t: Trainer, steps: int | None, watched: bool = True) -> str:
    end = t.end or {}
    batches = end.get("batches", 0)
    of = f"step {end.get('step', batches)} of {steps}" if steps else f"{batches} batch(es)"
    stopped = f"was stopped by {end.get('signal') or 'a signal'} after {of}, before the end of its job"
    if not watched:
        return f"{stopped}, while no `dsctl up` watched it"
    return f"it {stopped}; nothing in dsctl sent it (neither `dsctl down` nor Ctrl-C of `dsctl up`), so the run did " \
           "not finish"


def _exited(t: Trainer, log: str | None) -> str:
    code = t.code if t.code is not None else LOST
    how = t.ending or (exits.describe(code) if code < LOST else f"exited with code {code}")
    if t.end is not None and t.end.get("reason") in CLEAN_ENDS:
        how = f"ended its loop ({t.end.get('reason')}, {t.end.get('batches', 0)} batches) but then {how}"
    return f"it {how}" + (f"; see {log}" if log else "")


def judge(trainers: list[Trainer], count: int, steps: int | None = None, down: DownRequest | None = None,
          phase: str | None = None, logs: Path | None = None) -> Verdict:
    """The run's status from its `count` trainers' evidence (the module docstring says what decides over what).
    `steps`: the job's trainer.steps, for the words; `logs`: the folder of the trainers' logs, for the words."""
    by_index = {t.index: t for t in trainers}
    if count and all(by_index.get(i, Trainer(i)).finished for i in range(count)):
        return Verdict("succeeded")

    def log(t: Trainer) -> str | None:
        return str(logs / f"trainer-{t.index}.log") if logs is not None else None

    for t in sorted(trainers, key=lambda t: t.index):  # what a trainer recorded before `dsctl down` asked decides
        if t.error is not None and not _after(down, t.error.get("wall")):
            user = t.error.get("kind") == "user" or t.code == 2
            return Verdict("failed", t.error.get("message") or _exited(t, log(t)), t.index, user=user)
        if t.end is not None and t.end.get("reason") == "signal" and not _after(down, t.end.get("wall")):
            if t.code is None:  # dsctl up was gone: who sent it cannot be told
                return Verdict("interrupted", f"trainer {t.index} {_stopped(t, steps, watched=False)}")
            return Verdict("failed", _stopped(t, steps), t.index)
    if down is not None:
        return Verdict("interrupted", down.says(phase))
    for t in sorted(trainers, key=lambda t: t.index):
        if t.finished:
            continue
        if t.code is None:  # nothing saw its process end (dsctl up was gone): its own records are all there is
            said = (f"ended ({t.end.get('reason')}, {t.end.get('batches', 0)} batches) without finishing its job"
                    if t.end is not None else "was stopped before it wrote its end record")
            return Verdict("interrupted", f"trainer {t.index} {said}")
        if t.code == 0:
            continue  # exited cleanly and chose its own end (its loop closed early, or nothing to measure)
        return Verdict("failed", _exited(t, log(t)), t.index, user=t.code == 2)
    return Verdict("succeeded")


def diverged(index: int, window: dict, batches: int) -> str | None:
    """The run's error when trainer `index`'s `window` has a loss that is not a finite number (it had trained
    `batches` by the window's end), for a spec with trainer.nonfinite_loss: fail; None for a finite loss or none."""
    loss = window.get("loss")
    if not isinstance(loss, (int, float)) or math.isfinite(loss):
        return None
    value = "nan" if math.isnan(loss) else ("inf" if loss > 0 else "-inf")
    return (f"trainer {index}'s loss was {value} in its window ending at batch {batches}: the model diverged, and "
            "trainer.nonfinite_loss: fail ends the run when the loss stops being a finite number (`record`, the "
            "default, records it as such and trains on)")
