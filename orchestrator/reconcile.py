"""What a run's trainers wrote for themselves, read back when the process that recorded the run is gone.

Each trainer writes its metrics to `<run dir>/metrics/trainer-<i>.jsonl` (start, first_batch, measure_start,
window, end, error: runtime/metrics.py) whether or not anything reads them. `dsctl up`, or the detached one
that monitors a deployment, stores them in runs.db as they come; once it has died (kill -9, the OOM killer,
a closed session) the trainers go on, and one may train to its last step and write its own end record long
after the last window was stored. So a run closed by `dsctl down` is closed from these files, not from the
windows that happened to be stored: its status is what its trainers say (succeeded when every one ended
cleanly), its summary is made from their own end records and every window they wrote, and only a trainer
that wrote no end record is summarized from its windows. `dsctl status` reads the same files to say how far
a deployment whose monitor is gone got.

A run that `dsctl up` saw end but could not record (a full disk refused both runs.db and the run dir) leaves
its outcome in `<run dir>/ended.json`, written into the room of a reserve file made when the run started
(`reserve`, `leave_outcome`): `dsctl down` records that outcome, so a run a full disk ended says so rather
than "interrupted".
"""

from __future__ import annotations

import errno
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

CLEAN_ENDS = ("steps", "end_of_data", "duration")  # an end record's reasons for a trainer that finished its job
RESERVE = ".reserve"  # room kept in the run dir for ended.json, should the disk fill
RESERVE_BYTES = 64 * 1024
ENDED = "ended.json"
FULL_DISK_TEXT = "No space left on device"
_TRAINER_FILE = re.compile(r"^trainer-(\d+)\.jsonl$")
LOG_TAIL_BYTES = 4096


@dataclass
class TrainerFiles:
    """Everything the trainers of one run wrote in their metrics files, by trainer."""

    ends: dict[int, dict] = field(default_factory=dict)  # the end record of each trainer that wrote one
    errors: dict[int, dict] = field(default_factory=dict)  # the error record of each trainer that wrote one
    placements: dict[int, dict] = field(default_factory=dict)  # each trainer's placement record (hybrid placement)
    windows: list[dict] = field(default_factory=list)  # every window, as runs.db stores them
    first_batch_wall: float | None = None  # the first trainer's first batch
    measured_from_wall: float | None = None  # when the last trainer finished warming up
    last_wall: float | None = None  # the last thing any trainer wrote
    trainers: list[int] = field(default_factory=list)  # the trainers that have a metrics file

    def finished(self, count: int) -> bool:
        """Every one of `count` trainers wrote an end record saying it finished its job, and none an error."""
        return count > 0 and not self.errors and all(
            self.ends.get(i, {}).get("reason") in CLEAN_ENDS for i in range(count))

    def batches(self) -> int:
        """Batches trained, by the trainers' own counts where they have one, else by their windows."""
        counted = {i: e.get("batches") or 0 for i, e in self.ends.items()}
        for w in self.windows:
            if w["trainer"] not in self.ends:
                counted[w["trainer"]] = counted.get(w["trainer"], 0) + (w.get("batches") or 0)
        return sum(counted.values())

    def describe(self, count: int) -> str:
        """One clause per trainer: how it ended, by its own records."""
        parts = []
        for i in range(count):
            if i in self.errors:
                parts.append(f"trainer {i} failed ({first_line(self.errors[i].get('message'))})")
            elif i in self.ends:
                end = self.ends[i]
                parts.append(f"trainer {i} ended ({end.get('reason')}, {end.get('batches', 0)} batches)")
            elif i in self.trainers:
                mine = sum(w.get("batches") or 0 for w in self.windows if w["trainer"] == i)
                parts.append(f"trainer {i} wrote no end record ({mine} batches in its windows)")
            else:
                parts.append(f"trainer {i} wrote no metrics")
        return "; ".join(parts)


def first_line(text: str | None) -> str:
    lines = (text or "no message").strip().splitlines()
    return lines[0] if lines else "no message"


