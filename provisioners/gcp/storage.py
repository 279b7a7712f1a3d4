"""Cloud Storage: stage what the VMs need, and keep what the run produced.

Objects live under gs://<bucket>/dsctl/runs/<run>/:
  staging/dsctl-<version>.whl   the dsctl wheel of this version (installed by the startup script)
  staging/spec.json             the job spec, for the trainers
  staging/code.tar.gz           the spec's folder (the user's pipeline and model code, or program), if the spec uses
                                it, less what its .dsctlignore leaves out (ignore.py); at most CODE_LIMIT_BYTES
  results/...                   metrics and logs collected at the end of the run
  heartbeat                     rewritten every few seconds by the run's supervisor (heartbeat.py); every VM of the
                                run deletes itself once it stops changing (watchdog.py)
Staging objects are deleted with the run; results are kept. Caches shared by runs live beside
them: dsctl/wheelhouses/<digest>/ (wheelhouse.py) and dsctl/data/<kind>-<digest>/ (data.py).

The bucket is created (in the zone's region) with uniform bucket-level access; the VMs' accounts
are given what they do there on the bucket itself (accounts.py).
"""

from __future__ import annotations

import io
import json
import os
import tarfile
import time
from collections.abc import Sequence
from pathlib import Path

from dsctl.specs import SpecError

from .clients import Clients
from .errors import GcpError, from_api_error
from .ignore import FILE as IGNORE_FILE
from .ignore import Ignore

CODE_LIMIT_BYTES = 100 * 2**20


def retry():
    """The client library's retry for Cloud Storage calls, which retries 408, 429, 5xx and dropped connections with
    backoff (google.cloud.storage.retry.DEFAULT_RETRY): passed to every upload too, which the library does not retry by
    default (an upload is not idempotent in general; dsctl's each write the same bytes to a name of its own, so a
    repeated one changes nothing)."""
    from google.cloud.storage.retry import DEFAULT_RETRY

    return DEFAULT_RETRY
SKIP_DIRS = {"__pycache__", "node_modules", ".git", ".venv", "venv", ".tox", ".mypy_cache", ".pytest_cache"}


def run_prefix(run_id: str) -> str:
    return f"dsctl/runs/{run_id}/"


def heartbeat_object(run_id: str) -> str:
    return run_prefix(run_id) + "heartbeat"


def code_files(base_dir: Path, exclude: Sequence[Path] = ()) -> list[tuple[str, Path, int]]:
    """(name in the archive, file, size) of each file trainers get from the spec's folder: regular files only, none
    hidden, none in cache folders, virtualenvs or `exclude` (the dsctl home), none left out by its .dsctlignore."""
    base_dir = Path(base_dir).resolve()
    excluded = [Path(e).resolve() for e in exclude]
    ignore = Ignore.of_folder(base_dir)
    out = []
    for root, dirs, files in os.walk(base_dir, followlinks=False):
        root_p = Path(root)
        rel_root = root_p.relative_to(base_dir).as_posix()
        prefix = "" if rel_root == "." else rel_root + "/"
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIP_DIRS
                         and not (root_p / d / "pyvenv.cfg").exists() and not (root_p / d).is_symlink()
                         and (root_p / d).resolve() not in excluded and not ignore.ignored(prefix + d, is_dir=True))
        for name in sorted(files):
            path = root_p / name
            if name.startswith(".") or path.is_symlink() or not path.is_file() or name.endswith(".pyc") \
                    or ignore.ignored(prefix + name, is_dir=False):
                continue
            out.append((prefix + name, path, path.stat().st_size))
    return out


def _mb(n: int) -> str:
    return f"{n / 2**20:.1f} MB"


