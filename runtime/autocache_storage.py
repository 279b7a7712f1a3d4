"""Measure how fast the cache's storage serves elements, as the get mode reads them.

Cachew models its GlusterFS cache as a function from an element's bytes to its read time.
dsctl measures its own: elements of a few sizes are written with the same TensorFlow snapshot
op a put uses, in the cache's own folder, and read back as a get does (batched 64 at a time,
as the profile reads). Three sizes are for fitting the model and two are held out to check it;
the orchestrator fits (costmodel/storage.py: the runtime only measures). Local measurements are
stored beside the caches (`.dsctl-storage-model.json`) and measured again only when that file
is missing or from another version; a gs:// cache is measured on every profile.
"""

from __future__ import annotations

import json
import os
import secrets
import time

VERSION = 2  # 2: the first batch (the snapshot's opening) is not timed
FIT_SIZES = (256, 16_384, 1_048_576)  # bytes per element the model is fitted on
CHECK_SIZES = (4_096, 262_144)  # held out: only checked
BYTES_PER_SIZE = 3 << 20  # per size: enough for a steady rate, little enough to take about a second
MODEL_FILE = ".dsctl-storage-model.json"


TIMED_BATCHES = 4  # batches timed per read, after a first that is not: opening the snapshot is paid once per epoch


def _per_batch(size: int) -> int:
    """Elements per read batch: at most 64, and at most 1 MB (large batches cost copies of their own)."""
    return max(1, min(64, (1 << 20) // size))


def _elements(size: int) -> int:
    """Enough for a first batch and TIMED_BATCHES timed ones, and about BYTES_PER_SIZE in all."""
    return int(max((TIMED_BATCHES + 1) * _per_batch(size), min(384, max(16, BYTES_PER_SIZE // size))))


def measure_size(root: str, size: int) -> float:
    """Seconds per element to read `size`-byte elements from a snapshot under `root` (written first).

    The clock starts at the first batch: opening the snapshot and starting its reader threads is paid
    once per epoch, which a get epoch spreads over all its elements; counted here it would be spread
    over a few dozen, and sizes measured with few elements would look slower per byte than they are."""
    import tensorflow as tf

    n = _elements(size)
    per_batch = _per_batch(size)
    floats = max(1, size // 4)
    where = f"{root.rstrip('/')}/.calibration-{secrets.token_hex(4)}"
    try:
        ds = tf.data.Dataset.range(n).map(lambda i: tf.fill([floats], tf.cast(i, tf.float32)))
        cached = ds.snapshot(where, compression=None)
        for _ in cached.batch(per_batch):  # the put
            pass
        best = None
        # Local: the faster of two reads (the first may still pay for the page cache). Cloud Storage: the
        # first read, as a worker's get epoch reads it (a second could come from TensorFlow's block cache).
        for _ in range(1 if root.startswith("gs://") else 2):
            start: float | None = None
            rows = 0
            for batch in cached.batch(per_batch):
                if start is None:
                    start = time.perf_counter()
                else:
                    rows += int(batch.shape[0])
            assert start is not None, "the put wrote n rows, so the read has batches"
            secs = (time.perf_counter() - start) / rows
            best = secs if best is None else min(best, secs)
        assert best is not None, "at least one read was timed"
        return best
    finally:
        try:
            tf.io.gfile.rmtree(where)
        except tf.errors.OpError:
            pass


def calibrate(root: str, refresh: bool = False) -> dict:
    """The storage read model for caches under `root` (local folders; gs:// is measured each time)."""
    remote = root.startswith("gs://")
    if not remote:
        os.makedirs(root, exist_ok=True)
        path = os.path.join(root, MODEL_FILE)
        if not refresh and os.path.exists(path):
            try:
                saved = json.loads(open(path).read())
                if saved.get("version") == VERSION:
                    return {**saved, "reused": True}
            except ValueError:
                pass
    result = {
        "version": VERSION, "root": root, "measured_at": time.time(),
        "fit": [{"bytes": s, "s_per_element": measure_size(root, s)} for s in FIT_SIZES],
        "held_out": [{"bytes": s, "s_per_element": measure_size(root, s)} for s in CHECK_SIZES],
    }
    if remote:
        return {**result, "reused": False}
    tmp = os.path.join(root, f".{MODEL_FILE}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(json.dumps(result, indent=1))
    os.replace(tmp, os.path.join(root, MODEL_FILE))
    return {**result, "reused": False}
