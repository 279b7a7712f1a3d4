"""The Google Cloud APIs a run calls, and whether each is on in the project, read with Service Usage.

A new project has only Google's default services on (https://cloud.google.com/service-usage/docs/
enabled-service#default): Compute Engine, IAM, Resource Manager, OS Login, Organization Policy and Cloud
TPU are off until someone enables them. An API that is off answers every call with 403 SERVICE_DISABLED,
which, met in the middle of a run, would read as a missing permission; so the checks ask Service Usage
(services.batchGet) first, and name the one command that turns on what is missing.
"""

from __future__ import annotations

from dataclasses import dataclass

from .clients import Clients
from .retry import call


@dataclass(frozen=True)
class Api:
    name: str
    why: str
    required: bool = True  # False: without it dsctl checks less beforehand, and says so


def needed(tpu: bool) -> list[Api]:
    """The APIs a run calls, each with what for."""
    apis = [Api("compute.googleapis.com", "the VMs, firewall rules and quotas"),
            Api("storage.googleapis.com", "the run's software, hand-over and record in the staging bucket"),
            Api("iam.googleapis.com", "the VMs' service accounts"),
            Api("cloudresourcemanager.googleapis.com", "your permissions and the project's IAM policy"),
            Api("oslogin.googleapis.com", "the SSH keys the run's supervisor registers"),
            # Needed where an organization holds the project (its policies apply): the policies check says so.
            Api("orgpolicy.googleapis.com", "the organization policies that would refuse the VMs", required=False)]
    if tpu:
        apis += [Api("tpu.googleapis.com", "the TPU VMs"),
                 Api("cloudquotas.googleapis.com", "TPU quota, read before anything is created", required=False)]
    return apis


def states(clients: Clients, apis: list[Api]) -> dict[str, str]:
    """API name -> ENABLED | DISABLED in the run's project (google.api_core errors propagate: Forbidden where the
    caller may not ask, serviceusage.services.get)."""
    s = clients.settings
    parent = f"projects/{s.project}"
    out: dict[str, str] = {}
    for i in range(0, len(apis), 20):
        reply = call(clients.serviceusage.batch_get_services,
                     request={"parent": parent, "names": [f"{parent}/services/{a.name}" for a in apis[i:i + 20]]},
                     doing=f"reading which APIs are on in project {s.project}")
        out.update({svc.config.name or svc.name.rsplit("/", 1)[-1]: svc.state.name for svc in reply.services})
    return out


def enable_command(project: str, names: list[str]) -> str:
    return f"gcloud services enable {' '.join(names)} --project={project}"
