"""Checks against the live project before anything is created: a refusal here costs nothing.

The checks, in the order `dsctl check gcp` shows them and `dsctl up` runs them (it refuses at the first that
fails, in one paragraph naming the cause and the command or field that fixes it: SpecError, exit 2):

- credentials: who dsctl calls as (Application Default Credentials);
- APIs: the ones the run calls are on (services.py, through Service Usage, which a new project has on);
- project: it exists and you may see it; its number and whether an organization holds it;
- your permissions, each asked of the resource it is granted on (access.py): the project's for VMs, firewall
  rules and TPU VMs; the staging bucket's; acting as the VMs' accounts on those accounts;
- machine types and images: what the spec names exists in the zone (catalog.py);
- organization policies that would refuse the VMs (orgpolicy.py), where you may read them (else a warning);
- network: there, usable, reachable for what the run needs, its firewall policies (network.py);
- service accounts: which the VMs run as, and that each holds (or will be granted) what its VMs do (accounts.py);
- quota: the region's, the project's global and the TPU quota, at the run's largest (quota.py).

Only reads are made here. `run` is what `dsctl up` calls; `report` runs every check whatever the others found (a
check that needs what an earlier one failed to learn is skipped, saying why) for `dsctl check gcp`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from dsctl.errors import DsctlError
from dsctl.specs import SpecError
from dsctl.specs.schema import JobSpec

from ..contract import CheckResult
from . import access, accounts, catalog, network, orgpolicy, quota, services
from .clients import Clients
from .errors import GcpError, from_api_error
from .machinetypes import machine_kind
from .retry import call
from .settings import GcpSettings
from .software import Software

# What each permission the caller lacks comes with, for the refusal's advice.
ROLES = {
    "compute.instances.osLogin": "roles/compute.osLogin (SSH to the run's VMs through OS Login)",
    "compute.firewalls.": "roles/compute.securityAdmin (the run's firewall rules)",
    "compute.networks.updatePolicy": "roles/compute.securityAdmin (the run's firewall rules)",
    "compute.": "roles/compute.instanceAdmin.v1 (the VMs)",
    "tpu.": "roles/tpu.admin (the TPU VMs)",
    "storage.buckets.create": "roles/storage.admin (the staging bucket)",
    "storage.": "roles/storage.admin on the bucket (the run's objects, and who may read them)",
    "iam.serviceAccounts.actAs": "roles/iam.serviceAccountUser on the VMs' service account",
}


@dataclass
class Findings:
    """What the checks learned, for the plan and the run."""

    project_number: str | None = None
    organization: str | None = None
    accounts: accounts.Accounts | None = None  # which accounts the VMs run as, and what `up` does to them
    shielded_kinds: list[str] = field(default_factory=list)
    standing_rules: bool = False  # the network's standing dsctl rules, not the run's own
    notes: list[str] = field(default_factory=list)


@dataclass
class _Walk:
    """One pass of the checks: their inputs, and what each learned for the next."""

    clients: Clients
    spec: JobSpec
    software: Software
    reaches_vms: bool
    workers: int
    findings: Findings = field(default_factory=Findings)
    bucket_exists: bool = False
    bucket_location: str | None = None
    creation_forbidden: bool = False


def required_permissions(spec: JobSpec) -> list[str]:
    """What you do on the run's project: create and delete its VMs (running as service accounts), its firewall
    rules, its TPU VMs; the bucket's own permissions are asked of the bucket."""
    perms = ["compute.instances.create", "compute.instances.delete", "compute.instances.get", "compute.instances.list",
             "compute.instances.setMetadata", "compute.instances.setTags", "compute.instances.setLabels",
             "compute.instances.setServiceAccount", "compute.disks.create", "compute.zoneOperations.get",
             "compute.globalOperations.get", "compute.instances.osLogin"]
    if machine_kind(spec.trainer.machine).kind == "tpu":
        perms += ["tpu.nodes.get", "tpu.nodes.list", "tpu.nodes.delete", "tpu.queuedResources.create",
                  "tpu.queuedResources.get", "tpu.queuedResources.list", "tpu.queuedResources.delete",
                  "tpu.operations.get"]
    return perms


BUCKET_PERMISSIONS = ["storage.buckets.get", "storage.buckets.getIamPolicy", "storage.buckets.setIamPolicy",
                      "storage.objects.create", "storage.objects.delete", "storage.objects.get", "storage.objects.list"]


