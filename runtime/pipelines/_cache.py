"""Generate-once cache directories for the file-backed builtins (images, text).

A builtin's files live in `<root>/<kind>-<digest>/`, the digest covering every
parameter that decides their content (`dir_name`, importable without TensorFlow,
so the orchestrator can name the folder before a run).

Several trainers (separate processes) may build the same pipeline at the same
moment. Each writes into its own temporary directory beside the final one and
then renames it into place; rename is atomic on one filesystem, so the final
directory is either absent or complete. The loser of the race discards its copy
and uses the winner's: the content is deterministic in the params, so both are
equal. A manifest written last lists the files, so stray files never leak in.

The root may be a gs:// URL (runs on Google Cloud: dsctl uploads the folder,
manifest last, before the run; see provisioners/gcp/data.py). Such a folder is
only read, through TensorFlow's filesystem, never generated into.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from .errors import PipelineError

MANIFEST = "manifest.json"
FORMAT_VERSIONS = {"images": 2, "text": 2}  # 2: labels the model can learn
_GENERATION_FIELDS = {
    "images": ("num_files", "images_per_file", "image_size", "num_classes", "seed"),
    "text": ("num_files", "sequences_per_file", "min_length", "max_length", "length_distribution", "vocab_size",
             "num_classes", "seed"),
}


def digest(kind: str, params: dict) -> str:
    """Short stable hash of the parameters that determine the generated files."""
    text = json.dumps({"kind": kind, **params}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def generation_params(kind: str, p) -> dict:
    """The validated params (ImagesParams, TextParams) that decide the files' content."""
    return {"version": FORMAT_VERSIONS[kind], **{name: getattr(p, name) for name in _GENERATION_FIELDS[kind]}}


def dir_name(kind: str, p) -> str:
    return f"{kind}-{digest(kind, generation_params(kind, p))}"


def is_remote(path) -> bool:
    return str(path).startswith("gs://")


def cache_root(params_cache_dir: str | None, default) -> Path | str:
    """The spec's own `cache_dir` wins over the caller's default; a gs:// root stays a string."""
    root = params_cache_dir or default
    return str(root).rstrip("/") if is_remote(root) else Path(root).expanduser()


def location(kind: str, p, default_root) -> Path | str:
    """Where this builtin's files for these params live."""
    root = cache_root(p.cache_dir, default_root)
    return root / dir_name(kind, p) if isinstance(root, Path) else f"{root}/{dir_name(kind, p)}"


def read_manifest(final) -> dict:
    if is_remote(final):
        import tensorflow as tf

        with tf.io.gfile.GFile(f"{final}/{MANIFEST}", "r") as f:
            return json.loads(f.read())
    return json.loads((Path(final) / MANIFEST).read_text())


def data_files(final) -> list[str]:
    """Paths of the files the manifest lists."""
    return [f"{final}/{name}" for name in read_manifest(final)["files"]]


def materialize(final, write: Callable[[Path], list[str]], meta: dict):
    """Make sure `final` exists and is complete; `write(tmp_dir)` creates files and returns their names."""
    if is_remote(final):
        import tensorflow as tf

        if not tf.io.gfile.exists(f"{final}/{MANIFEST}"):
            raise PipelineError(
                f"The {meta.get('kind', 'pipeline')} data for these params is not in {final} (no {MANIFEST}). On Google "
                "Cloud, dsctl uploads it there before the run starts; start the run with `dsctl up`, or upload the "
                "folder dsctl generates locally for these params.")
        return final
    if final.exists():  # checked before the manifest: another writer's rename may land between two checks
        if (final / MANIFEST).is_file():
            return final
        raise PipelineError(
            f"The data cache directory {final} exists but has no {MANIFEST}, so it is incomplete or "
            "was not made by dsctl; delete it and run again to regenerate it."
        )
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    except OSError as exc:
        raise PipelineError(f"Cannot create the data cache under {final.parent}: {exc}. "
                            "Set params.cache_dir to a writable directory.") from exc
    try:
        files = write(tmp)
        (tmp / MANIFEST).write_text(json.dumps({**meta, "files": files}, indent=1, sort_keys=True))
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / MANIFEST).is_file():  # not a lost race: a real failure
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final
