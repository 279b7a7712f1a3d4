"""`text`: variable-length token sequences, padded per batch or bucketed by length.

Why it is built this way:
- Sequences are generated once per set of generation params into
  `<cache>/text-<hash>/` (see _cache.py), lengths drawn from a seeded lognormal
  (skewed, like real text) or uniform distribution in [min_length, max_length].
  Token 0 is never generated: it is the padding value.
- Each sequence has a label (`num_classes`), and a quarter of its tokens are its class's
  marker tokens (`marker_tokens`), so a small model (embedding, pooling, dense) learns the
  label in a few hundred steps; the lengths are drawn as before, so padding is unchanged.
- Without bucketing, `padded_batch` pads to the longest sequence of each batch,
  so the padding waste of mixed lengths is real and measurable (batch_stats).
- With bucketing=(boundaries, num_consumers) this is the coordinated-reads
  recipe (tf.data service paper §3.6): in every round each of the n consumers
  gets one of n consecutive elements from the same worker, so the pipeline emits
  n consecutive batches from one length bucket, all padded to that bucket's
  upper edge. Every consumer in a round then has the same padded shape, and no
  one waits on a straggler holding a long batch.
  Bucket i holds lengths in (b[i-1], b[i]] padded to min(b[i], max_length); the
  last bucket holds lengths > b[-1] padded to max_length.
  Rounds must stay whole, so a bucket's leftover elements that do not fill
  batch_size * num_consumers are DROPPED at the end of the input. Coordinated
  reads need an infinite dataset (epochs: null), where nothing is dropped; with
  finite epochs up to (buckets x batch_size x num_consumers - 1) elements go.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tensorflow as tf

from dsctl.runtime.autocache import autocache
from dsctl.specs.pipelines import TextParams

from . import _cache

_FEATURES = {"tokens": tf.io.VarLenFeature(tf.int64), "label": tf.io.FixedLenFeature([], tf.int64)}
MARKER_SHARE = 0.25  # of each sequence's tokens are its class's markers


def marker_tokens(label: int, num_classes: int, vocab_size: int) -> np.ndarray:
    """The tokens that mark class `label`: up to 8 consecutive ids of its own, disjoint between classes."""
    per_class = max(1, min(8, (vocab_size - 1) // num_classes))
    return 1 + label * per_class + np.arange(per_class)


def sample_lengths(rng: np.random.Generator, n: int, lo: int, hi: int, distribution: str) -> np.ndarray:
    """n lengths in [lo, hi]. lognormal: median at the geometric mean of lo and hi,
    sigma a quarter of the log range (~95% land inside; the rest are redrawn)."""
    if distribution == "uniform" or lo == hi:
        return rng.integers(lo, hi + 1, size=n)
    log_lo, log_hi = np.log(lo), np.log(hi + 1)
    mu, sigma = (log_lo + log_hi) / 2, (log_hi - log_lo) / 4
    out = np.floor(rng.lognormal(mu, sigma, size=n)).astype(np.int64)
    bad = (out < lo) | (out > hi)
    while bad.any():
        out[bad] = np.floor(rng.lognormal(mu, sigma, size=int(bad.sum()))).astype(np.int64)
        bad = (out < lo) | (out > hi)
    return out


def _write_files(p: TextParams):
    def write(tmp: Path) -> list[str]:
        names = []
        for f in range(p.num_files):
            rng = np.random.default_rng([p.seed, f])
            lengths = sample_lengths(rng, p.sequences_per_file, p.min_length, p.max_length, p.length_distribution)
            tokens = rng.integers(1, p.vocab_size, size=int(lengths.sum()))
            labels = rng.integers(0, p.num_classes, size=len(lengths))
            name = f"text-{f:05d}-of-{p.num_files:05d}.tfrecord"
            with tf.io.TFRecordWriter(str(tmp / name)) as out:
                for seq, label in zip(np.split(tokens, np.cumsum(lengths)[:-1]), labels):
                    marked = rng.random(len(seq)) < MARKER_SHARE
                    seq[marked] = rng.choice(marker_tokens(int(label), p.num_classes, p.vocab_size), size=int(marked.sum()))
                    example = tf.train.Example(features=tf.train.Features(feature={
                        "tokens": tf.train.Feature(int64_list=tf.train.Int64List(value=seq.tolist())),
                        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)])),
                    }))
                    out.write(example.SerializeToString())
            names.append(name)
        return names

    return write


def prepare(p: TextParams, cache_dir):
    """Generate the TFRecords if needed (or find them under a gs:// cache_dir); returns their directory."""
    final = _cache.location("text", p, cache_dir)
    meta = {"kind": "text", "params": _cache.generation_params("text", p)}
    return _cache.materialize(final, _write_files(p), meta)


def _parse(record: tf.Tensor) -> dict:
    ex = tf.io.parse_single_example(record, _FEATURES)
    tokens = tf.cast(tf.sparse.to_dense(ex["tokens"]), tf.int32)
    return {"tokens": tokens, "lengths": tf.shape(tokens)[0], "label": ex["label"]}


def bucket_pad_lengths(boundaries: list[int], max_length: int) -> list[int]:
    """Padded length of each bucket: its upper edge (capped at max_length); the last bucket pads to max_length."""
    return [min(b, max_length) for b in boundaries] + [max_length]


def _bucketed(ds: tf.data.Dataset, p: TextParams, boundaries: list[int], num_consumers: int) -> tf.data.Dataset:
    edges = tf.constant(boundaries, tf.int32)
    pad_lengths = tf.constant(bucket_pad_lengths(boundaries, p.max_length), tf.int64)
    round_size = p.batch_size * num_consumers

    def bucket_id(element: dict) -> tf.Tensor:
        # Number of edges strictly below the length: (b[i-1], b[i]] -> i.
        return tf.reduce_sum(tf.cast(element["lengths"] > edges, tf.int64))

    def one_round(key: tf.Tensor, window: tf.data.Dataset) -> tf.data.Dataset:
        shapes = {"tokens": tf.reshape(tf.gather(pad_lengths, key), [1]), "lengths": tf.constant([], tf.int64),
                  "label": tf.constant([], tf.int64)}
        # One [B*n, pad] batch (dropped if the window is short), split into n batches of B.
        return window.padded_batch(round_size, padded_shapes=shapes, drop_remainder=True).rebatch(p.batch_size)

    return ds.group_by_window(key_func=bucket_id, reduce_func=one_round, window_size=round_size)


def build(p: TextParams, cache_dir, bucketing: tuple[list[int], int] | None = None) -> tf.data.Dataset:
    directory = prepare(p, cache_dir)
    files = _cache.data_files(directory)
    ds = tf.data.Dataset.from_tensor_slices(files)
    ds = ds.shuffle(len(files), seed=p.seed)
    ds = ds.interleave(tf.data.TFRecordDataset, cycle_length=min(len(files), 8), num_parallel_calls=tf.data.AUTOTUNE)
    ds = autocache(ds, "source")  # after reading: serialized records
    ds = ds.map(_parse, num_parallel_calls=tf.data.AUTOTUNE)
    ds = autocache(ds, "parsed")  # after the deterministic parse, before the shuffle
    if p.shuffle_buffer > 0:
        ds = ds.shuffle(p.shuffle_buffer, seed=p.seed + 1)
    ds = ds.repeat() if p.epochs is None else ds.repeat(p.epochs)
    if bucketing is None:
        ds = ds.padded_batch(p.batch_size, padded_shapes={"tokens": [None], "lengths": [], "label": []})
    else:
        boundaries, num_consumers = bucketing
        ds = _bucketed(ds, p, list(boundaries), int(num_consumers))
    return ds.prefetch(tf.data.AUTOTUNE)
