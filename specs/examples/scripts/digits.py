"""A small MNIST-like dataset made offline: 12x12 grey "digits" of 10 classes, drawn inside the tf.data graph.

    make_dataset(split="train" | "test", batch_size=32, examples=2048, shards=16)

It stands in for `tfds.load("mnist")` in the example programs (jax_epochs.py, keras_validation.py), so they run
anywhere, CI included, with nothing to download. Each class is a fixed random glyph; an element is its class's
glyph, shifted by a pixel or two and buried in noise, so a small model needs a few epochs to learn it. Every
element is a function of its id (stateless random ops), so the data is the same on every machine, and the graph
is plain data that tf.data service ships to its workers. The train and test splits are disjoint ranges of ids:
the test split is held out.

The source is `range(shards)`, each shard flat-mapped into its ids, as in dsctl's `synthetic` builtin: under
processing_mode distributed_epoch the dispatcher hands out whole shards, and with shards whose size is a multiple
of the batch size (2048 / 16 = 128 = 4 x 32) every worker's batches are whole, so an epoch through the service has
exactly the batches it has read alone.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

SIDE = 12
CLASSES = 10
TEST_IDS = 10**6  # the test split's ids start here, far from the train split's


def _glyphs(seed: int = 7) -> np.ndarray:
    """[CLASSES, SIDE, SIDE] in {0, 1}: one random blob of strokes per class."""
    rng = np.random.default_rng(seed)
    glyphs = np.zeros((CLASSES, SIDE, SIDE), np.float32)
    for c in range(CLASSES):
        for _ in range(3):  # three strokes
            r, k = rng.integers(2, SIDE - 2, size=2)
            dr, dk = rng.choice([-1, 0, 1], size=2)
            for step in range(6):
                glyphs[c, np.clip(r + dr * step, 0, SIDE - 1), np.clip(k + dk * step, 0, SIDE - 1)] = 1.0
    return glyphs


def _element(glyphs: tf.Tensor, noise: float):
    def make(i: tf.Tensor) -> dict:
        label = tf.random.stateless_uniform([], seed=tf.stack([i, tf.constant(1, tf.int64)]), maxval=CLASSES,
                                            dtype=tf.int64)
        shift = tf.random.stateless_uniform([2], seed=tf.stack([i, tf.constant(2, tf.int64)]), minval=-1, maxval=2,
                                            dtype=tf.int32)
        image = tf.roll(tf.gather(glyphs, label), shift=shift, axis=[0, 1])
        image += noise * tf.random.stateless_normal([SIDE, SIDE], seed=tf.stack([i, tf.constant(3, tf.int64)]))
        return {"image": image[:, :, None], "label": label}

    return make


def make_dataset(split: str = "train", batch_size: int = 32, examples: int = 2048, shards: int = 16,
                 noise: float = 0.5) -> tf.data.Dataset:
    """One epoch of `examples` elements {"image": float32 [12, 12, 1], "label": int64}, batched."""
    if split not in ("train", "test"):
        raise ValueError(f"split is 'train' or 'test', got {split!r}")
    first = 0 if split == "train" else TEST_IDS

    def ids(shard: tf.Tensor) -> tf.data.Dataset:
        return tf.data.Dataset.range(first + shard * examples // shards, first + (shard + 1) * examples // shards)

    ds = tf.data.Dataset.range(shards).flat_map(ids)
    ds = ds.map(_element(tf.constant(_glyphs()), noise), num_parallel_calls=tf.data.AUTOTUNE)
    return ds.batch(batch_size).prefetch(tf.data.AUTOTUNE)