def read_trainer_files(run_dir: str | Path) -> TrainerFiles:
    """The run's `metrics/trainer-<i>.jsonl` files (a job's; a sweep's are per mode, below them), read whole.
    A half-written last line (a trainer killed mid-write, a full disk) is skipped."""
    out = TrainerFiles()
    metrics = Path(run_dir) / "metrics"
    try:
        paths = sorted(metrics.iterdir()) if metrics.is_dir() else []
    except OSError:
        return out
    for path in paths:
        match = _TRAINER_FILE.match(path.name)
        if not match:
            continue
        index = int(match.group(1))
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        out.trainers.append(index)
        for line in text.splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict):
                _take(out, index, rec)
    out.windows.sort(key=lambda w: (w.get("wall") or 0.0, w["trainer"]))
    return out


def _take(out: TrainerFiles, index: int, rec: dict) -> None:
    event, wall = rec.get("event"), rec.get("wall")
    if isinstance(wall, (int, float)):
        out.last_wall = max(out.last_wall or wall, wall)
    if event == "window":
        out.windows.append({**rec, "trainer": index})
    elif event == "end":
        out.ends[index] = {k: v for k, v in rec.items() if k != "event"}
    elif event == "error":
        out.errors[index] = rec
    elif event == "placement":
        out.placements[index] = rec
    elif event == "first_batch" and isinstance(wall, (int, float)):
        out.first_batch_wall = min(out.first_batch_wall or wall, wall)
    elif event == "measure_start" and isinstance(wall, (int, float)):
        out.measured_from_wall = max(out.measured_from_wall or wall, wall)


def window_key(w: dict) -> tuple:
    """What makes one window the same whether read from runs.db or from its trainer's file."""
    return w["trainer"], round(float(w.get("t_start") or 0.0), 6), round(float(w.get("t_end") or 0.0), 6)


# -- a run ended by a full disk ------------------------------------------------------------------------------------

def reserve(run_dir: str | Path) -> None:
    """Keep RESERVE_BYTES of the run dir's disk for the run's outcome (written, not sparse, so the room is real).
    OSError (a full disk) when even that cannot be had: the run does not start."""
    path = Path(run_dir) / RESERVE
    with open(path, "wb") as f:
        f.write(b"\0" * RESERVE_BYTES)
        f.flush()
        os.fsync(f.fileno())


def release_reserve(run_dir: str | Path) -> None:
    try:
        (Path(run_dir) / RESERVE).unlink(missing_ok=True)
    except OSError:
        pass


def leave_outcome(run_dir: str | Path, outcome: dict) -> Path | None:
    """`dsctl up` saw the run end but could record it nowhere: free the reserve and write the outcome in its room,
    for `dsctl down` to record. The path written, or None if even that failed."""
    release_reserve(run_dir)
    path = Path(run_dir) / ENDED
    try:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(outcome))
        os.replace(tmp, path)
    except OSError:
        return None
    return path


def left_outcome(run_dir: str | Path) -> dict | None:
    """The outcome `dsctl up` left in the run dir because it could not record it (leave_outcome), if any."""
    try:
        data = json.loads((Path(run_dir) / ENDED).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("status") else None


def forget_outcome(run_dir: str | Path) -> None:
    """Once the outcome is in the record, the file goes (with the reserve, which nothing needs any more)."""
    release_reserve(run_dir)
    try:
        (Path(run_dir) / ENDED).unlink(missing_ok=True)
    except OSError:
        pass


def is_full_disk(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def full_disk_message(exc: OSError, where: str | Path) -> str:
    """The error a run ended by a full disk records: what was full, and what to do."""
    what = f" writing {exc.filename}" if exc.filename else ""
    return (f"the disk holding {where} filled up ({exc.strerror or os.strerror(exc.errno or errno.ENOSPC)}{what}), "
            "so the run could not go on; free some space there and run it again.")


def logs_say_full(run_dir: str | Path) -> Path | None:
    """A log of the run whose last lines say a disk was full: what is left of a run a full disk ended when nothing
    recorded it (dsctl up killed too)."""
    run_dir = Path(run_dir)
    for path in [*sorted(run_dir.glob("*.log")), *sorted((run_dir / "metrics").glob("trainer-*.log"))]:
        try:
            with open(path, "rb") as f:
                f.seek(max(f.seek(0, os.SEEK_END) - LOG_TAIL_BYTES, 0))
                tail = f.read().decode(errors="replace")
        except OSError:
            continue
        if FULL_DISK_TEXT in tail or "Errno 28" in tail:
            return path
    return None