def supervisor_needs(spec: JobSpec, s: GcpSettings) -> dict[access.Where, list[str]]:
    """What the run's supervisor on the dispatcher VM does with its account, on each resource (orchestrator/
    supervise.py): watch, restart and delete VMs (create workers when it autoscales) and TPU VMs on the project;
    delete the run's firewall rules where they are (a Shared VPC host's project; none with standing rules); publish
    the record and delete the run's objects in the bucket; act as the VMs' accounts (SSH to them through OS Login,
    workers it creates) on those accounts."""
    project = ["compute.instances.delete", "compute.instances.get", "compute.instances.list", "compute.instances.start",
               "compute.instances.osLogin", "compute.zoneOperations.get"]
    if spec.autoscale is not None:
        project += ["compute.instances.create", "compute.instances.setMetadata", "compute.instances.setTags",
                    "compute.instances.setLabels", "compute.instances.setServiceAccount", "compute.disks.create"]
    if machine_kind(spec.trainer.machine).kind == "tpu":
        project += ["tpu.nodes.get", "tpu.nodes.list", "tpu.nodes.delete", "tpu.queuedResources.get",
                    "tpu.queuedResources.list", "tpu.queuedResources.delete", "tpu.operations.get"]
    out = {access.PROJECT: project,
           access.bucket(s.bucket): ["storage.objects.create", "storage.objects.delete", "storage.objects.get",
                                   "storage.objects.list"]}
    if s.firewall_project is not None:
        rules = access.PROJECT if s.firewall_project == s.project else access.Where("project", s.firewall_project)
        out[rules] = [*out.get(rules, []), "compute.firewalls.delete", "compute.firewalls.list",
                      "compute.globalOperations.get"]
    for email in dict.fromkeys(s.vm_accounts.values()):
        out[access.account(email)] = ["iam.serviceAccounts.actAs"]
    return out


def _roles_for(missing: list[str]) -> str:
    return "; ".join(sorted({next(role for prefix, role in ROLES.items() if p.startswith(prefix)) for p in missing
                             if any(p.startswith(prefix) for prefix in ROLES)}))


# -- the checks ----------------------------------------------------------------------------------------------------
def _credentials(w: _Walk) -> list[CheckResult]:
    return [CheckResult("credentials", "ok", f"calling Google Cloud as {w.clients.caller()}")]


def _project(w: _Walk) -> list[CheckResult]:
    from google.api_core import exceptions as gx

    s = w.clients.settings
    try:
        project = call(w.clients.projects.get_project, name=f"projects/{s.project}", doing=f"reading project {s.project}")
    except (gx.Forbidden, gx.NotFound):
        raise SpecError(f"project {s.project} does not exist, or your credentials ({w.clients.caller()}) may not see "
                        f"it (resourcemanager.projects.get). Nothing was created. Check gcp.project, or ask for "
                        f"roles/browser on it.", field="gcp.project") from None
    w.findings.project_number = project.name.rsplit("/", 1)[-1]
    parent = project.parent or None
    w.findings.organization = parent if parent and parent.startswith(("organizations/", "folders/")) else None
    where = f"in {parent}" if parent else "in no organization: no organization policy applies"
    return [CheckResult("project", "ok", f"project {s.project} (number {w.findings.project_number}), {where}")]


def _apis(w: _Walk) -> list[CheckResult]:
    from google.api_core import exceptions as gx

    s = w.clients.settings
    wanted = services.needed(tpu=machine_kind(w.spec.trainer.machine).kind == "tpu")
    try:
        states = services.states(w.clients, wanted)
    except gx.Forbidden as exc:
        return [CheckResult("APIs", "warn", f"which APIs are on could not be read ({getattr(exc, 'message', exc)}; "
                            "serviceusage.services.get): an API that is off would refuse the run when first called",
                            fix=services.enable_command(s.project, [a.name for a in wanted]))]
    off = [a for a in wanted if states.get(a.name) != "ENABLED"]
    needed = [a for a in off if a.required]
    if needed:
        raise SpecError(
            f"{len(needed)} API(s) the run calls are off in project {s.project}: "
            f"{'; '.join(f'{a.name} ({a.why})' for a in needed)}. Nothing was created. Turn them on: "
            f"`{services.enable_command(s.project, [a.name for a in off])}` (a minute or two to take effect).",
            field="gcp.project")
    out = [CheckResult("APIs", "ok", f"{len(wanted) - len(off)} API(s) on: "
                       f"{', '.join(a.name for a in wanted if a not in off)}")]
    for a in off:
        out.append(CheckResult("APIs", "warn", f"{a.name} is off: without it dsctl checks less beforehand ({a.why})",
                               fix=services.enable_command(s.project, [a.name])))
    return out


