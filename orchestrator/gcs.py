"""Cloud Storage for the few gs:// paths a spec names itself (checkpoints, TensorBoard event files).

The provider's own buckets go through provisioners/gcp; these are user paths, reached with the
default credentials (on a dispatcher VM: its service account), or anonymously against a
Cloud Storage emulator when STORAGE_EMULATOR_HOST is set, as the gcp provider does.
"""

from __future__ import annotations

import os
from pathlib import Path


def split(url: str) -> tuple[str, str]:
    """gs://bucket/some/prefix -> ('bucket', 'some/prefix')."""
    bucket, _, prefix = url[len("gs://"):].partition("/")
    return bucket, prefix.strip("/")


def _client():
    from google.cloud import storage

    project = os.environ.get("GOOGLE_CLOUD_PROJECT")
    if os.environ.get("STORAGE_EMULATOR_HOST"):
        from google.auth.credentials import AnonymousCredentials

        return storage.Client(project=project or "dsctl-local", credentials=AnonymousCredentials())
    return storage.Client(project=project)


def read(url: str) -> bytes | None:
    """The object's bytes, or None if there is none."""
    from google.api_core.exceptions import NotFound

    bucket, name = split(url)
    try:
        return _client().bucket(bucket).blob(name).download_as_bytes(timeout=30)
    except NotFound:
        return None


def upload(path: Path, url: str) -> None:
    bucket, name = split(url)
    _client().bucket(bucket).blob(name).upload_from_filename(str(path), timeout=60)
