"""The organization's policies that would refuse this run, read before anything is created.

Company projects inherit policies from their organization, and Compute Engine refuses a VM that breaks
one only when it is created (HTTP 412, "Constraint constraints/NAME violated"), after the rest of the
fleet was made. So the effective policy of each constraint the run could break is read with the
Organization Policy API v2 (projects.policies.getEffectivePolicy), under its legacy name and its
managed one where Google has made one (compute.managed.*, iam.managed.*:
https://cloud.google.com/compute/docs/access/managed-constraints), and a run it refuses is refused
here, in one paragraph naming the constraint and the fix:

- compute.vmExternalIpAccess (and compute.managed.vmExternalIpAccess), with gcp.public_ips: the run's
  VMs are new, so only a policy that allows every instance lets them have an external address;
- compute.trustedImageProjects: the projects of the run's boot images (gcp.image, gcp.gpu_image);
- compute.requireShieldedVm: every VM must be a Shielded VM with Secure Boot: refused with
  gcp.shielded_vm false, or a boot image that is not Shielded VM compatible;
- gcp.resourceLocations: the zone, and the staging bucket's location;
- iam.disableServiceAccountCreation (and iam.managed.disableServiceAccountCreation): not a refusal;
  dsctl then does not make its own accounts (accounts.py).

OS Login (compute.requireOsLogin) refuses nothing: every VM of a run has OS Login on (oslogin.py), and
compute.skipDefaultNetworkCreation is the network's check (network.py). Reading policies needs
orgpolicy.policy.get: without it (or with the Organization Policy API off) the checks say the
policies were not read, as a warning, and the run goes on. A rule with a condition (on tags) is not
taken as deciding.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dsctl.specs import SpecError

from .clients import Clients
from .retry import call
from .software import Software

EXTERNAL_IPS = "compute.vmExternalIpAccess"
EXTERNAL_IPS_MANAGED = "compute.managed.vmExternalIpAccess"
TRUSTED_IMAGES = "compute.trustedImageProjects"
SHIELDED_VM = "compute.requireShieldedVm"
LOCATIONS = "gcp.resourceLocations"
NO_SERVICE_ACCOUNTS = ("iam.disableServiceAccountCreation", "iam.managed.disableServiceAccountCreation")
GROUP_PREFIXES = ("us", "europe", "asia", "northamerica", "southamerica", "australia", "me", "africa")


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

    def admits_location(self, location: str) -> bool:
        """gcp.resourceLocations' rules on a zone (us-central1-b), a region (us-central1) or a multi-region (us):
        values are locations, optionally "is:"-prefixed, or value groups: "in:us-central1-locations" (the region
        and its zones), "in:us-locations" (every US location)
        (https://cloud.google.com/resource-manager/docs/organization-policy/defining-locations)."""
        location = location.lower()
        region = location if location.count("-") <= 1 else location.rsplit("-", 1)[0]

        def matches(value: str) -> bool:
            value = value.lower().removeprefix("is:")
            if value.startswith("in:"):
                group = value[3:].removesuffix("-locations")
                return group in (region, location) or (group in GROUP_PREFIXES and region.startswith(group))
            return value == location

        if self.deny_all and not self.allow_all or any(matches(v) for v in self.denied):
            return False
        return self.allow_all or not self.allowed or any(matches(v) for v in self.allowed)

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
    api_off: bool = False  # the Organization Policy API is off in the project (403 SERVICE_DISABLED)
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


def check(clients: Clients, software: Software, shielded_kinds: list[str], bucket_location: str | None
          ) -> OrgPolicies:
    """Refuse (SpecError) a run the organization's policies would refuse; what they say otherwise.
    `shielded_kinds`: the VM kinds whose boot image supports Shielded VM; `bucket_location`: the staging bucket's,
    where it exists."""
    from google.api_core import exceptions as gx

    s = clients.settings
    found = OrgPolicies()
    try:
        if s.public_ips and (effective(clients, EXTERNAL_IPS).restricts or effective(clients, EXTERNAL_IPS_MANAGED).enforce):
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
        if effective(clients, SHIELDED_VM).enforce:
            _shielded(s, software, shielded_kinds)
        locations = effective(clients, LOCATIONS)
        for what, location, where in (("zone", s.zone, "gcp.zone"), ("staging bucket", bucket_location, "gcp.bucket")):
            if location and not locations.admits_location(location):
                raise SpecError(
                    f"an organization policy (constraints/{LOCATIONS}) does not allow resources in {location}, the "
                    f"run's {what}, so it would be refused when created. Nothing was created. Choose a {what} in an "
                    f"allowed location ({where}; `gcloud org-policies describe {LOCATIONS} --effective "
                    f"--project={s.project}` lists them).", field=where)
        found.service_account_creation_disabled = any(effective(clients, c).enforce for c in NO_SERVICE_ACCOUNTS)
    except gx.Forbidden as exc:
        found.readable = False
        found.api_off = getattr(exc, "reason", None) == "SERVICE_DISABLED"
        found.notes.append(f"the organization's policies could not be read ({getattr(exc, 'message', exc)}; "
                           "orgpolicy.policy.get, e.g. roles/orgpolicy.policyViewer, and the Organization Policy API "
                           "on): one that forbids what the run does (external addresses, its boot images, VMs "
                           "without Shielded VM, its location) would refuse the VMs only when they are created")
    return found


def _shielded(s, software: Software, shielded_kinds: list[str]) -> None:
    """compute.requireShieldedVm: every Compute Engine VM a Shielded VM with Secure Boot."""
    if not s.shielded_vm:
        raise SpecError(
            f"an organization policy (constraints/{SHIELDED_VM}) requires every new VM in project {s.project} to be a "
            "Shielded VM with Secure Boot, and gcp.shielded_vm is false. Nothing was created. Leave gcp.shielded_vm "
            "out (dsctl turns Secure Boot, vTPM and integrity monitoring on wherever the image supports them).",
            field="gcp.shielded_vm")
    for kind in software.kinds.values():
        if kind.kind != "tpu" and kind.kind not in shielded_kinds:
            where = "gcp.gpu_image" if kind.kind == "gpu" else "gcp.image"
            raise SpecError(
                f"an organization policy (constraints/{SHIELDED_VM}) requires every new VM in project {s.project} to be "
                f"a Shielded VM, and the run's {kind.kind.upper()} VMs' image {kind.image} does not support Shielded "
                f"VM (it is not UEFI_COMPATIBLE). Nothing was created. Name a Shielded VM image ({where}; Google's "
                "public images support it).", field=where)