def _permissions(w: _Walk) -> list[CheckResult]:
    """Yours, each on its resource: the project's, the staging bucket's (or creating it), acting as the VMs'
    accounts (asked once they are chosen: _accounts)."""
    from google.api_core import exceptions as gx

    s = w.clients.settings
    wanted = required_permissions(w.spec)
    try:
        bucket = call(lambda **_: w.clients.storage.lookup_bucket(s.bucket), doing=f"looking up gs://{s.bucket}")
    except gx.Forbidden:
        bucket = True  # it exists, someone else's: the bucket's own test says what you may do there
    w.bucket_exists = bucket is not None
    if bucket is None:
        wanted = wanted + ["storage.buckets.create"]
        w.bucket_location = s.region
    elif bucket is not True:
        w.bucket_location = (bucket.location or "").lower() or None
    missing = access.missing(w.clients, access.PROJECT, wanted, f"checking your permissions on project {s.project}")
    where = f"project {s.project}"
    if not missing and w.bucket_exists:
        missing = access.missing(w.clients, access.bucket(s.bucket), BUCKET_PERMISSIONS,
                                 f"checking your permissions on gs://{s.bucket}")
        where = f"the staging bucket gs://{s.bucket}"
    if missing:
        command = (f"gcloud projects add-iam-policy-binding {s.project} --member=user:YOU --role=ROLE"
                   if where.startswith("project") else
                   f"gcloud storage buckets add-iam-policy-binding gs://{s.bucket} --member=user:YOU "
                   "--role=roles/storage.admin")
        raise SpecError(
            f"your credentials ({w.clients.caller()}) lack {len(missing)} permission(s) this run needs on {where}: "
            f"{', '.join(missing[:8])}{' ...' if len(missing) > 8 else ''}. Nothing was created. Grant the roles "
            f"{_roles_for(missing)} (`{command}`), or run dsctl with credentials that have them; or name another "
            "staging bucket (gcp.bucket).", field="gcp.bucket" if where.startswith("the staging") else "gcp.project")
    said = f"on project {s.project}" + (f" and gs://{s.bucket}" if w.bucket_exists else
                                        f"; gs://{s.bucket} is created in {s.region}")
    return [CheckResult("your permissions", "ok", f"you may create and delete the run's VMs and rules {said}")]


def _catalog(w: _Walk) -> list[CheckResult]:
    w.findings.shielded_kinds = catalog.check(w.clients, w.spec, w.software)
    w.clients.settings.shielded_kinds = list(w.findings.shielded_kinds)
    return [CheckResult("machines and images", "ok",
                        f"{w.spec.trainer.machine}, {w.spec.service.worker_machine} and their images are offered in "
                        f"{w.clients.settings.zone}")]


def _policies(w: _Walk) -> list[CheckResult]:
    if w.findings.organization is None:
        return [CheckResult("organization policies", "ok", "the project is in no organization")]
    found = orgpolicy.check(w.clients, w.software, w.findings.shielded_kinds, w.bucket_location)
    w.creation_forbidden = found.service_account_creation_disabled
    if found.api_off:
        s = w.clients.settings
        raise SpecError(
            f"project {s.project} is in {w.findings.organization}, whose policies can refuse the run's VMs when they are "
            "created, and the Organization Policy API, which dsctl reads them with first, is off. Nothing was created. "
            f"Turn it on: `{services.enable_command(s.project, ['orgpolicy.googleapis.com'])}`.", field="gcp.project")
    if not found.readable:
        return [CheckResult("organization policies", "warn", n, fix="ask for roles/orgpolicy.policyViewer")
                for n in found.notes]
    return [CheckResult("organization policies", "ok", "none of the constraints dsctl knows would refuse the run")]


def _network(w: _Walk) -> list[CheckResult]:
    found = network.check(w.clients, reaches_vms=w.reaches_vms)
    w.findings.standing_rules = w.clients.settings.standing_rules = found.standing_rules
    s = w.clients.settings
    rules = ("the network's standing dsctl rules" if found.standing_rules else
             f"the run's own firewall rules in project {s.network_project}")
    out = [CheckResult("network", "ok", f"network {s.network.rsplit('/', 1)[-1]}"
                       f"{' (Shared VPC of ' + s.network_project + ')' if s.network_project != s.project else ''}: "
                       f"usable; {rules}")]
    out += [CheckResult("network", "warn" if n.startswith("WARNING") else "ok", n.removeprefix("WARNING: "),
                        plan_note=True) for n in found.notes]
    return out


