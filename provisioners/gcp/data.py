"""The `images` and `text` builtins on Google Cloud: their TFRecords made once here, kept in Cloud Storage.

Locally these builtins generate their files into a cache on the trainer's disk. On Google
Cloud the tf.data service workers, on other VMs, must read the same files, so before the
run dsctl generates them on this machine (the same code, the same digest of their
parameters) and uploads the folder to gs://BUCKET/dsctl/data/<kind>-<digest>/, manifest
last. The trainers are started with that gs:// root as their cache; the dataset graph they
send names gs:// paths, which the workers read with TensorFlow's own GCS filesystem and
their service account. A later run with the same parameters finds the manifest and uploads
nothing. (A spec whose `pipeline.params.cache_dir` is a gs:// URL keeps its data there.)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from dsctl.specs import SpecError
from dsctl.specs.schema import JobSpec

from .errors import GcpError
from .storage import retry

PREFIX = "dsctl/data"


def root(spec: JobSpec, bucket: str) -> str | None:
    """The gs:// root the trainers use as their data cache; None for pipelines without data files."""
    from dsctl.runtime.pipelines import data_dir_name

    if not spec.pipeline.builtin or data_dir_name(spec.pipeline.builtin, spec.pipeline.params) is None:
        return None
    own = spec.pipeline.params.get("cache_dir")
    if own and not str(own).startswith("gs://"):
        raise SpecError(f"pipeline.params.cache_dir is a local path ({own}), which the workers on other VMs cannot read; "
                        "on provider gcp remove it (dsctl keeps the data in gs://BUCKET/dsctl/data/) or give a gs:// URL.",
                        field="pipeline.params.cache_dir")
    return str(own).rstrip("/") if own else f"gs://{bucket}/{PREFIX}"


def _split(url: str) -> tuple[str, str]:
    bucket, _, path = url.removeprefix("gs://").partition("/")
    return bucket, path


def stage(spec: JobSpec, storage_client, gs_root: str, local_cache: Path,
          log: Callable[[str], None] = lambda msg: None, threads: int = 8) -> int:
    """Make sure the builtin's files are under gs_root; returns the bytes uploaded (0 when already there)."""
    from dsctl.runtime.pipelines import PipelineError, data_dir_name, prepare_data

    builtin = spec.pipeline.builtin
    assert builtin is not None, "root() gives a gs_root only for a builtin with data files"
    name = data_dir_name(builtin, spec.pipeline.params)
    bucket_name, path = _split(f"{gs_root}/{name}")
    bucket = storage_client.bucket(bucket_name)
    if bucket.blob(f"{path}/manifest.json").exists():
        return 0
    log(f"generating the {spec.pipeline.builtin} data here, to upload once to {gs_root}/{name}/")
    params = {k: v for k, v in spec.pipeline.params.items() if k != "cache_dir"}
    try:
        made = prepare_data(builtin, params, cache_dir=local_cache)
    except PipelineError as exc:
        raise GcpError(f"could not generate the {spec.pipeline.builtin} data to upload: {exc}") from exc
    assert made is not None, "a builtin with a data folder name has data files"
    local = Path(made)
    files = json.loads((local / "manifest.json").read_text())["files"]

    def put(file: str) -> int:
        bucket.blob(f"{path}/{file}").upload_from_filename(str(local / file), retry=retry())
        return (local / file).stat().st_size

    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="dsctl-data") as pool:
        sent = sum(pool.map(put, files))
    bucket.blob(f"{path}/manifest.json").upload_from_filename(str(local / "manifest.json"), retry=retry())
    return sent