def _too_big(base_dir: Path, files: list[tuple[str, Path, int]], total: int) -> SpecError:
    """The limit's error: how big the folder is and its largest entries (its top-level files and folders), so the
    user knows what to leave out."""
    entries: dict[str, int] = {}
    for name, _, size in files:
        top, sep, _ = name.partition("/")
        entries[top + sep] = entries.get(top + sep, 0) + size
    largest = sorted(entries.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
    listed = ", ".join(f"{name} ({_mb(size)})" for name, size in largest)
    return SpecError(
        f"the spec's folder {base_dir} holds {_mb(total)} in {len(files):,} files for the trainers, more than the "
        f"{CODE_LIMIT_BYTES // 2**20} MB limit: on Google Cloud each trainer VM gets a copy of it (your code). "
        f"Largest: {listed}. Leave files out with a {IGNORE_FILE} file in that folder, one pattern per line as in "
        ".gitignore (e.g. `*.ckpt`, `data/`), and read large data from Cloud Storage instead.")


def check_code_size(base_dir: Path, exclude: Sequence[Path] = ()) -> list[tuple[str, Path, int]]:
    """The files code_files() lists, or SpecError when together they are over CODE_LIMIT_BYTES: asked before any
    VM is created (the provider's check) and again when the archive is made."""
    files = code_files(base_dir, exclude)
    total = sum(size for _, _, size in files)
    if total > CODE_LIMIT_BYTES:
        raise _too_big(Path(base_dir).resolve(), files, total)
    return files


def code_archive(base_dir: Path, exclude: Sequence[Path] = ()) -> bytes:
    """tar.gz of the spec's folder as code_files() lists it; SpecError when it is over CODE_LIMIT_BYTES."""
    files = check_code_size(base_dir, exclude)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, path, _ in files:
            tar.add(path, arcname=name, recursive=False)
    return buf.getvalue()


class Staging:
    def __init__(self, clients: Clients, run_id: str):
        self.clients = clients
        self.run_id = run_id
        self.bucket_name = clients.settings.bucket
        self.prefix = run_prefix(run_id)

    @property
    def staging_prefix(self) -> str:
        return self.prefix + "staging/"

    def _bucket(self):
        return self.clients.storage.bucket(self.bucket_name)

    def ensure_bucket(self) -> None:
        from google.api_core import exceptions as gx

        storage = self.clients.storage
        try:
            if storage.lookup_bucket(self.bucket_name) is None:
                bucket = storage.bucket(self.bucket_name)
                bucket.iam_configuration.uniform_bucket_level_access_enabled = True
                storage.create_bucket(bucket, location=self.clients.settings.region)
        except gx.Conflict:
            pass  # created meanwhile, or exists in another project: the upload will tell
        except gx.GoogleAPICallError as exc:
            raise from_api_error(exc, doing=f"preparing the staging bucket gs://{self.bucket_name}") from exc

    def upload(self, name: str, data: bytes | Path) -> str:
        """Upload to staging/<name>; returns the object name relative to the staging prefix."""
        from google.api_core import exceptions as gx

        blob = self._bucket().blob(self.staging_prefix + name)
        try:
            if isinstance(data, Path):
                blob.upload_from_filename(str(data), retry=retry())
            else:
                blob.upload_from_string(data, retry=retry())
        except gx.GoogleAPICallError as exc:
            raise from_api_error(exc, doing=f"uploading {name} to gs://{self.bucket_name}/{self.staging_prefix}") from exc
        return name

    def url(self, name: str) -> str:
        return f"gs://{self.bucket_name}/{self.staging_prefix}{name}"

    def collect(self, run_dir: Path) -> list[str]:
        """Keep the run's results under results/: each metrics file, and the logs as one logs.tar.gz."""
        bucket = self._bucket()
        run_dir = Path(run_dir)
        names = []
        metrics = run_dir / "metrics"
        if metrics.is_dir():
            for path in sorted(metrics.rglob("*")):
                if path.is_file():
                    name = f"{self.prefix}results/{path.relative_to(run_dir).as_posix()}"
                    bucket.blob(name).upload_from_filename(str(path), retry=retry())
                    names.append(name)
        logs = run_dir / "logs"
        if logs.is_dir() and any(logs.iterdir()):
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w:gz") as tar:
                tar.add(logs, arcname="logs")
            name = f"{self.prefix}results/logs.tar.gz"
            bucket.blob(name).upload_from_string(buf.getvalue(), retry=retry())
            names.append(name)
        return names

    def delete_staging(self) -> list[str]:
        """Delete the run's staging objects; returns the names still there (deletion is checked by listing)."""
        bucket = self._bucket()
        for blob in list(self.clients.storage.list_blobs(self.bucket_name, prefix=self.staging_prefix)):
            try:
                bucket.delete_blob(blob.name)
            except Exception:
                pass
        return [b.name for b in self.clients.storage.list_blobs(self.bucket_name, prefix=self.staging_prefix)]


class HeartbeatObject:
    """The run's heartbeat: its generation changes at each write, which is all a watchdog compares (never clocks)."""

    def __init__(self, storage_client, bucket: str, run_id: str):
        self.blob = storage_client.bucket(bucket).blob(heartbeat_object(run_id))

    def beat(self, count: int) -> None:
        self.blob.upload_from_string(json.dumps({"beat": count, "at": time.time()}), content_type="application/json",
                                     retry=retry())

    def generation(self) -> int | None:
        """The object's generation now (None while there is none): a new one at every beat."""
        self.blob.reload()  # NotFound when absent
        return self.blob.generation


class RunObjects:
    """One run's record objects, gs://<bucket>/dsctl/runs/<run>/record/<name> (orchestrator/cloudrecord.py)."""

    def __init__(self, storage_client, bucket: str, run_id: str):
        self.client = storage_client
        self.bucket = storage_client.bucket(bucket)
        self.prefix = run_prefix(run_id) + "record/"

    def put(self, name: str, data: bytes) -> None:
        self.bucket.blob(self.prefix + name).upload_from_string(data, retry=retry())

    def get(self, name: str) -> bytes | None:
        from google.api_core import exceptions as gx

        try:
            return self.bucket.blob(self.prefix + name).download_as_bytes()
        except gx.NotFound:
            return None

    def names(self, prefix: str = "") -> list[str]:
        from google.api_core import exceptions as gx

        try:
            return [b.name[len(self.prefix):] for b in self.client.list_blobs(self.bucket.name, prefix=self.prefix + prefix)]
        except gx.NotFound:
            return []


__all__ = ["GcpError", "HeartbeatObject", "RunObjects", "Staging", "check_code_size", "code_archive", "code_files", "run_prefix"]
