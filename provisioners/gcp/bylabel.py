"""Find and remove a run's resources by label, with no local state (`dsctl down RUN` after a lost run dir).

Instances and TPU VMs are found by the label dsctl-run=<run>; the firewall rules
and TPU queued resources (which have no labels) by the names derived from the run
id; the staging objects by the run's prefix in the staging bucket (default
<project>-dsctl). Deletion is parallel and confirmed, as for a normal `down`. A run
supervised on the cloud publishes its record in that bucket too, found by its id.

Where to look comes from the command line (--project, --zone, --bucket), else the
environment (GOOGLE_CLOUD_PROJECT or CLOUDSDK_CORE_PROJECT, or the project of Application
Default Credentials; CLOUDSDK_COMPUTE_ZONE).
"""

from __future__ import annotations

import os
from collections.abc import Callable

from dsctl.specs import SpecError

from ..contract import Where
from .clients import Clients
from .errors import GcpError
from .resources import Fleet, Found
from .settings import GcpSettings, adc_project, check_credentials
from .storage import RunObjects, Staging


def looks_there(where: Where) -> bool:
    """Whether the command line or the environment names a project or zone to look in."""
    return bool(where.get("project") or where.get("zone") or os.environ.get("GOOGLE_CLOUD_PROJECT")
                or os.environ.get("CLOUDSDK_COMPUTE_ZONE"))


def _project(project: str | None) -> str | None:
    return project or os.environ.get("GOOGLE_CLOUD_PROJECT") or os.environ.get("CLOUDSDK_CORE_PROJECT") or (
        None if os.environ.get("DSCTL_GCE_ENDPOINT") else adc_project())


def _settings(project: str, zone: str, bucket: str | None) -> GcpSettings:
    settings = GcpSettings(project=project, zone=zone, bucket=bucket or f"{project}-dsctl").with_env_endpoints()
    check_credentials(settings)
    return settings


def _fleet(project: str, zone: str, run_id: str, log: Callable[[str], None] | None, bucket: str | None = None) -> Fleet:
    return Fleet(Clients(_settings(project, zone, bucket)), run_id, log=log)


def find_by_label(project: str, zone: str, run_id: str) -> Found:
    """What exists of run `run_id` in project/zone: VMs and TPU VMs (name -> status) and its firewall rule."""
    return _fleet(project, zone, run_id, None).find()


def down_by_label(project: str, zone: str, run_id: str, log: Callable[[str], None] | None = None,
                  bucket: str | None = None) -> Found:
    """Delete everything of run `run_id` found by label (and its firewall rules, queued resources and staging
    objects); returns what was found.

    Raises GcpError naming what is still there if deletion is not confirmed in time.
    """
    from google.api_core import exceptions as gx

    fleet = _fleet(project, zone, run_id, log, bucket)
    found = fleet.sweep()
    staging = Staging(fleet.clients, run_id)
    try:
        found.staged = [b.name for b in fleet.clients.storage.list_blobs(staging.bucket_name, prefix=staging.staging_prefix)]
    except gx.NotFound:  # no such bucket: nothing was staged there
        return found
    if found.staged:
        left = staging.delete_staging()
        if left:
            raise GcpError(f"{len(left)} staging object(s) of run {run_id} could not be deleted from "
                           f"gs://{staging.bucket_name}/{staging.staging_prefix}; delete them there.")
    return found


def down_where(run_id: str, where: Where, log: Callable[[str], None]) -> Found:
    """`dsctl down RUN` when RUN has no local state: delete what carries its label where `where` (or the
    environment) says. Returns what was found (and deleted); Found.empty when there was nothing."""
    project = _project(where.get("project"))
    zone = where.get("zone") or os.environ.get("CLOUDSDK_COMPUTE_ZONE")
    if not project or not zone:
        raise SpecError(f"run '{run_id}' has no local state; to find its Google Cloud resources by label, give the "
                        "project and zone (--project P --zone Z, or GOOGLE_CLOUD_PROJECT and CLOUDSDK_COMPUTE_ZONE).")
    return down_by_label(project, zone, run_id, log=log, bucket=where.get("bucket"))


def record_where(run_id: str, where: Where) -> RunObjects:
    """A supervised run's published record (orchestrator/cloudrecord.py) when RUN has no local state:
    gs://<bucket>/dsctl/runs/<run>/record/, the bucket defaulting to <project>-dsctl."""
    project = _project(where.get("project"))
    if not project:
        raise SpecError(f"run '{run_id}' has no local state; to read its record from Cloud Storage, give the project "
                        "(--project P, or GOOGLE_CLOUD_PROJECT) and, if it is not <project>-dsctl, the bucket (--bucket).")
    settings = _settings(project, "", where.get("bucket"))
    return RunObjects(Clients(settings).storage, settings.bucket, run_id)
