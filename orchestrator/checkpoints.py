"""Where a run's trainers keep checkpoints, and what a checkpoint folder holds, read without TensorFlow.

Each run writes below its own folder, `{trainer.checkpoint.dir}/{run id}/trainer-{i}`, so a resumed
run never overwrites the checkpoints it restored from and any run of a chain can be resumed again.
A relative local `dir` is relative to the spec file's folder, as entrypoints are; on Google Cloud it
is a gs:// URL (specs/rules.py), since a VM's disk goes with the VM.

A keras trainer saves with TensorFlow's CheckpointManager, numbering each checkpoint by its global
step: the folder's `checkpoint` state file names the latest (`model_checkpoint_path: "ckpt-120"`) and
the ones kept before it (`all_model_checkpoint_paths`). A latest checkpoint whose files are missing or
empty is damaged: the newest one before it whose files are there is the one a resume restores, and
the damaged ones are named (`Latest.damaged`). Whether a checkpoint's contents are intact only
TensorFlow can tell, as it restores it (runtime/checkpoint.py skips a damaged one the same way, and
says so in the run's record).
A user's command saves however it likes and says which step it saved in a note beside it
(runtime/saved.py); for a command only that note counts, since a checkpoint's own number need not
be its step.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from dsctl.provisioners import TrainerLaunch
from dsctl.runtime import saved
from dsctl.specs.schema import JobSpec

STATE_FILE = "checkpoint"  # TensorFlow's CheckpointState, a text proto
LATEST_RE = re.compile(r'^model_checkpoint_path:\s*"([^"]*?)(\d+)"\s*$', re.M)
ALL_RE = re.compile(r'^all_model_checkpoint_paths:\s*"([^"]*?)(\d+)"\s*$', re.M)
NAMES_LATEST_RE = re.compile(r"^model_checkpoint_path:", re.M)  # a latest named, with or without a step


def run_checkpoint_dir(spec: JobSpec, base_dir: Path, run_id: str) -> str | None:
    """The run's own checkpoint folder (its trainers' folders are below it); None without trainer.checkpoint."""
    ck = spec.trainer.checkpoint
    if ck is None:
        return None
    if ck.dir.startswith("gs://"):
        return f"{ck.dir.rstrip('/')}/{run_id}"
    path = Path(ck.dir).expanduser()
    return str((path if path.is_absolute() else base_dir / path).resolve() / run_id)


@dataclass(frozen=True)
class Latest:
    """The latest checkpoint in one trainer's folder: found True/False, or None when it cannot be read
    (a gs:// folder this machine cannot reach); its step when its name carries one."""

    found: bool | None
    step: int | None = None
    error: str | None = None
    damaged: tuple[str, ...] = ()  # newer checkpoints skipped: "<folder>/ckpt-200: its .index file is missing"


def latest(trainer_dir: str, note_only: bool = False) -> Latest:
    """The latest checkpoint in one trainer's folder: the step its note names (a command's), else, unless
    note_only, the one TensorFlow's state file names (a keras trainer's)."""
    note = _read(f"{trainer_dir}/{saved.MARKER}")
    if isinstance(note, Latest):
        return note
    step = saved.parse(note)
    if step is not None or note_only:
        return Latest(found=step is not None, step=step)
    state = _read(f"{trainer_dir}/{STATE_FILE}")
    return state if isinstance(state, Latest) else _parse(state, trainer_dir)


def _read(path: str) -> str | None | Latest:
    """A small file's text (None when it is missing), or a Latest saying it cannot be read."""
    if path.startswith("gs://"):
        try:
            from . import gcs

            data = gcs.read(path)
        except Exception as exc:  # noqa: BLE001 - no client library, no credentials, no network: cannot tell
            return Latest(found=None, error=f"{type(exc).__name__}: {exc}".splitlines()[0])
        return data.decode() if data is not None else None
    try:
        return Path(path).read_text()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        return Latest(found=None, error=exc.strerror)


def _parse(text: str | None, trainer_dir: str | None = None) -> Latest:
    if not text:
        return Latest(found=False)
    m = LATEST_RE.search(text)
    if m is None:
        return Latest(found=NAMES_LATEST_RE.search(text) is not None)  # not all_model_checkpoint_paths' lines
    newest_first = [(m.group(1), int(m.group(2)))]
    for prefix, number in reversed(ALL_RE.findall(text)):
        if (prefix, int(number)) not in newest_first:
            newest_first.append((prefix, int(number)))
    if trainer_dir is None or trainer_dir.startswith("gs://"):  # listing Cloud Storage here is not worth its cost
        return Latest(found=True, step=newest_first[0][1])
    damaged: list[str] = []
    for prefix, step in newest_first:
        name = f"{Path(prefix).name}{step}"
        why = _incomplete(Path(trainer_dir), name)
        if why is None:
            return Latest(found=True, step=step, damaged=tuple(damaged))
        damaged.append(f"{trainer_dir}/{name}: {why}")
    return Latest(found=False, damaged=tuple(damaged))


def _incomplete(folder: Path, name: str) -> str | None:
    """Why checkpoint `name`'s files in `folder` cannot be whole (missing or empty), or None."""
    index = folder / f"{name}.index"
    if not index.is_file() or index.stat().st_size == 0:
        return "its .index file is missing" if not index.is_file() else "its .index file is empty"
    shards = sorted(folder.glob(f"{name}.data-*-of-*"))
    if not shards:
        return "its .data file is missing"
    m = re.search(r"-of-(\d+)$", shards[0].name)
    if m and len(shards) < int(m.group(1)):
        return f"{int(m.group(1)) - len(shards)} of its {int(m.group(1))} .data files are missing"
    empty = [p.name for p in shards if p.stat().st_size == 0]
    return f"{empty[0]} is empty" if empty else None


def trainer_dirs(base: str, count: int) -> list[str]:
    """Each trainer's folder below a run's checkpoint folder, named as the trainers are told (contract.py)."""
    return [TrainerLaunch.trainer_checkpoint_dir(base, i) for i in range(count)]


def saved_step(base: str | None, count: int, note_only: bool = False) -> int | None:
    """The step every trainer of a run can resume from (the lowest of their latest checkpoints), read from
    the folders; None when any trainer has none or cannot be read. For runs whose trainers never said
    (killed, or the orchestrator was)."""
    if not base:
        return None
    steps = [latest(d, note_only).step for d in trainer_dirs(base, count)]
    known = [s for s in steps if s is not None]
    return None if not steps or len(known) < len(steps) else min(known)
