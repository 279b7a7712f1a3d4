"""Cloud Storage for the few gs:// paths a spec names itself (checkpoints, TensorBoard event files).

The provider's own buckets go through provisioners/gcp; these are user paths, reached with the
default credentials (on a dispatcher VM: its service account), at STORAGE_EMULATOR_HOST where it
is set, as the gcp provider does.
"""

from __future__ import annotations

import os
from pathlib import Path


def split(url: str) -> tuple[str, str]:
    """gs://bucket/some/prefix -> ('bucket', 'some/prefix')."""
    bucket, _, prefix = url[len("gs://"):].partition("/")
    return bucket, prefix.strip("/")


def _client():
    """A client with Application Default Credentials (also at STORAGE_EMULATOR_HOST, a private endpoint or a test's
    stand-in); anonymous there only where there are no credentials at all."""
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError
    from google.cloud import storage

    project = os.environ.get("GOOGLE_CLOUD_PROJECT")
    try:
        credentials, found = google.auth.default()
    except DefaultCredentialsError:
        if not os.environ.get("STORAGE_EMULATOR_HOST"):
            raise
        from google.auth.credentials import AnonymousCredentials

        credentials, found = AnonymousCredentials(), None
    return storage.Client(project=project or found or "dsctl-local", credentials=credentials)


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
    from google.cloud.storage.retry import DEFAULT_RETRY

    # The same bytes to the same name: a repeated upload changes nothing, so it is retried as reads are.
    _client().bucket(bucket).blob(name).upload_from_filename(str(path), timeout=60, retry=DEFAULT_RETRY)
