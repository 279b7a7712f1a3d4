"""Deliberately misconfigured pipelines for benchmarks/bench_profile.py, each with the fix its name says.

    sequential_map(parallel_calls=None)   a per-element fetch with 2 ms of latency (a remote read, simulated with
                                          a nested dataset's sleep: a stateful op, so TensorFlow leaves the map
                                          sequential) and a little CPU; the fix: num_parallel_calls
    no_prefetch(prefetch=False)           10 ms per batch of latency in the reader's thread (a sleep after the
                                          map), as long as the trainer's step, with TensorFlow's injected prefetch
                                          turned off; the fix: a prefetch
    inflate_then_filter()                 an upscale (16× the bytes, most of the CPU) before a filter that keeps one
                                          element in four, in a reorderable section; the fix: filter first
    expensive_prefix()                    an expensive deterministic feature map before an autocache hint, a cheap
                                          random augmentation after it; the fix: cache at the hint

Everything is made inside the graph (no files, no py_function), so tf.data service could run each one.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from tensorflow.python.data.experimental.ops import testing

import dsctl

SIDE = 64
W = tf.constant((np.random.default_rng(0).normal(size=(SIDE, SIDE)) / np.sqrt(SIDE)).astype(np.float32))


def _work(x: tf.Tensor, rounds: int) -> tf.Tensor:
    """`rounds` chained 64x64 matmuls seeded by x: CPU a function of x alone."""
    m0 = tf.random.stateless_uniform([SIDE, SIDE], seed=tf.stack([x, tf.constant(1, tf.int64)]))
    _, m = tf.while_loop(lambda k, m: k < rounds, lambda k, m: (k + 1, tf.tanh(tf.matmul(m, W))), (tf.constant(0), m0))
    return m


def _ids(n: int = 1 << 20) -> tf.data.Dataset:
    return tf.data.Dataset.range(n)


def sequential_map(parallel_calls: int | None = None, latency_us: int = 2000, batch_size: int = 16) -> tf.data.Dataset:
    def fetch(i):
        i = tf.data.Dataset.from_tensors(i).apply(testing.sleep(latency_us)).get_single_element()
        return {"id": i, "x": tf.reduce_mean(_work(i, 2), axis=0)}

    ds = _ids().map(fetch, num_parallel_calls=parallel_calls)
    return ds.batch(batch_size).prefetch(tf.data.AUTOTUNE)


def no_prefetch(prefetch: bool = False, latency_us: int = 625, batch_size: int = 16) -> tf.data.Dataset:
    ds = _ids().map(lambda i: {"id": i, "x": tf.cast(i, tf.float32) * tf.ones([32])}, num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.apply(testing.sleep(latency_us)).batch(batch_size)  # 10 ms per batch in the reader's thread
    if prefetch:
        ds = ds.prefetch(tf.data.AUTOTUNE)
    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False
    return ds.with_options(options)


def inflate_then_filter(batch_size: int = 16) -> tf.data.Dataset:
    def make(i):
        return {"label": i % 4, "image": tf.random.stateless_uniform([32, 32, 3], seed=tf.stack([i, tf.constant(0, tf.int64)]))}

    def upscale(e):
        big = tf.image.resize(e["image"], [128, 128], method="bicubic")
        return {"label": e["label"], "image": big + 1e-9 * tf.reduce_sum(_work(e["label"], 48))}

    ds = _ids().map(make, num_parallel_calls=tf.data.AUTOTUNE)
    ds = dsctl.reorderable(ds, "augment", {
        "upscale": lambda d: d.map(upscale, num_parallel_calls=tf.data.AUTOTUNE),
        "keep_one_in_four": lambda d: d.filter(lambda e: tf.equal(e["label"], 0)),
    })
    return ds.batch(batch_size).prefetch(tf.data.AUTOTUNE)


def expensive_prefix(elements: int = 512, batch_size: int = 16) -> tf.data.Dataset:
    def features(i):
        return {"id": i, "x": tf.reduce_mean(_work(i, 40), axis=0)}

    def augment(e, seed):
        noise = tf.random.stateless_uniform([SIDE], seed=tf.stack([seed, tf.constant(2, tf.int64)]), maxval=0.01)
        return {"id": e["id"], "x": e["x"] + noise}

    ds = tf.data.Dataset.range(elements).map(features, num_parallel_calls=tf.data.AUTOTUNE)
    ds = dsctl.autocache(ds, "features")
    ds = tf.data.Dataset.zip(ds, tf.data.Dataset.random(seed=1, rerandomize_each_iteration=True))
    ds = ds.map(augment, num_parallel_calls=tf.data.AUTOTUNE).repeat()
    return ds.batch(batch_size).prefetch(tf.data.AUTOTUNE)
