"""The account the run's VMs run as, with exactly the roles they need: dsctl's own where it may make it.

Organizations created since May 2024 give the Compute Engine default service account no role
(iam.automaticIamGrantsForDefaultServiceAccounts), so a run supervised on its dispatcher VM would
find, after the whole fleet booted, that it may do nothing. So, before anything is created:

- `gcp.service_account` named: that account is used, and its roles are read from the project's IAM
  policy; missing ones refuse the run (dsctl never changes the roles of an account you chose);
- not named, and you may create service accounts and grant roles (testIamPermissions) and no
  organization policy forbids it: the VMs run as dsctl's own `dsctl-vms@PROJECT.iam.gserviceaccount.com`,
  created once per project and granted the roles it lacks, in `up`, after the plan was confirmed
  (`ensure`); later runs find it and change nothing;
- otherwise dsctl's own account if someone made it, else the Compute Engine default account, each
  checked for roles: missing ones refuse the run, naming them and the commands that grant them;
- `none` (VMs with no account) is refused (`refuse_none`): a VM's watchdog needs the account's token to
  read the run's heartbeat and to delete its own VM, and a TPU VM has no other end.

`ROLES` is the one list of what the VMs do with their account, a reason for each. Roles held
through a broader predefined role (Owner, Editor, Compute Admin, Storage Admin) count; custom
roles cannot be read here and are not counted.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from dsctl.provisioners.contract import EventSink
from dsctl.specs import SpecError
from dsctl.specs.schema import JobSpec

from .clients import Clients
from .errors import GcpError, from_api_error
from .machinetypes import machine_kind
from .retry import call

ACCOUNT_ID = "dsctl-vms"
DISPLAY_NAME = "dsctl VMs"
DESCRIPTION = "What the VMs of dsctl's runs act as (made by dsctl; roles: what its supervisor and startup script do)"
ACTING_AS_ITSELF = "roles/iam.serviceAccountUser"  # granted on the account itself, never on the project


@dataclass(frozen=True)
class Role:
    name: str
    why: str


ROLES = (
    Role("roles/storage.objectAdmin", "every VM reads the run's software and code from the staging bucket; the "
         "supervisor writes the run's record and logs there and deletes the run's objects"),
    Role("roles/compute.instanceAdmin.v1", "the supervisor on the dispatcher VM watches, restarts and deletes the "
         "run's VMs, and creates workers when it autoscales"),
    Role("roles/compute.securityAdmin", "the supervisor deletes the run's firewall rules"),
    Role("roles/compute.osLogin", "the supervisor reaches the other VMs over SSH through OS Login"),
    Role(ACTING_AS_ITSELF, "the supervisor acts as the VMs' account: SSH to VMs that run as it, workers created "
         "to run as it (granted on the account itself)"),
)
TPU_ROLE = Role("roles/tpu.admin", "the supervisor deletes the run's TPU VMs and queued resources")
# Predefined roles that hold everything a needed role grants (the basic roles hold all of these).
COVERED_BY = {
    "roles/storage.objectAdmin": {"roles/storage.admin"},
    "roles/compute.instanceAdmin.v1": {"roles/compute.admin"},
    "roles/compute.securityAdmin": {"roles/compute.admin"},
    "roles/compute.osLogin": {"roles/compute.osAdminLogin", "roles/compute.admin"},
    ACTING_AS_ITSELF: set(),
    "roles/tpu.admin": set(),
}
BASIC = {"roles/owner", "roles/editor"}
# What the caller needs for dsctl to make its own account and grant it roles.
MAKES_ACCOUNTS = ["iam.serviceAccounts.create", "iam.serviceAccounts.get", "iam.serviceAccounts.getIamPolicy",
                  "iam.serviceAccounts.setIamPolicy", "resourcemanager.projects.getIamPolicy",
                  "resourcemanager.projects.setIamPolicy"]


def roles_for(spec: JobSpec) -> list[Role]:
    """The roles the run's VMs need."""
    return list(ROLES) + ([TPU_ROLE] if machine_kind(spec.trainer.machine).kind == "tpu" else [])


def own_account(project: str) -> str:
    return f"{ACCOUNT_ID}@{project}.iam.gserviceaccount.com"


def default_account(project_number: str) -> str:
    return f"{project_number}-compute@developer.gserviceaccount.com"


@dataclass
class AccountPlan:
    """The VMs' account, and what `ensure` does to it in `up` (nothing unless it is dsctl's own)."""

    email: str
    create: bool = False  # dsctl's own, not there yet
    grant: list[Role] = field(default_factory=list)  # roles to grant it (dsctl's own only)
    notes: list[str] = field(default_factory=list)


