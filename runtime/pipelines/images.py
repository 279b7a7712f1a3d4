"""`images`: a ResNet-style input pipeline over generated JPEG TFRecords.

Why it is built this way:
- The data is generated once per set of generation params into
  `<cache>/images-<hash>/` (see _cache.py for why concurrent builds are safe).
  Images are smooth seeded noise, so the JPEGs cost a realistic amount to decode,
  blended with their class's colour and stripes (`_class_pattern`): a label a small
  model learns in a few hundred steps, and that survives random crops and flips.
- The source is the list of file names (`from_tensor_slices`), so under
  distributed_epoch the dispatcher splits work by file, as real pipelines do.
- Augmentation uses stateless random ops seeded from `Dataset.random`, zipped in
  after the records are read. Stateful random ops (tf.image.random_crop) make
  the graph fail to serialize under ExternalStatePolicy.FAIL; this way the whole
  graph is plain data for remote workers, and crops still differ every epoch
  (rerandomize_each_iteration). Zipping `Dataset.random` does not add split RPCs
  under DYNAMIC sharding (checked: same time as without).
- Images travel as uint8 by default (`transfer_dtype`) and `finish()` converts them to
  float32 in [0, 1] on the trainer, after `distribute` (and at the same point in colocated
  mode): a float32 batch is 4x the bytes, and every byte is serialized, sent and copied
  again on the trainer, which costs more CPU than the conversion it saves there
  (benchmarks/bench_data_path.py measures both). `finish()` then normalises each channel
  with ImageNet's mean and standard deviation (ResNet-style), in the same map.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tensorflow as tf

from dsctl.runtime.autocache import autocache
from dsctl.specs.pipelines import ImagesParams

from . import _cache

MEAN = (0.485, 0.456, 0.406)  # ImageNet's per-channel mean and standard deviation, of pixels in [0, 1]
STD = (0.229, 0.224, 0.225)
_FEATURES = {
    "image/encoded": tf.io.FixedLenFeature([], tf.string),
    "image/class/label": tf.io.FixedLenFeature([], tf.int64),
}


def _smooth_noise(rng: np.random.Generator, n: int, size: int) -> np.ndarray:
    """uint8 [n, size, size, 3]: coarse noise upsampled (blobs) plus a little fine grain."""
    coarse = max(2, size // 8)
    low = rng.uniform(0, 255, size=(n, coarse, coarse, 3)).astype(np.float32)
    smooth = tf.image.resize(low, [size, size], method="bicubic").numpy()
    grain = rng.normal(0, 8, size=smooth.shape).astype(np.float32)
    return np.clip(smooth + grain, 0, 255).astype(np.uint8)


def _class_pattern(label: int, size: int, seed: int) -> np.ndarray:
    """float32 [size, size, 3] in [0, 255]: the class's own colour, striped at its own period and direction."""
    rng = np.random.default_rng([seed, 1_000_003, label])
    colour = rng.uniform(0, 255, size=3).astype(np.float32)
    period = 3 + label % 7
    coords = np.arange(size, dtype=np.float32)
    wave = 0.75 + 0.25 * np.sin(2 * np.pi * coords / period)
    stripes = wave[:, None] if (label // 7) % 2 else wave[None, :]  # horizontal or vertical; flips keep both
    return colour[None, None, :] * np.broadcast_to(stripes, (size, size))[:, :, None]


def _write_files(p: ImagesParams):
    def write(tmp: Path) -> list[str]:
        names = []
        for f in range(p.num_files):
            rng = np.random.default_rng([p.seed, f])
            pixels = _smooth_noise(rng, p.images_per_file, p.image_size)
            labels = rng.integers(0, p.num_classes, size=p.images_per_file)
            patterns = np.stack([_class_pattern(int(c), p.image_size, p.seed) for c in labels])
            pixels = np.clip(0.5 * pixels + 0.5 * patterns, 0, 255).astype(np.uint8)
            name = f"images-{f:05d}-of-{p.num_files:05d}.tfrecord"
            with tf.io.TFRecordWriter(str(tmp / name)) as out:
                for img, label in zip(pixels, labels):
                    jpeg = tf.io.encode_jpeg(img, quality=90).numpy()
                    example = tf.train.Example(features=tf.train.Features(feature={
                        "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[jpeg])),
                        "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)])),
                    }))
                    out.write(example.SerializeToString())
            names.append(name)
        return names

    return write


def prepare(p: ImagesParams, cache_dir):
    """Generate the TFRecords if needed (or find them under a gs:// cache_dir); returns their directory."""
    final = _cache.location("images", p, cache_dir)
    meta = {"kind": "images", "params": _cache.generation_params("images", p)}
    return _cache.materialize(final, _write_files(p), meta)


def _decode(record: tf.Tensor) -> dict:
    """Parse and decode: deterministic, so the `decoded` autocache hint may cache its result."""
    ex = tf.io.parse_single_example(record, _FEATURES)
    return {"image": tf.io.decode_jpeg(ex["image/encoded"], channels=3), "label": ex["image/class/label"]}


def _augment(crop: int, to_float: bool):
    def fn(decoded: dict, rand: tf.Tensor) -> dict:
        image = decoded["image"]
        image = tf.image.stateless_random_crop(image, [crop, crop, 3], seed=tf.stack([rand, tf.constant(0, tf.int64)]))
        image = tf.image.stateless_random_flip_left_right(image, seed=tf.stack([rand, tf.constant(1, tf.int64)]))
        if to_float:
            image = tf.image.convert_image_dtype(image, tf.float32)  # [0, 1]
        return {"image": image, "label": decoded["label"]}

    return fn


def _finish_batch(batch: dict) -> dict:
    """uint8 -> float32 in [0, 1] (the same elementwise op as the float32 path, so the same values; a no-op on
    float32), then each channel normalised: (x - mean) / std."""
    image = tf.image.convert_image_dtype(batch["image"], tf.float32)
    return {**batch, "image": (image - tf.constant(MEAN)) / tf.constant(STD)}


def finish(ds: tf.data.Dataset, p: ImagesParams) -> tf.data.Dataset:
    """The trainer's part of the pipeline: normalised float32 images from what `build` sent (uint8 or float32)."""
    return ds.map(_finish_batch, num_parallel_calls=tf.data.AUTOTUNE)


def build(p: ImagesParams, cache_dir) -> tf.data.Dataset:
    """The part of the pipeline that workers run; its images are `p.transfer_dtype` (see `finish`)."""
    directory = prepare(p, cache_dir)
    files = _cache.data_files(directory)
    ds = tf.data.Dataset.from_tensor_slices(files)
    ds = ds.shuffle(len(files), seed=p.seed)
    ds = ds.interleave(
        tf.data.TFRecordDataset,
        cycle_length=min(len(files), 8),
        num_parallel_calls=tf.data.AUTOTUNE,
    )
    ds = autocache(ds, "source")  # after reading: serialized records
    ds = ds.map(_decode, num_parallel_calls=tf.data.AUTOTUNE)
    ds = autocache(ds, "decoded")  # after the deterministic decode, before random crops and flips
    ds = tf.data.Dataset.zip(ds, tf.data.Dataset.random(seed=p.seed, rerandomize_each_iteration=True))
    ds = ds.map(_augment(p.crop_size, p.transfer_dtype == "float32"), num_parallel_calls=tf.data.AUTOTUNE)
    if p.shuffle_buffer > 0:
        ds = ds.shuffle(p.shuffle_buffer, seed=p.seed + 1)
    ds = ds.repeat() if p.epochs is None else ds.repeat(p.epochs)
    return ds.batch(p.batch_size).prefetch(tf.data.AUTOTUNE)
