"""A keras trainer's checkpoints: model, optimizer and step, saved and restored with tf.train.Checkpoint.

The step is the optimizer's own `iterations` counter, which the checkpoint carries with the
optimizer's state, so a restored run knows how far training got without a separate record.
tf.train.CheckpointManager writes each checkpoint before it updates its `checkpoint` index file,
so a trainer killed mid-save leaves the previous checkpoint as the latest; paths go through
tf.io.gfile, so a gs:// directory works as a local one does.
"""

from __future__ import annotations

import tensorflow as tf

from .models import ModelError

KEEP = 3  # checkpoints kept per directory


class CheckpointError(ModelError):
    """A restore directory without a usable checkpoint; the message names it."""


def checkpoint_of(model) -> tf.train.Checkpoint:
    return tf.train.Checkpoint(model=model, optimizer=model.optimizer)


def restore(model, directory: str) -> int:
    """Load the latest checkpoint in `directory` into the model and its (built) optimizer; the step it was at."""
    try:
        latest = tf.train.latest_checkpoint(directory)
    except (tf.errors.OpError, OSError, ValueError) as exc:
        raise CheckpointError(_cannot(directory, f"it could not be read ({type(exc).__name__}: {_first_line(exc)})")) from None
    if latest is None:
        exists = _exists(directory)
        raise CheckpointError(_cannot(directory, "it has no checkpoint (no 'checkpoint' index file naming one)"
                                      if exists else "it does not exist"))
    try:
        status = checkpoint_of(model).restore(latest)
        status.assert_existing_objects_matched()  # every variable of the model and optimizer got its value
        status.expect_partial()  # what the checkpoint has beyond them (its save counter) is not a warning
    except Exception as exc:  # noqa: BLE001 - a damaged file fails in many ways (IndexError on a truncated one)
        raise CheckpointError(_cannot(directory, f"its latest checkpoint {latest} is damaged or was saved from "
                                                 f"another model ({type(exc).__name__}: {_first_line(exc)})")) from None
    return int(model.optimizer.iterations.numpy())


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
