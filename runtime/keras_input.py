"""The trainer-side end of a keras model's input: (features, label) pairs, and a meter of input stall.

`to_xy` maps a builtin's dict element to what `model.fit` takes: images -> (image, label),
text -> (tokens, label), synthetic -> (x, label). A user's entrypoint pipeline is passed
as it is: it returns what its model takes.

`InputMeter` measures, inside the tf.data graph and at no per-batch cost to Python, the time
the training step spends blocked fetching its batch. The metered dataset is
`zip(stamps, ds).map(record)`: `zip` pulls a timestamp first, at the moment the consumer asks
for the next batch, then the batch itself; `record` runs when the batch has arrived and adds
(now - stamp) to a variable, with the batch's examples, tokens and padded tokens. The map is
sequential and nothing is prefetched after it (tf.data's injected prefetch is turned off for
it), so under the default strategy (CPU, one GPU)
the consumer is Keras's train function itself, and the sum is exactly its time in
IteratorGetNext: the input stall the harness measures around `next()` for other models.
Under MirroredStrategy and TPUStrategy the distributed iterator prefetches to the devices
after this point, so there it is the wait of that prefetch (an upper bound on the stall).
The variable is read once per metrics window, never per batch.
"""

from __future__ import annotations

import tensorflow as tf

FEATURE_OF = {"images": "image", "text": "tokens", "synthetic": "x"}


def to_xy(builtin: str | None):
    """The map from a builtin's element to (features, label); None for a user's pipeline (left as it is)."""
    if builtin is None:
        return None
    feature = FEATURE_OF[builtin]
    return lambda e: (e[feature], e["label"])


def static_batches(ds: tf.data.Dataset, strategy_kind: str, batch_size: int | None) -> tf.data.Dataset:
    """On a TPU every batch must have the same, static size (XLA compiles one shape): batches are cut
    again to `batch_size` with the remainder dropped (at most batch_size - 1 elements, at the end of a
    finite dataset; a worker's partial last batches are merged with the others first). Elsewhere `ds`
    is returned as it is. A pipeline of unknown batch size on a TPU is the user's to fix (ModelError)."""
    if strategy_kind != "tpu":
        return ds
    first = tf.nest.flatten(ds.element_spec)[0]
    if first.shape.rank and first.shape[0] is not None:
        return ds
    if not batch_size:
        from .models import ModelError

        raise ModelError(
            "a TPU trains on batches of one static size, but this pipeline's batch size is not known to TensorFlow "
            f"(its first component's shape is {first.shape}). End the pipeline with .batch(B, drop_remainder=True), "
            "or give pipeline.params.batch_size so dsctl can cut the batches to that size.")
    return ds.rebatch(batch_size, drop_remainder=True)


class InputMeter:
    """Sums of [input wait seconds, examples, tokens, padded tokens, batches] over the batches the model has taken."""

    def __init__(self):
        # A plain variable on the host, made outside any strategy scope: the input pipeline runs on the host.
        with tf.device("/cpu:0"):
            self.sums = tf.Variable(tf.zeros([5], tf.float64), trainable=False, name="dsctl_input_meter")

    def wrap(self, ds: tf.data.Dataset, xy=None) -> tf.data.Dataset:
        stamps = tf.data.Dataset.from_tensors(tf.constant(0, tf.int64)).repeat().map(lambda _: tf.timestamp())
        sums = self.sums

        def record(asked, element):
            arrived = tf.timestamp()
            examples, tokens, padded = _stats(element)
            update = tf.stack([arrived - asked, examples, tokens, padded, tf.constant(1.0, tf.float64)])
            with tf.control_dependencies([sums.assign_add(update)]):
                out = xy(element) if xy is not None else element
                return tf.nest.map_structure(tf.identity, out)

        options = tf.data.Options()
        # Nothing may run ahead of the consumer here: tf.data would otherwise add a prefetch after this
        # synchronous map, and the meter would time that prefetch instead of the training step.
        options.experimental_optimization.inject_prefetch = False
        return tf.data.Dataset.zip(stamps, ds).map(record).with_options(options)

    def read(self) -> tuple[float, int, int, int, int]:
        wait, examples, tokens, padded, batches = (float(v) for v in self.sums.numpy())
        return wait, int(examples), int(tokens), int(padded), int(batches)


def _stats(element) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """(examples, tokens, padded tokens) of one batch, as runtime/pipelines/stats.py counts them."""
    if isinstance(element, dict) and "tokens" in element and "lengths" in element:
        shape = tf.shape(element["tokens"], out_type=tf.int64)
        examples = shape[0]
        padded = examples * (shape[1] if element["tokens"].shape.rank > 1 else 1)
        tokens = tf.reduce_sum(tf.cast(element["lengths"], tf.int64))
        return tf.cast(examples, tf.float64), tf.cast(tokens, tf.float64), tf.cast(padded, tf.float64)
    first = tf.nest.flatten(element)[0]
    examples = tf.shape(first, out_type=tf.int64)[0] if first.shape.rank else tf.constant(1, tf.int64)
    zero = tf.constant(0.0, tf.float64)
    return tf.cast(examples, tf.float64), zero, zero
