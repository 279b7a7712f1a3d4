"""A keras trainer's checkpoints: model, optimizer and step, saved and restored with tf.train.Checkpoint.

The step is the optimizer's own `iterations` counter, which the checkpoint carries with the
optimizer's state, so a restored run knows how far training got without a separate record.
tf.train.CheckpointManager writes each checkpoint before it updates its `checkpoint` index file,
so a trainer killed mid-save leaves the previous checkpoint as the latest; paths go through
tf.io.gfile, so a gs:// directory works as a local one does.

A restore takes the newest checkpoint that restores whole, not only the latest: the manager keeps
KEEP of them, and a damaged latest one (a truncated or overwritten file, a disk that filled while it
was copied) leaves the previous ones as good as they were. TensorFlow checks each tensor's CRC32C as
it reads it, so a damaged file fails its restore rather than loading wrong values. The candidates are
those the index file lists and every `<prefix>.index` in the folder (the index file itself may be the
damaged one); the restore says which it skipped and why (`Restored.notice`), so the run's record says
which checkpoint training continued from.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import tensorflow as tf

from .models import ModelError

KEEP = 3  # checkpoints kept per directory


class CheckpointError(ModelError):
    """A restore directory without a usable checkpoint; the message names it."""


def checkpoint_of(model) -> tf.train.Checkpoint:
    return tf.train.Checkpoint(model=model, optimizer=model.optimizer)


@dataclass(frozen=True)
class Restored:
    """What a restore loaded: the step (the optimizer's), the checkpoint, and the newer ones it skipped as damaged
    ((path, why) each)."""

    step: int
    path: str
    damaged: tuple[tuple[str, str], ...] = field(default=())

    @property
    def notice(self) -> str | None:
        """One paragraph for the run's record when a newer checkpoint was skipped; None when the latest was used."""
        if not self.damaged:
            return None
        skipped = "; ".join(f"{path} ({why})" for path, why in self.damaged)
        which = "the newest checkpoint is" if len(self.damaged) == 1 else f"the {len(self.damaged)} newest checkpoints are"
        return (f"{which} damaged and could not be restored: {skipped}. Restored {self.path} instead (step "
                f"{self.step}), the newest intact one; training continues from there.")


def restore(model, directory: str) -> int:
    """Load the newest intact checkpoint in `directory` into the model and its (built) optimizer; the step it was at."""
    return restore_newest(model, directory).step


def restore_newest(model, directory: str) -> Restored:
    """Load the newest checkpoint in `directory` that restores whole into the model and its (built) optimizer,
    skipping damaged newer ones (a restore that fails part-way is overwritten by the next one, which assigns every
    variable). CheckpointError (one paragraph naming the folder) when none does."""
    candidates = _candidates(directory)
    damaged: list[tuple[str, str]] = []
    for prefix in candidates:
        try:
            status = checkpoint_of(model).restore(prefix)
            status.assert_existing_objects_matched()  # every variable of the model and optimizer got its value
            status.expect_partial()  # what the checkpoint has beyond them (its save counter) is not a warning
        except Exception as exc:  # noqa: BLE001 - a damaged file fails in many ways (IndexError on a truncated one)
            damaged.append((prefix, f"{type(exc).__name__}: {_first_line(exc)}"))
            continue
        return Restored(step=int(model.optimizer.iterations.numpy()), path=prefix, damaged=tuple(damaged))
    if len(damaged) == 1:
        prefix, why = damaged[0]
        raise CheckpointError(_cannot(directory, f"its latest checkpoint {prefix} is damaged or was saved from "
                                                 f"another model ({why})"))
    listed = "; ".join(f"{prefix} ({why})" for prefix, why in damaged)
    raise CheckpointError(_cannot(directory, f"each of its {len(damaged)} checkpoints is damaged or was saved from "
                                             f"another model: {listed}"))


def _candidates(directory: str) -> list[str]:
    """Checkpoint prefixes in `directory`, newest (highest number) first: those its index file lists, and any other
    `<prefix>.index` there. CheckpointError when there is none."""
    listed: list[str] = []
    index_error = None
    try:
        state = tf.train.get_checkpoint_state(directory)
    except (tf.errors.OpError, OSError, ValueError) as exc:  # a damaged index file: the folder is still listed
        state, index_error = None, exc
    if state is not None:
        listed = [*state.all_model_checkpoint_paths, state.model_checkpoint_path]
    try:
        found = tf.io.gfile.glob(f"{directory.rstrip('/')}/*.index")
    except (tf.errors.OpError, OSError) as exc:
        if index_error is None and not listed:
            raise CheckpointError(_cannot(directory, f"it could not be read ({type(exc).__name__}: "
                                                     f"{_first_line(exc)})")) from None
        found = []
    prefixes = {f"{directory.rstrip('/')}/{_basename(p)}" for p in listed if p}
    prefixes |= {p[: -len(".index")] for p in found}
    if not prefixes:
        if index_error is not None:
            raise CheckpointError(_cannot(directory, f"it could not be read ({type(index_error).__name__}: "
                                                     f"{_first_line(index_error)})"))
        raise CheckpointError(_cannot(directory, "it has no checkpoint (no 'checkpoint' index file naming one)"
                                      if _exists(directory) else "it does not exist"))
    return sorted(prefixes, key=_number, reverse=True)


def _basename(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


def _number(prefix: str) -> tuple[int, str]:
    m = re.search(r"(\d+)$", prefix)
    return (int(m.group(1)) if m else -1, prefix)


class Saver:
    """Saves into `directory` (numbered by step) at every multiple of `every_steps` the training passes, and at the
    end; remembers the last step saved. Multiples of the global step, so a resumed run keeps the same grid."""

    def __init__(self, model, directory: str, every_steps: int | None, start_step: int = 0):
        self.every_steps = every_steps
        self.directory = directory
        self.manager = tf.train.CheckpointManager(checkpoint_of(model), directory, max_to_keep=KEEP)
        self.last_step: int | None = None
        self._passed = start_step  # the step the last due() call saw

    def due(self, step: int) -> bool:
        """True when a multiple of every_steps lies in (the step seen last, step]."""
        before, self._passed = self._passed, step
        if not self.every_steps:
            return False
        return step // self.every_steps > before // self.every_steps

    def save(self, step: int) -> str:
        if step == self.last_step:
            return self.manager.latest_checkpoint
        try:
            path = self.manager.save(checkpoint_number=step)
        except (tf.errors.OpError, OSError) as exc:
            raise CheckpointError(f"trainer.checkpoint.dir: saving a checkpoint at step {step} into {self.directory} "
                                  f"failed ({type(exc).__name__}: {_first_line(exc)}); check that the directory is "
                                  "writable (for gs://, that the bucket exists and the trainer may write to it).") from None
        self.last_step = step
        return path


def _exists(directory: str) -> bool:
    try:
        return tf.io.gfile.isdir(directory)
    except (tf.errors.OpError, OSError):
        return False


def _cannot(directory: str, why: str) -> str:
    return (f"cannot resume from {directory}: {why}. Resume from a directory a keras trainer saved checkpoints into "
            "(trainer.checkpoint.dir of the earlier run), or start the run afresh without --resume.")


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0][:300]
