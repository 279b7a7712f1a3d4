"""`synthetic`: elements {"id": int64, "x": float32[feature_size]} with tunable cost; with `label_classes`
also {"label": int64}, the index of the largest of x's first label_classes values (a linear model learns it).

Why it is built this way:
- The source is `range(shards)`, each shard flat-mapped into its id range. Under
  distributed_epoch (ShardingPolicy.DYNAMIC) the dispatcher hands out splits of
  the SOURCE dataset; with `range(elements)` every element would be one split
  RPC, which is several times slower. Here one split = one shard.
- `latency_ms` is TensorFlow's SleepDataset op: it sleeps before each element,
  sequentially, using no CPU, and it is a graph op, so it survives serialization
  to remote tf.data service workers (`tf.py_function`/`time.sleep` do not). One
  worker therefore delivers at most 1000/latency_ms elements/s, which makes
  latency-bound scaling measurable on a 2-core machine.
- `cpu_work` is N chained 64x64 float32 matmuls per element inside the graph:
  real CPU burn that workers can parallelize.
- `x` is a stateless function of the id, so the data is the same everywhere.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from tensorflow.python.data.experimental.ops import testing as tf_data_testing

from dsctl.runtime.autocache import autocache
from dsctl.specs.pipelines import SyntheticParams

MATMUL_SIDE = 64


def _shard_range(elements: int, shards: int):
    def ids(shard: tf.Tensor) -> tf.data.Dataset:
        # Shard i holds ids [i*n//s, (i+1)*n//s): sizes differ by at most one.
        return tf.data.Dataset.range(shard * elements // shards, (shard + 1) * elements // shards)

    return ids


def _make_element(feature_size: int, cpu_work: int, label_classes: int | None = None):
    # A fixed, well-conditioned matrix; tanh keeps the chained product bounded.
    w = tf.constant(
        (np.random.default_rng(0).normal(size=(MATMUL_SIDE, MATMUL_SIDE)) / np.sqrt(MATMUL_SIDE)).astype(np.float32)
    )

    def element(i: tf.Tensor) -> dict:
        x = tf.random.stateless_uniform([feature_size], seed=tf.stack([i, tf.constant(0, tf.int64)]))
        if cpu_work > 0:
            m0 = tf.random.stateless_uniform(
                [MATMUL_SIDE, MATMUL_SIDE], seed=tf.stack([i, tf.constant(1, tf.int64)])
            )
            _, m = tf.while_loop(
                lambda k, m: k < cpu_work,
                lambda k, m: (k + 1, tf.tanh(tf.matmul(m, w))),
                (tf.constant(0), m0),
            )
            # Make x depend on the result so the work cannot be pruned; the term
            # is < 1e-26 and leaves x unchanged at float32 precision.
            x = x + 1e-30 * tf.reduce_sum(m)
        if label_classes is None:
            return {"id": i, "x": x}
        return {"id": i, "x": x, "label": tf.argmax(x[:label_classes], output_type=tf.int64)}

    return element


def build(p: SyntheticParams) -> tf.data.Dataset:
    ds = tf.data.Dataset.range(p.shards)
    ds = ds.flat_map(_shard_range(p.elements, p.shards))
    if p.latency_ms > 0:
        ds = ds.apply(tf_data_testing.sleep(int(round(p.latency_ms * 1000))))
    ds = autocache(ds, "source")  # after reading (the ids, slowed by latency_ms)
    ds = ds.map(_make_element(p.feature_size, p.cpu_work, p.label_classes), num_parallel_calls=tf.data.AUTOTUNE)
    ds = autocache(ds, "full")  # every transformation is deterministic: the whole element
    ds = ds.repeat() if p.epochs is None else ds.repeat(p.epochs)
    return ds.batch(p.batch_size).prefetch(tf.data.AUTOTUNE)