def _accounts(w: _Walk) -> list[CheckResult]:
    from google.api_core import exceptions as gx

    assert w.findings.project_number is not None, "the project check ran first"
    s = w.clients.settings
    chosen = accounts.decide(w.clients, w.spec, w.findings.project_number, workers=w.workers,
                             creation_forbidden=w.creation_forbidden, firewall_project=s.firewall_project)
    w.findings.accounts = chosen
    s.vm_accounts = dict(chosen.emails)
    out = [CheckResult("service accounts", "ok", n, plan_note=True) for n in chosen.notes]
    # You create VMs that run as these accounts: you act as each (asked of the account itself).
    made = {g.target for g in chosen.caller_grants}
    for email in dict.fromkeys(chosen.emails.values()):
        if email in made or any(p.create for p in chosen.plans if p.email == email):
            continue
        try:
            lacking = access.missing(w.clients, access.account(email), ["iam.serviceAccounts.actAs"],
                                     f"checking that you may act as {email}")
        except gx.NotFound:
            lacking = ["iam.serviceAccounts.actAs"]
        if lacking:
            raise SpecError(
                f"your credentials ({w.clients.caller()}) may not act as {email}, which the run's VMs run as, so no VM "
                f"could be created to run as it (iam.serviceAccounts.actAs, asked of the account itself). Nothing "
                f"was created. Grant it: `gcloud iam service-accounts add-iam-policy-binding {email} "
                f"--member=user:{w.clients.caller()} --role=roles/iam.serviceAccountUser`.", field="gcp.service_accounts")
    return out


def _quota(w: _Walk) -> list[CheckResult]:
    notes = quota.check(w.clients, w.spec, workers=w.workers, hands_off=not w.reaches_vms)
    out = [CheckResult("quota", "ok", "the run's VMs fit the project's quotas")]
    return out + [CheckResult("quota", "warn" if "not checked" in n or "could not" in n else "ok", n, plan_note=True)
                  for n in notes]


CHECKS: list[tuple[str, Callable[[_Walk], list[CheckResult]]]] = [
    ("credentials", _credentials), ("APIs", _apis), ("project", _project), ("your permissions", _permissions),
    ("machines and images", _catalog), ("organization policies", _policies), ("network", _network),
    ("service accounts", _accounts), ("quota", _quota)]
# A failure here makes the later checks meaningless: they are skipped.
FUNDAMENTAL = {"credentials", "project", "APIs"}


def _walk(clients: Clients, spec: JobSpec, software: Software, *, reaches_vms: bool, workers: int | None,
          stop_at_first: bool) -> tuple[Findings, list[CheckResult]]:
    accounts.refuse_none(clients.settings.service_account)  # VMs that nothing could end
    most = workers if workers is not None else max(spec.service.workers, spec.autoscale.max_workers
                                                   if spec.autoscale else 0)
    w = _Walk(clients, spec, software, reaches_vms, most)
    results: list[CheckResult] = []
    blocked: str | None = None
    for name, check in CHECKS:
        if blocked:
            results.append(CheckResult(name, "skip", f"not checked: {blocked}"))
            continue
        try:
            results += check(w)
        except SpecError as exc:
            if stop_at_first:
                raise
            results.append(CheckResult(name, "fail", str(exc), field=exc.field))
        except (GcpError, DsctlError) as exc:
            if stop_at_first:
                raise
            results.append(CheckResult(name, "fail", str(exc)))
        except Exception as exc:  # noqa: BLE001 - a Google API answer the check did not expect: said, not a traceback
            from google.api_core import exceptions as gx

            if stop_at_first or not isinstance(exc, gx.GoogleAPICallError):
                raise
            results.append(CheckResult(name, "fail", str(from_api_error(exc, doing=f"the {name} check"))))
        if results and results[-1].status == "fail" and name in FUNDAMENTAL:
            blocked = f"the {name} check failed"
    w.findings.notes += [f"WARNING: {r.detail}" for r in results if r.status == "warn"]
    w.findings.notes += [r.detail for r in results if r.status == "ok" and r.plan_note]
    return w.findings, results


def run(clients: Clients, spec: JobSpec, software: Software, reaches_vms: bool = True,
        workers: int | None = None) -> Findings:
    """Every check, stopping at the first refusal (SpecError); what the plan should say. `reaches_vms`: this machine
    connects to the VMs (a run supervised from here), so SSH from here must be admitted; else the run is handed over
    to its dispatcher VM. `workers`: the most workers the run will have (None: from the spec; 0: trainers only)."""
    findings, _ = _walk(clients, spec, software, reaches_vms=reaches_vms, workers=workers, stop_at_first=True)
    return findings


def report(clients: Clients, spec: JobSpec, software: Software, reaches_vms: bool = False,
           workers: int | None = None) -> list[CheckResult]:
    """Every check, whatever the others found, for `dsctl check gcp`."""
    _, results = _walk(clients, spec, software, reaches_vms=reaches_vms, workers=workers, stop_at_first=False)
    return results
