"""Where a run's trainers keep checkpoints, and what a checkpoint folder holds, read without TensorFlow.

Each run writes below its own folder, `{trainer.checkpoint.dir}/{run id}/trainer-{i}`, so a resumed
run never overwrites the checkpoints it restored from and any run of a chain can be resumed again.
A relative local `dir` is relative to the spec file's folder, as entrypoints are; on Google Cloud it
is a gs:// URL (specs/rules.py), since a VM's disk goes with the VM.

The trainer saves with TensorFlow's CheckpointManager, numbering each checkpoint by its global
step: the folder's `checkpoint` state file names the latest (`model_checkpoint_path: "ckpt-120"`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from dsctl.provisioners import TrainerLaunch
from dsctl.specs.schema import JobSpec

STATE_FILE = "checkpoint"  # TensorFlow's CheckpointState, a text proto
LATEST_RE = re.compile(r'^model_checkpoint_path:\s*"([^"]*?)(\d+)"\s*$', re.M)


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


def latest(trainer_dir: str) -> Latest:
    if trainer_dir.startswith("gs://"):
        try:
            from . import gcs

            text = gcs.read(f"{trainer_dir}/{STATE_FILE}")
        except Exception as exc:  # noqa: BLE001 - no client library, no credentials, no network: cannot tell
            return Latest(found=None, error=f"{type(exc).__name__}: {exc}".splitlines()[0])
        return _parse(text.decode() if text is not None else None)
    try:
        text = (Path(trainer_dir) / STATE_FILE).read_text()
    except (FileNotFoundError, NotADirectoryError):
        return Latest(found=False)
    except OSError as exc:
        return Latest(found=None, error=exc.strerror)
    return _parse(text)


def _parse(text: str | None) -> Latest:
    if not text:
        return Latest(found=False)
    m = LATEST_RE.search(text)
    if m is None:
        return Latest(found="model_checkpoint_path" in text)
    return Latest(found=True, step=int(m.group(2)))


def trainer_dirs(base: str, count: int) -> list[str]:
    """Each trainer's folder below a run's checkpoint folder, named as the trainers are told (contract.py)."""
    return [TrainerLaunch.trainer_checkpoint_dir(base, i) for i in range(count)]


def saved_step(base: str | None, count: int) -> int | None:
    """The step every trainer of a run can resume from (the lowest of their latest checkpoints), read from
    the folders; None when any trainer has none or cannot be read. For runs whose trainers never said
    (killed, or the orchestrator was)."""
    if not base:
        return None
    steps = [latest(d).step for d in trainer_dirs(base, count)]
    return None if not steps or None in steps else min(steps)

