"""The note a user's command leaves beside its checkpoints: which step its latest one is.

dsctl cannot read every checkpoint format (TensorFlow's, orbax's, NumPy files), so a command says what it
saved: `dsctl.train.checkpoint_saved(step)` writes `dsctl-checkpoint.json` into the trainer's checkpoint
folder after the checkpoint itself, replacing the previous note in one step. A run killed between a save
and its note resumes from the step the note names, which the command still has (keep at least two).
"""

from __future__ import annotations

import json

MARKER = "dsctl-checkpoint.json"


def parse(text: str | bytes | None) -> int | None:
    """The step a note names, or None for a missing or unreadable one."""
    if not text:
        return None
    try:
        step = json.loads(text).get("step")
    except (ValueError, AttributeError):
        return None
    return step if isinstance(step, int) and not isinstance(step, bool) and step >= 0 else None


def write(directory: str, step: int) -> str:
    """Write the note for `step` into `directory` (local or gs://), whole or not at all; its path."""
    import tensorflow as tf

    tf.io.gfile.makedirs(directory)
    path = f"{directory.rstrip('/')}/{MARKER}"
    tmp = f"{path}.tmp"
    with tf.io.gfile.GFile(tmp, "w") as f:
        f.write(json.dumps({"step": int(step)}))
    tf.io.gfile.rename(tmp, path, overwrite=True)
    return path


def read(directory: str) -> int | None:
    """The step of the note in `directory`, or None."""
    import tensorflow as tf

    path = f"{directory.rstrip('/')}/{MARKER}"
    try:
        with tf.io.gfile.GFile(path, "rb") as f:
            return parse(f.read())
    except (tf.errors.NotFoundError, OSError):
        return None