def _held(roles: set[str], needed: str) -> bool:
    return needed in roles or bool(roles & (BASIC | COVERED_BY.get(needed, set())))


def _members_roles(policy_bindings, member: str) -> set[str]:
    """Roles of `member` in a policy's unconditional bindings (proto or JSON form)."""
    out = set()
    for b in policy_bindings:
        role, members = (b["role"], b.get("members", [])) if isinstance(b, dict) else (b.role, b.members)
        condition = b.get("condition") if isinstance(b, dict) else (b.condition.expression or None)
        if member in members and not condition:
            out.add(role)
    return out


def _project_policy(clients: Clients):
    s = clients.settings
    return call(clients.projects.get_iam_policy, request={"resource": f"projects/{s.project}",
                                                          "options": {"requested_policy_version": 3}},
                doing=f"reading project {s.project}'s IAM policy")


def missing_roles(clients: Clients, email: str, needed: list[Role]) -> list[Role] | None:
    """The roles of `needed` the account does not hold; None where the caller may not read the project's policy. The
    account's right to act as itself counts when it is granted on the project or (if readable) on the account."""
    from google.api_core import exceptions as gx

    member = f"serviceAccount:{email}"
    try:
        held = _members_roles(_project_policy(clients).bindings, member)
    except gx.Forbidden:
        return None
    missing = [r for r in needed if not _held(held, r.name)]
    if any(r.name == ACTING_AS_ITSELF for r in missing):
        try:
            own = call(clients.iam.get_account_policy, clients.settings.project, email,
                       doing=f"reading who may act as {email}")
            if ACTING_AS_ITSELF in _members_roles(own.get("bindings", []), member):
                missing = [r for r in missing if r.name != ACTING_AS_ITSELF]
        except (gx.Forbidden, gx.NotFound):
            missing = [r for r in missing if r.name != ACTING_AS_ITSELF]  # not readable: not counted against it
    return missing


def _exists(clients: Clients, email: str) -> bool:
    from google.api_core import exceptions as gx

    try:
        call(clients.iam.get_service_account, clients.settings.project, email, doing=f"looking up {email}")
        return True
    except (gx.NotFound, gx.Forbidden):
        return False


def grant_commands(project: str, email: str, roles: list[Role]) -> str:
    member = f"serviceAccount:{email}"
    return "; ".join(
        f"gcloud iam service-accounts add-iam-policy-binding {email} --member={member} --role={r.name}"
        if r.name == ACTING_AS_ITSELF else
        f"gcloud projects add-iam-policy-binding {project} --member={member} --role={r.name}" for r in roles)


def refuse_none(account: str | None) -> None:
    """`gcp.service_account: none` would make VMs without an end: refused (SpecError), saying what to use instead."""
    if account != "none":
        return
    raise SpecError(
        "gcp.service_account: none would create the run's VMs with no service account, and nothing would end them "
        "should the run's supervisor be lost: each VM's dead man's switch (its watchdog) reads the run's heartbeat in "
        "Cloud Storage and deletes its own VM with that account's token, and a TPU VM has no maxRunDuration, so it "
        "would bill until someone deletes it. Without an account the VMs could not fetch their software from the "
        "staging bucket either, nor could the dispatcher VM supervise the run. Nothing was created. Leave "
        "gcp.service_account out (the VMs then run as dsctl's own dsctl-vms account, made with exactly the roles "
        "they need where you may, else an existing account checked for them), or name an account that has those "
        "roles (gcp.service_account: NAME@PROJECT.iam.gserviceaccount.com).", field="gcp.service_account")


def decide(clients: Clients, spec: JobSpec, project_number: str, *, lacking: list[str],
           may_not_create: bool) -> AccountPlan:
    """Which account the VMs run as, and what `ensure` does: refuses (SpecError) an account that lacks roles
    when dsctl may not make its own. Only reads. `lacking`: the caller's permissions of MAKES_ACCOUNTS it lacks;
    `may_not_create`: an organization policy forbids new accounts."""
    s = clients.settings
    needed = roles_for(spec)
    refuse_none(s.service_account)
    if s.service_account:
        return _checked(clients, s.service_account, needed, "the account gcp.service_account names", may_create=False)
    own = own_account(s.project)
    exists = _exists(clients, own)
    if not lacking and not may_not_create:
        grant = needed if not exists else (missing_roles(clients, own, needed) or [])
        plan = AccountPlan(email=own, create=not exists, grant=grant)
        made = "dsctl makes it now" if not exists else "it exists"
        plan.notes.append(f"the VMs run as dsctl's own service account {own} ({made}"
                          + (f"; granting {', '.join(r.name for r in grant)}" if grant else "") + ")")
        return plan
    why = ("an organization policy forbids new service accounts (constraints/iam.disableServiceAccountCreation)"
           if may_not_create else f"your credentials lack {', '.join(lacking)}")
    if exists:
        return _checked(clients, own, needed, "dsctl's own account", may_create=False, why=why)
    return _checked(clients, default_account(project_number), needed, "the Compute Engine default account",
                    may_create=True, why=why)


