"""A wheelhouse per VM kind: every wheel the VMs install, downloaded once here, staged once in Cloud Storage.

At 640 workers, 640 VMs must not each download TensorFlow from PyPI (and a VM inside a
VPC with only Private Google Access cannot). So the user's machine downloads the wheels
once, for the VMs' Python and platform rather than its own (`pip download --python-version
--platform --only-binary=:all:`), into a content-addressed cache; `stage()` uploads them
once to gs://BUCKET/dsctl/wheelhouses/<digest>/, manifest last; the VMs' startup script
installs from there with `pip --no-index`. pip itself is in the wheelhouse too: the VMs run
it from its wheel, so the image needs neither pip nor ensurepip.

The digest covers everything that decides the contents (Python version, glibc, architecture,
requirements), so a later run with the same software finds the wheelhouse here and in the
bucket and transfers nothing. Wheelhouses are a cache shared by runs: `dsctl down` leaves them.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .errors import GcpError
from .software import KindSoftware
from .storage import retry
from .wheel import RUNTIME_REQUIREMENTS, SUPERVISOR_REQUIREMENTS

FORMAT = 1
MANIFEST = "MANIFEST.json"
PREFIX = "dsctl/wheelhouses/"
OLDEST_MANYLINUX = 17  # manylinux2014 == manylinux_2_17


@dataclass(frozen=True)
class Recipe:
    """What a wheelhouse holds: requirements resolved for one Python on one platform."""

    python_version: str  # "3.11"
    glibc: str  # "2.36": newest manylinux tag accepted
    requirements: tuple[str, ...]
    arch: str = "x86_64"

    @classmethod
    def for_kind(cls, kind: KindSoftware, supervisor: bool = False) -> Recipe:
        """The wheels VMs of this kind install (its TensorFlow wheel, jax's TPU wheels on a JAX TPU VM, dsctl's
        dependencies, pip); with `supervisor`, also what the dispatcher VM's run supervisor needs (the wheel's
        supervisor extra: the other VMs of the kind install without it)."""
        reqs = kind.requirements + RUNTIME_REQUIREMENTS
        reqs += SUPERVISOR_REQUIREMENTS if supervisor else ()
        return cls(kind.python_version, kind.glibc, reqs + ("pip",))

    @property
    def digest(self) -> str:
        text = json.dumps({"format": FORMAT, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def platforms(self) -> list[str]:
        newest = int(self.glibc.split(".")[1])
        return [f"manylinux2014_{self.arch}"] + [f"manylinux_2_{m}_{self.arch}"
                                                 for m in range(OLDEST_MANYLINUX, newest + 1)]

    def pip_download_args(self, dest: Path) -> list[str]:
        py = self.python_version.replace(".", "")
        args = ["download", "--only-binary=:all:", "--python-version", self.python_version,
                "--implementation", "cp", "--abi", f"cp{py}", "--abi", "abi3", "--abi", "none",
                "--dest", str(dest), "--progress-bar", "off", "--disable-pip-version-check"]
        for platform in self.platforms():
            args += ["--platform", platform]
        return args + list(self.requirements)


@dataclass(frozen=True)
class Wheelhouse:
    """A built wheelhouse on this machine."""

    recipe: Recipe
    dir: Path
    files: tuple[dict, ...]  # {"name", "sha256", "size"}

    @property
    def digest(self) -> str:
        return self.recipe.digest

    @property
    def size(self) -> int:
        return sum(f["size"] for f in self.files)

    @property
    def prefix(self) -> str:
        """Its folder in the staging bucket."""
        return f"{PREFIX}{self.digest}/"


def cache_root() -> Path:
    """Where wheelhouses are kept on this machine (DSCTL_WHEELHOUSE_CACHE, else the user cache)."""
    env = os.environ.get("DSCTL_WHEELHOUSE_CACHE")
    base = Path(env) if env else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dsctl" / "wheelhouses"
    return base


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _load(recipe: Recipe, final: Path) -> Wheelhouse:
    manifest = json.loads((final / MANIFEST).read_text())
    return Wheelhouse(recipe, final, tuple(manifest["files"]))


def build(recipe: Recipe, root: Path | None = None, log: Callable[[str], None] = lambda msg: None) -> Wheelhouse:
    """The wheelhouse for `recipe`: from the cache, or downloaded now (atomically, safe when two runs race)."""
    root = Path(root or cache_root())
    final = root / recipe.digest
    if (final / MANIFEST).is_file():
        return _load(recipe, final)
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{recipe.digest}.tmp-", dir=root))
    try:
        log(f"downloading the VMs' wheels for Python {recipe.python_version} ({', '.join(recipe.requirements[:1])} ...)")
        proc = subprocess.run([sys.executable, "-m", "pip", *recipe.pip_download_args(tmp)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            tail = " ".join((proc.stderr or proc.stdout).strip().splitlines()[-4:])
            raise GcpError(
                f"pip could not download the wheels the VMs need ({', '.join(recipe.requirements)}) for Python "
                f"{recipe.python_version} on manylinux {recipe.arch} (glibc {recipe.glibc}): {tail[-600:]}. dsctl "
                "builds this wheelhouse on this machine once and stages it in Cloud Storage, so the VMs need no "
                "PyPI; this machine must reach your package index.")
        files: list[dict[str, Any]] = [{"name": p.name, "sha256": _sha256(p), "size": p.stat().st_size}
                                       for p in sorted(tmp.iterdir()) if p.suffix == ".whl"]
        if not any(f["name"].startswith("pip-") for f in files):
            raise GcpError("the wheelhouse has no pip wheel; the VMs install with pip run from its wheel.")
        (tmp / MANIFEST).write_text(json.dumps({"recipe": asdict(recipe), "files": files}, indent=1))
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / MANIFEST).is_file():  # not a lost race
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return _load(recipe, final)


def stage(storage_client, bucket: str, wheelhouse: Wheelhouse, log: Callable[[str], None] = lambda msg: None,
          threads: int = 8) -> int:
    """Upload the wheelhouse to gs://bucket/<prefix> unless it is there already; returns bytes uploaded.

    The manifest goes last, so a wheelhouse with a manifest in the bucket is complete.
    """
    b = storage_client.bucket(bucket)
    if b.blob(wheelhouse.prefix + MANIFEST).exists():
        return 0
    log(f"uploading the wheelhouse ({wheelhouse.size / 1e6:.0f} MB, once) to gs://{bucket}/{wheelhouse.prefix}")

    def put(f: dict) -> int:
        b.blob(wheelhouse.prefix + f["name"]).upload_from_filename(str(wheelhouse.dir / f["name"]), retry=retry())
        return f["size"]

    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="dsctl-upload") as pool:
        sent = sum(pool.map(put, wheelhouse.files))
    b.blob(wheelhouse.prefix + MANIFEST).upload_from_filename(str(wheelhouse.dir / MANIFEST), retry=retry())
    return sent
