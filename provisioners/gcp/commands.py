"""What the CLI needs from the gcp provider, as plain functions (the CLI wires them in a few lines).

    dsctl up job.yaml --dry-run     print(up_plan(spec, workers).render()); create nothing
    dsctl up job.yaml               on provider gcp, show the plan and ask (confirm_up) unless --yes
    dsctl down RUN                  no local state? down_without_state(RUN, project, zone)
"""

from __future__ import annotations

import os
import sys
from typing import Callable

from dsctl.specs import SpecError
from dsctl.specs.schema import JobSpec

from .plan import Plan, plan
from .resources import Found


def up_plan(spec: JobSpec, workers: int | None = None, batches_per_s: float | None = None) -> Plan:
    """The plan `dsctl up --dry-run` prints for a gcp spec; needs no credentials, creates nothing."""
    return plan(spec, workers, batches_per_s=batches_per_s)


def confirm_up(spec: JobSpec, workers: int | None, *, yes: bool, ask: Callable[[str], bool],
               echo: Callable[[str], None], interactive: bool | None = None) -> bool:
    """For provider gcp: show the plan and ask before creating anything that bills; True to go ahead.

    Project, zone, credentials, permissions and the network are checked first (SpecError,
    preflight.py), so nobody is asked about a run that cannot start. `ask(question) -> bool` is e.g. typer.confirm; without a terminal and
    without --yes this refuses (SpecError) instead of waiting for an answer nobody can give.
    """
    if spec.provider != "gcp" or yes:
        return True
    from . import preflight
    from .clients import Clients
    from .settings import resolve

    settings = resolve(spec)
    findings = preflight.run(Clients(settings), spec, settings.kinds)  # refuses before asking, if it must
    shown = plan(spec, workers, project=settings.project, zone=settings.zone)
    shown.notes += findings.notes
    echo(shown.render())
    if interactive is None:
        interactive = sys.stdin.isatty()
    if not interactive:
        raise SpecError("provider: gcp creates machines that bill by the hour; pass --yes to create them without "
                        "asking (or --dry-run to see the plan only).")
    return ask("Create these machines on Google Cloud?")


def _project(project: str | None) -> str | None:
    from .settings import _adc_project

    return project or os.environ.get("GOOGLE_CLOUD_PROJECT") or os.environ.get("CLOUDSDK_CORE_PROJECT") or (
        None if os.environ.get("DSCTL_GCE_ENDPOINT") else _adc_project())


def down_without_state(run_id: str, project: str | None = None, zone: str | None = None,
                       log: Callable[[str], None] | None = None, bucket: str | None = None) -> Found:
    """`dsctl down RUN` when RUN has no local state: delete what carries its label in project/zone.

    project/zone default to GOOGLE_CLOUD_PROJECT (or CLOUDSDK_CORE_PROJECT, or the ADC project) and
    CLOUDSDK_COMPUTE_ZONE. Returns what was found (and deleted); Found.empty when there was nothing.
    """
    from .sweep import down_by_label

    project = _project(project)
    zone = zone or os.environ.get("CLOUDSDK_COMPUTE_ZONE")
    if not project or not zone:
        raise SpecError(f"run '{run_id}' has no local state; to find its Google Cloud resources by label, give the "
                        "project and zone (--project P --zone Z, or GOOGLE_CLOUD_PROJECT and CLOUDSDK_COMPUTE_ZONE).")
    return down_by_label(project, zone, run_id, log=log, bucket=bucket)


def run_objects_without_state(run_id: str, project: str | None = None, bucket: str | None = None):
    """A supervised run's published record (orchestrator/cloudrecord.py) when RUN has no local state:
    gs://<bucket>/dsctl/runs/<run>/record/, the bucket defaulting to <project>-dsctl."""
    from .clients import Clients
    from .settings import GcpSettings, check_credentials
    from .storage import RunObjects

    project = _project(project)
    if not project:
        raise SpecError(f"run '{run_id}' has no local state; to read its record from Cloud Storage, give the project "
                        "(--project P, or GOOGLE_CLOUD_PROJECT) and, if it is not <project>-dsctl, the bucket (--bucket).")
    settings = GcpSettings(project=project, zone="", bucket=bucket or f"{project}-dsctl").with_env_endpoints()
    check_credentials(settings)
    return RunObjects(Clients(settings).storage, settings.bucket, run_id)