def _checked(clients: Clients, email: str, needed: list[Role], which: str, *, may_create: bool,
             why: str = "") -> AccountPlan:
    s = clients.settings
    missing = missing_roles(clients, email, needed)
    plan = AccountPlan(email=email)
    if missing is None:
        plan.notes.append(f"the VMs run as {email} ({which}); its roles could not be read (you lack "
                          "resourcemanager.projects.getIamPolicy), so the run's supervisor checks them itself")
        return plan
    if missing:
        reasons = "; ".join(f"{r.name} ({r.why})" for r in missing)
        own = (f" dsctl would make an account of its own ({own_account(s.project)}) with exactly these roles, but "
               f"{why}: roles/iam.serviceAccountAdmin and roles/resourcemanager.projectIamAdmin let it." if may_create
               else "")
        raise SpecError(
            f"the run's VMs would run as {email} ({which}), which lacks {len(missing)} role(s) they need on project "
            f"{s.project}: {reasons}. Nothing was created.{own} Grant them: {grant_commands(s.project, email, missing)}"
            "; or name an account that has them (gcp.service_account).", field="gcp.service_account")
    plan.notes.append(f"the VMs run as {email} ({which}), which has the roles they need")
    return plan


def ensure(clients: Clients, plan: AccountPlan | None, events: EventSink) -> None:
    """In `up`, before any VM: make dsctl's own account if the plan says so, and grant it the roles it lacks (read,
    modify, write with the policy's etag, again on a concurrent change). Nothing to do: no call that changes."""
    from google.api_core import exceptions as gx

    s = clients.settings
    if plan is None:
        return
    try:
        if plan.create:
            try:
                call(clients.iam.create_service_account, s.project, ACCOUNT_ID, DISPLAY_NAME, DESCRIPTION,
                     doing=f"creating the VMs' service account {plan.email}")
                events("cloud", f"created the VMs' service account {plan.email}")
            except gx.Conflict:
                pass  # made meanwhile (another run): the same account
        project_roles = [r for r in plan.grant if r.name != ACTING_AS_ITSELF]
        if project_roles:
            _grant(clients, plan.email, project_roles, project=True)
        if any(r.name == ACTING_AS_ITSELF for r in plan.grant):
            _grant(clients, plan.email, [r for r in plan.grant if r.name == ACTING_AS_ITSELF], project=False)
        if plan.grant:
            events("cloud", f"granted {plan.email} {', '.join(r.name for r in plan.grant)}")
    except gx.GoogleAPICallError as exc:
        raise from_api_error(exc, doing=f"preparing the VMs' service account {plan.email}") from exc
    plan.create, plan.grant = False, []
    s.service_account = plan.email  # what the VMs are created with (compute.py, tpu.py), saved in the state


def _grant(clients: Clients, email: str, roles: list[Role], *, project: bool, attempts: int = 8) -> None:
    """Add `member` to each role's binding of the project's policy (or the account's own), read-modify-write."""
    from google.api_core import exceptions as gx

    s = clients.settings
    member = f"serviceAccount:{email}"
    wait = 0.5
    for attempt in range(attempts):
        try:
            if project:
                policy = _project_policy(clients)
                held = _members_roles(policy.bindings, member)
                for r in roles:
                    if r.name not in held:
                        policy.bindings.add(role=r.name, members=[member])
                call(clients.projects.set_iam_policy, request={"resource": f"projects/{s.project}", "policy": policy},
                     doing=f"granting {email} roles on project {s.project}")
            else:
                own = call(clients.iam.get_account_policy, s.project, email, doing=f"reading who may act as {email}")
                bindings = own.setdefault("bindings", [])
                for r in roles:
                    if r.name not in _members_roles(bindings, member):
                        bindings.append({"role": r.name, "members": [member]})
                call(clients.iam.set_account_policy, s.project, email, own, doing=f"letting {email} act as itself")
            return
        except (gx.Conflict, gx.Aborted, gx.BadRequest) as exc:
            # A concurrent change (409 ABORTED: read again), or an account made seconds ago that the policy service
            # does not know yet (400 "does not exist"): both pass.
            if isinstance(exc, gx.BadRequest) and "does not exist" not in str(exc) or attempt == attempts - 1:
                raise
            time.sleep(wait)
            wait = min(wait * 2, 8.0)
    raise GcpError(f"could not grant {email} its roles")  # pragma: no cover (the loop returns or raises)
