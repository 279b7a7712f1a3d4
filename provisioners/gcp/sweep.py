"""Find and remove a run's resources by label, with no local state (`dsctl down RUN` after a lost run dir).

Instances and TPU VMs are found by the label dsctl-run=<run>; the firewall rules
and TPU queued resources (which have no labels) by the names derived from the run
id; the staging objects by the run's prefix in the staging bucket (default
<project>-dsctl). Deletion is parallel and confirmed, as for a normal `down`.
"""

from __future__ import annotations

from typing import Callable

from .clients import Clients
from .errors import GcpError
from .resources import Fleet, Found
from .settings import GcpSettings, check_credentials
from .storage import Staging


def _fleet(project: str, zone: str, run_id: str, log: Callable[[str], None] | None, bucket: str | None = None) -> Fleet:
    settings = GcpSettings(project=project, zone=zone, bucket=bucket or f"{project}-dsctl").with_env_endpoints()
    check_credentials(settings)
    return Fleet(Clients(settings), run_id, log=log)


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
