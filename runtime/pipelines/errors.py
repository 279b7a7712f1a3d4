"""The one error type of the pipelines layer.

Kept free of TensorFlow so callers (CLI, orchestrator) can catch it without
paying for a TensorFlow import.
"""

from __future__ import annotations


class PipelineError(Exception):
    """A pipeline could not be built: bad params, a broken entrypoint, unusable cache.

    The message is one user-facing paragraph: what went wrong, where, what to do.
    """

    def __init__(self, message: str):
        self.message = " ".join(message.split())
        super().__init__(self.message)
