"""Parameters of the builtin pipelines, validated like the rest of the spec.

They live in specs/ (not runtime/) so a spec can be checked without importing
TensorFlow; runtime/pipelines/ builds the datasets from them. Every number is bounded
(far above what runs here) so that a typo is an error at `dsctl validate`, not an
overflow inside TensorFlow or a data generator that never ends.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from .schema import Strict

BIG = 10**9  # element, file and batch counts
SEED: dict[str, Any] = {"ge": -(2**63), "le": 2**63 - 1}  # TensorFlow seeds are int64


class SyntheticParams(Strict):
    """Elements {id, x} (and a label with label_classes); CPU cost and CPU-free latency per element are tunable."""

    elements: int = Field(4096, ge=1, le=BIG, description="elements per epoch")
    shards: int = Field(16, ge=1, le=BIG, description="units the dispatcher hands out under distributed_epoch")
    epochs: int | None = Field(1, ge=1, le=BIG, description="null repeats forever")
    feature_size: int = Field(64, ge=1, le=10**6)
    batch_size: int = Field(32, ge=1, le=10**6)
    cpu_work: int = Field(0, ge=0, le=10**4, description="CPU work per element, in 64x64 matmuls")
    latency_ms: float = Field(0.0, ge=0, le=60_000, description="per-element delay that uses no CPU (remote storage)")
    label_classes: int | None = Field(
        None, ge=2, le=10**6, description="add a label: the index of the largest of x's first label_classes values")

    @model_validator(mode="after")
    def _shards_fit(self) -> SyntheticParams:
        if self.shards > self.elements:
            raise ValueError(f"shards ({self.shards}) cannot exceed elements ({self.elements})")
        if self.label_classes is not None and self.label_classes > self.feature_size:
            raise ValueError(f"label_classes ({self.label_classes}) cannot exceed feature_size ({self.feature_size}): "
                             "the label is the index of the largest of x's first label_classes values")
        return self


class ImagesParams(Strict):
    """ResNet-style: JPEG TFRecords, decode, random crop, flip, batch; float32 images normalised per channel for the
    model; labels the model can learn (each class has its own colour and stripes)."""

    num_files: int = Field(8, ge=1, le=10**5)
    images_per_file: int = Field(64, ge=1, le=10**6)
    image_size: int = Field(80, ge=8, le=4096, description="stored JPEG side, pixels")
    num_classes: int = Field(10, ge=2, le=100_000, description="label classes; each has its own colour and stripes")
    crop_size: int = Field(64, ge=4, le=4096, description="random crop side, pixels")
    batch_size: int = Field(32, ge=1, le=10**6)
    epochs: int | None = Field(1, ge=1, le=BIG, description="null repeats forever")
    shuffle_buffer: int = Field(256, ge=0, le=BIG)
    seed: int = Field(0, **SEED)
    cache_dir: str | None = Field(None, description="where the TFRecords are generated; default under DSCTL_HOME")
    transfer_dtype: Literal["uint8", "float32"] = Field(
        "uint8", description="what workers send: uint8 pixels (the trainer converts them to float32 in [0, 1]), "
                             "or float32 converted on the worker (4x the bytes per batch)")

    @model_validator(mode="after")
    def _crop_fits(self) -> ImagesParams:
        if self.crop_size > self.image_size:
            raise ValueError(f"crop_size ({self.crop_size}) cannot exceed image_size ({self.image_size})")
        return self


class TextParams(Strict):
    """Variable-length token sequences from TFRecords, padded per batch or bucketed by length."""

    num_files: int = Field(8, ge=1, le=10**5)
    sequences_per_file: int = Field(256, ge=1, le=10**7)
    min_length: int = Field(8, ge=1, le=10**6)
    max_length: int = Field(512, ge=1, le=10**6)
    length_distribution: Literal["lognormal", "uniform"] = "lognormal"
    vocab_size: int = Field(32000, ge=2, le=2**31 - 1)
    num_classes: int = Field(4, ge=2, le=100_000, description="label classes; each has its own marker tokens")
    batch_size: int = Field(16, ge=1, le=10**6)
    epochs: int | None = Field(1, ge=1, le=BIG, description="null repeats forever")
    shuffle_buffer: int = Field(256, ge=0, le=BIG)
    seed: int = Field(0, **SEED)
    cache_dir: str | None = None

    @model_validator(mode="after")
    def _lengths(self) -> TextParams:
        if self.min_length > self.max_length:
            raise ValueError(f"min_length ({self.min_length}) cannot exceed max_length ({self.max_length})")
        if self.num_classes > self.vocab_size - 1:
            raise ValueError(f"num_classes ({self.num_classes}) cannot exceed vocab_size - 1 ({self.vocab_size - 1}): "
                             "each class needs a marker token of its own")
        return self


PARAMS_BY_BUILTIN: dict[str, type[BaseModel]] = {"synthetic": SyntheticParams, "images": ImagesParams, "text": TextParams}



def _builtin_params(builtin: str, params: dict) -> SyntheticParams | ImagesParams | TextParams:
    p = PARAMS_BY_BUILTIN[builtin].model_validate(params)
    assert isinstance(p, (SyntheticParams, ImagesParams, TextParams)), "PARAMS_BY_BUILTIN holds these three"
    return p


def examples_per_epoch(builtin: str, params: dict) -> int:
    """Elements in one epoch of a builtin (before batching), from its params alone."""
    p = _builtin_params(builtin, params)
    if isinstance(p, SyntheticParams):
        return p.elements
    return p.num_files * (p.images_per_file if isinstance(p, ImagesParams) else p.sequences_per_file)


def batches_per_pass(builtin: str, params: dict) -> int | None:
    """Batches one full pass over a builtin's dataset yields read alone (all its `epochs`; the last batch may be
    partial, as every builtin batches without drop_remainder); None when it repeats forever. Every builtin is
    `repeat(epochs).batch(batch_size)` over its elements (runtime/pipelines/), which this mirrors."""
    p = _builtin_params(builtin, params)
    if p.epochs is None:
        return None
    return -(-examples_per_epoch(builtin, params) * p.epochs // p.batch_size)
