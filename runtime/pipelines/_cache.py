"""Generate-once cache directories for the file-backed builtins (images, text).

Several trainers (separate processes) may build the same pipeline at the same
moment. Each writes into its own temporary directory beside the final one and
then renames it into place; rename is atomic on one filesystem, so the final
directory is either absent or complete. The loser of the race discards its copy
and uses the winner's: the content is deterministic in the params, so both are
equal. A manifest written last lists the files, so stray files never leak in.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from .errors import PipelineError

MANIFEST = "manifest.json"


def digest(kind: str, params: dict) -> str:
    """Short stable hash of the parameters that determine the generated files."""
    text = json.dumps({"kind": kind, **params}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def cache_root(params_cache_dir: str | None, default: Path) -> Path:
    """The spec's own `cache_dir` wins over the caller's default."""
    return Path(params_cache_dir).expanduser() if params_cache_dir else Path(default)


def read_manifest(final: Path) -> dict:
    return json.loads((final / MANIFEST).read_text())


def materialize(final: Path, write: Callable[[Path], list[str]], meta: dict) -> Path:
    """Make sure `final` exists and is complete; `write(tmp_dir)` creates files and returns their names."""
    if (final / MANIFEST).is_file():
        return final
    if final.exists():
        raise PipelineError(
            f"The data cache directory {final} exists but has no {MANIFEST}, so it is incomplete or "
            "was not made by dsctl; delete it and run again to regenerate it."
        )
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    except OSError as exc:
        raise PipelineError(f"Cannot create the data cache under {final.parent}: {exc}. Set params.cache_dir to a writable directory.") from exc
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
