"""The organization's policies that would refuse this run, read before anything is created.

Company projects inherit policies from their organization, and Compute Engine refuses a VM that breaks
one only when it is created (HTTP 412, "Constraint constraints/NAME violated"), after the rest of the
fleet was made. So the effective policy of each constraint the run could break is read with the
Organization Policy API v2 (projects.policies.getEffectivePolicy) and a run it refuses is refused here,
in one paragraph naming the constraint and the fix:

- compute.vmExternalIpAccess, with gcp.public_ips: the run's VMs are new, so only a policy that allows
  every instance lets them have an external address;
- compute.trustedImageProjects: the projects of the run's boot images (gcp.image, gcp.gpu_image);
- iam.disableServiceAccountCreation: not a refusal; dsctl then does not make its own service account
  (serviceaccount.py).

OS Login (compute.requireOsLogin) refuses nothing: every VM of a run has OS Login on (oslogin.py).
Reading policies needs orgpolicy.policy.get, which many users lack: then the plan says the policies
were not read, and the run goes on. A rule with a condition (on tags) is not taken as deciding.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dsctl.specs import SpecError

from .clients import Clients
from .retry import call
from .software import Software

EXTERNAL_IPS = "compute.vmExternalIpAccess"
TRUSTED_IMAGES = "compute.trustedImageProjects"
NO_SERVICE_ACCOUNTS = "iam.disableServiceAccountCreation"


@dataclass
class Rules:
    """The unconditional rules of one effective policy."""

    allow_all: bool = False
    deny_all: bool = False
    enforce: bool = False
    allowed: list[str] = field(default_factory=list)
    denied: list[str] = field(default_factory=list)

    @property
    def restricts(self) -> bool:
        """A list constraint that does not allow everything: denies all, or allows only values it lists."""
        return not self.allow_all and (self.deny_all or bool(self.allowed))

    def admits(self, value: str) -> bool:
        """Whether a list constraint admits `value` (e.g. projects/debian-cloud); "is:" prefixes as Google writes
        them."""
        bare = {v.removeprefix("is:") for v in self.allowed}
        if value in {v.removeprefix("is:") for v in self.denied} or self.deny_all and not self.allow_all:
            return False
        return self.allow_all or not self.allowed or value in bare


@dataclass
class OrgPolicies:
    """What the policies say about this run; `readable` is False where the caller may not read them."""

    readable: bool = True
    service_account_creation_disabled: bool = False
    notes: list[str] = field(default_factory=list)


def effective(clients: Clients, constraint: str) -> Rules:
    """The effective policy of `constraint` on the run's project (google.api_core Forbidden if not permitted); a
    constraint the service does not know restricts nothing."""
    from google.api_core import exceptions as gx

    s = clients.settings
    try:
        policy = call(clients.orgpolicy.get_effective_policy, name=f"projects/{s.project}/policies/{constraint}",
                      doing=f"reading the organization policy {constraint}")
    except (gx.NotFound, gx.BadRequest):
        return Rules()
    rules = Rules()
    for rule in policy.spec.rules:
        if rule.condition.expression:
            continue
        rules.allow_all |= rule.allow_all
        rules.deny_all |= rule.deny_all
        rules.enforce |= rule.enforce
        rules.allowed += list(rule.values.allowed_values)
        rules.denied += list(rule.values.denied_values)
    return rules


def _image_project(image: str) -> str | None:
    parts = image.split("/")
    return f"projects/{parts[parts.index('projects') + 1]}" if "projects" in parts else None


def check(clients: Clients, software: Software) -> OrgPolicies:
    """Refuse (SpecError) a run the organization's policies would refuse; what they say otherwise."""
    from google.api_core import exceptions as gx

    s = clients.settings
    found = OrgPolicies()
    try:
        if s.public_ips and effective(clients, EXTERNAL_IPS).restricts:
            raise SpecError(
                f"an organization policy (constraints/{EXTERNAL_IPS}) forbids external IP addresses on new VMs in "
                f"project {s.project}, and gcp.public_ips is true, so Compute Engine would refuse the run's VMs. "
                "Nothing was created. Set gcp.public_ips: false and run dsctl from inside the VPC (docs/gcp.md, "
                "\"From inside the VPC\"), or ask the organization's administrator for an exception for this project.",
                field="gcp.public_ips")
        images = effective(clients, TRUSTED_IMAGES)
        for kind in software.kinds.values():
            project = _image_project(kind.image) if kind.kind != "tpu" else None
            if project and not images.admits(project):
                where = "gcp.gpu_image" if kind.kind == "gpu" else "gcp.image"
                raise SpecError(
                    f"an organization policy (constraints/{TRUSTED_IMAGES}) does not allow boot images from "
                    f"{project}, and the run's {kind.kind.upper()} VMs boot {kind.image}. Nothing was created. Name "
                    f"an image from an allowed project ({where}), or ask the organization's administrator to add "
                    f"{project} to the trusted image projects.", field=where)
        found.service_account_creation_disabled = effective(clients, NO_SERVICE_ACCOUNTS).enforce
    except gx.Forbidden as exc:
        found.readable = False
        found.notes.append(f"the organization's policies could not be read ({getattr(exc, 'message', exc)}; "
                           "orgpolicy.policy.get, e.g. roles/orgpolicy.policyViewer): one that forbids external "
                           "addresses or the boot images would refuse the VMs only when they are created")
    return found
