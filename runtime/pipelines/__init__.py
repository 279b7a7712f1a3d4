"""Builtin input pipelines (synthetic, images, text), user entrypoints, and per-batch stats.

Everything here builds tf.data graphs that tf.data service can serialize and
run on remote workers: no py_function, no stateful random ops.
TensorFlow is imported lazily, on the first build, so `PipelineError` and
`batch_stats` are cheap to import from the CLI or the orchestrator.

    build_dataset(builtin, params, *, cache_dir, bucketing=None) -> batched tf.data.Dataset
    prepare_data(builtin, params, *, cache_dir) -> Path | None   (generate files only)
    data_dir_name(builtin, params) -> str | None   (the folder the files live in, without TensorFlow)
    load_entrypoint_dataset(entrypoint, params, base_dir) -> tf.data.Dataset
    is_infinite(ds) -> bool
    batch_stats(batch) -> {"examples", "tokens", "padded_tokens"}
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import TYPE_CHECKING, cast

import pydantic

from dsctl.specs.pipelines import PARAMS_BY_BUILTIN

from .errors import PipelineError
from .stats import batch_stats

if TYPE_CHECKING:
    import tensorflow as tf

    from dsctl.specs.pipelines import ImagesParams, SyntheticParams, TextParams

__all__ = [
    "PipelineError",
    "batch_stats",
    "build_dataset",
    "data_dir_name",
    "is_infinite",
    "load_entrypoint_dataset",
    "prepare_data",
    "validate_params",
]


def validate_params(builtin: str, params: dict | None) -> pydantic.BaseModel:
    """The validated params model for `builtin`; PipelineError on an unknown builtin or bad params."""
    model = PARAMS_BY_BUILTIN.get(builtin)
    if model is None:
        close = difflib.get_close_matches(str(builtin), list(PARAMS_BY_BUILTIN), n=1, cutoff=0.5)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        raise PipelineError(
            f"Unknown builtin pipeline {builtin!r}.{hint} Builtins are: {', '.join(PARAMS_BY_BUILTIN)}."
        )
    try:
        return model.model_validate(params or {})
    except pydantic.ValidationError as exc:
        errors = exc.errors(include_url=False)
        first = errors[0]
        where = ".".join(str(p) for p in first["loc"]) or "params"
        more = f" ({len(errors) - 1} more after this one.)" if len(errors) > 1 else ""
        raise PipelineError(f"Bad params for the '{builtin}' pipeline: {where}: {first['msg']}.{more}") from exc


def _check_bucketing(bucketing) -> tuple[list[int], int]:
    try:
        boundaries, num_consumers = bucketing
        boundaries = [int(b) for b in boundaries]
        num_consumers = int(num_consumers)
    except (TypeError, ValueError) as exc:
        raise PipelineError(f"bucketing must be (bucket_boundaries, num_consumers), got {bucketing!r}.") from exc
    if not boundaries or any(b <= 0 for b in boundaries) or any(b <= a for a, b in zip(boundaries, boundaries[1:])):
        raise PipelineError(f"Bucket boundaries must be positive and strictly increasing, got {boundaries}.")
    if num_consumers < 1:
        raise PipelineError(f"num_consumers must be at least 1, got {num_consumers}.")
    return boundaries, num_consumers


def data_dir_name(builtin: str, params: dict) -> str | None:
    """The folder name ('images-<digest>') of a file-backed builtin's data; None for synthetic. No TensorFlow."""
    from . import _cache

    p = validate_params(builtin, params)
    return _cache.dir_name(builtin, p) if builtin in _cache.FORMAT_VERSIONS else None


def prepare_data(builtin: str, params: dict, *, cache_dir: Path) -> Path | None:
    """Generate a file-backed builtin's TFRecords (idempotent, safe concurrently); None for synthetic.

    Workers read the files by the paths the trainer's graph names, so a deployment
    whose workers do not share this filesystem must run this on each worker machine
    with the same cache_dir first.
    """
    p = validate_params(builtin, params)  # the params model of `builtin` (PARAMS_BY_BUILTIN)
    if builtin == "images":
        from . import images
        return images.prepare(cast("ImagesParams", p), cache_dir)
    if builtin == "text":
        from . import text
        return text.prepare(cast("TextParams", p), cache_dir)
    return None


def build_dataset(
    builtin: str,
    params: dict,
    *,
    cache_dir: Path | str,
    bucketing: tuple[list[int], int] | None = None,
) -> tf.data.Dataset:
    """The batched dataset of a builtin pipeline ("synthetic" | "images" | "text").

    `params` is the spec's pipeline.params (validated again here); a `cache_dir`
    inside params overrides the `cache_dir` argument. `bucketing` =
    (bucket_boundaries, num_consumers) turns on the coordinated-reads batching of
    the text pipeline and is an error for the others.
    """
    p = validate_params(builtin, params)  # the params model of `builtin` (PARAMS_BY_BUILTIN)
    if bucketing is not None and builtin != "text":
        raise PipelineError(
            f"Length bucketing for coordinated reads applies only to the 'text' pipeline, not '{builtin}'."
        )
    if builtin == "synthetic":
        from . import synthetic
        return synthetic.build(cast("SyntheticParams", p))
    if builtin == "images":
        from . import images
        return images.build(cast("ImagesParams", p), cache_dir)
    from . import text
    return text.build(cast("TextParams", p), cache_dir, None if bucketing is None else _check_bucketing(bucketing))


def load_entrypoint_dataset(entrypoint: str, params: dict, base_dir: Path) -> tf.data.Dataset:
    """Import 'package.module:function' (base_dir first on sys.path), call it with **params, check the result."""
    from .entrypoint import load_entrypoint_dataset as load
    return load(entrypoint, params or {}, Path(base_dir))


def is_infinite(ds: tf.data.Dataset) -> bool:
    """True when TensorFlow can tell the dataset never ends (needed by coordinated reads and the cross-trainer cache).

    Unknown cardinality (e.g. after filter) counts as not infinite.
    """
    import tensorflow as tf
    return int(ds.cardinality()) == int(tf.data.INFINITE_CARDINALITY)
