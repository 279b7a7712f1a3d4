"""Per-batch counts for the trainer harness: examples, real tokens, padded tokens.

Called once per batch on the consumer, so it only reads shapes and sums one
small int vector; no TensorFlow import, works on numpy arrays and eager tensors.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def _leading_dim(value: Any) -> int:
    shape = getattr(value, "shape", None)
    if shape is None:
        return 1
    return int(shape[0]) if len(shape) else 1


def _first_leaf(batch: Any) -> Any:
    while isinstance(batch, (dict, list, tuple)) and batch:
        batch = next(iter(batch.values())) if isinstance(batch, dict) else batch[0]
    return batch


def batch_stats(batch: Any) -> dict:
    """{"examples", "tokens", "padded_tokens"} for one batch.

    Text batches (a dict with "tokens" [B, L] and "lengths" [B]) count real tokens
    as sum(lengths) and padded tokens as B x L, so padding waste is visible.
    Anything else reports examples = leading dimension of its first component
    and 0 tokens.
    """
    if isinstance(batch, dict) and "tokens" in batch and "lengths" in batch:
        shape = batch["tokens"].shape
        examples = int(shape[0])
        tokens = int(np.asarray(batch["lengths"]).sum())
        padded = examples * (int(shape[1]) if len(shape) > 1 else 1)
        return {"examples": examples, "tokens": tokens, "padded_tokens": padded}
    return {"examples": _leading_dim(_first_leaf(batch)), "tokens": 0, "padded_tokens": 0}
