"""The service accounts the run's VMs run as: two kinds of VM, each account with what its VMs do and no more.

- supervisor (`dsctl-supervisor@PROJECT`): the dispatcher VM and the trainer VMs. The dispatcher VM runs the
  run's supervisor when the run is handed over (it watches, restarts and deletes the run's VMs, creates workers
  when it autoscales, deletes the run's firewall rules, publishes the record); and each of these VMs is the run's
  dead man's switch: should the supervisor's heartbeat stop, its watchdog deletes the run's VMs and then its own
  (watchdog.py; a TPU VM has no other end). Trainers run the user's own program.
- workers (`dsctl-workers@PROJECT`): the tf.data service workers, which run whatever dataset graph reaches their
  unauthenticated port. They may read the run's objects in the staging bucket (and the buckets gcp.data_buckets
  names), nothing else, and nothing at the project level: no dataset graph can touch the project's VMs, firewall
  rules or other buckets. A worker VM cannot end itself: the run's other VMs' watchdogs do; failing those, its
  maxRunDuration (lifetime.py).

Each role is granted on the resource it is for (`Grant.scope`): roles on the project, Service Account User on the
account it lets one act as, Storage roles on the bucket. Google's allow policies are inherited downward only, so a
grant on an account or a bucket is never seen at the project, and is checked where it lives (access.py).

Which accounts, in order: the accounts gcp.service_accounts names (or the one gcp.service_account names, for every
VM), checked and never changed; else dsctl's own, made once per project and granted what they lack, where the caller
may (decide only reads; ensure, in `up` after the plan was confirmed, makes and grants, and waits until the caller's
own new grants are in effect); else dsctl's own if someone made them, else the Compute Engine default account, each
checked. A role missing where dsctl may not grant it refuses the run before anything is created, naming the
`gcloud` command that grants it on its resource. `none` (VMs without an account) is refused: nothing could end them.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from dsctl.provisioners.contract import EventSink
from dsctl.specs import SpecError
from dsctl.specs.schema import JobSpec

from . import access
from .clients import Clients
from .errors import GcpError, from_api_error
from .machinetypes import machine_kind
from .retry import call

SUPERVISOR, WORKERS = "supervisor", "workers"
KINDS = (SUPERVISOR, WORKERS)
ACCOUNT_IDS = {SUPERVISOR: "dsctl-supervisor", WORKERS: "dsctl-workers"}
DISPLAY_NAMES = {SUPERVISOR: "dsctl supervisor", WORKERS: "dsctl workers"}
DESCRIPTIONS = {
    SUPERVISOR: "dsctl's dispatcher and trainer VMs: supervise a run and end its VMs (made by dsctl)",
    WORKERS: "dsctl's tf.data service worker VMs: read the run's objects, nothing else (made by dsctl)",
}
USER_ROLE = "roles/iam.serviceAccountUser"
# Predefined roles that hold everything a needed role grants (the basic roles hold all of these).
COVERED_BY = {
    "roles/storage.objectAdmin": {"roles/storage.admin"},
    "roles/storage.objectViewer": {"roles/storage.objectAdmin", "roles/storage.objectUser", "roles/storage.admin"},
    "roles/compute.instanceAdmin.v1": {"roles/compute.admin"},
    "roles/compute.securityAdmin": {"roles/compute.admin"},
    "roles/compute.osLogin": {"roles/compute.osAdminLogin", "roles/compute.admin"},
    USER_ROLE: set(),
    "roles/tpu.admin": set(),
}
BASIC = {"roles/owner", "roles/editor"}


@dataclass(frozen=True)
class Grant:
    """One role on one resource: the project (`target` its id), a service account (its email), a bucket (its name)."""

    role: str
    scope: access.Scope
    target: str
    why: str

    def command(self, member: str) -> str:
        """The gcloud command that makes this grant for `member` (serviceAccount:..., user:...)."""
        if self.scope == "project":
            return f"gcloud projects add-iam-policy-binding {self.target} --member={member} --role={self.role}"
        if self.scope == "account":
            return f"gcloud iam service-accounts add-iam-policy-binding {self.target} --member={member} --role={self.role}"
        return f"gcloud storage buckets add-iam-policy-binding gs://{self.target} --member={member} --role={self.role}"

    def where(self) -> str:
        return {"project": f"project {self.target}", "account": f"account {self.target}",
                "bucket": f"bucket gs://{self.target}"}[self.scope]


def own_account(kind: str, project: str) -> str:
    return f"{ACCOUNT_IDS[kind]}@{project}.iam.gserviceaccount.com"


def default_account(project_number: str) -> str:
    return f"{project_number}-compute@developer.gserviceaccount.com"


def kinds_for(workers: int) -> tuple[str, ...]:
    """The accounts a run's VMs use: a run with workers both; trainers alone (a baseline) the supervisor's only."""
    return KINDS if workers else (SUPERVISOR,)


def grants_for(kind: str, spec: JobSpec, project: str, bucket: str, emails: dict[str, str],
               firewall_project: str | None) -> list[Grant]:
    """What the VMs running as `kind`'s account do with it, each grant on its resource, with the reason.
    `firewall_project` holds the run's own firewall rules (a Shared VPC host's); None: the run makes none."""
    data = [Grant("roles/storage.objectViewer", "bucket", b, "the run's VMs read their data there (gcp.data_buckets)")
            for b in (spec.gcp.data_buckets if spec.gcp else [])]
    if kind == WORKERS:
        return [Grant("roles/storage.objectViewer", "bucket", bucket,
                      "the workers fetch the run's software, and read a builtin's data, from the staging bucket")] + data
    out = [
        Grant("roles/storage.objectAdmin", "bucket", bucket,
              "the dispatcher and trainers fetch the run's software and code there; the supervisor writes the run's "
              "record, heartbeat and logs and deletes the run's objects"),
        Grant("roles/compute.instanceAdmin.v1", "project", project,
              "the supervisor watches, restarts and deletes the run's VMs and creates workers when it autoscales; a "
              "watchdog deletes the run's VMs once the supervisor is gone"),
        Grant("roles/compute.osLogin", "project", project, "the supervisor reaches the run's VMs over SSH through OS "
              "Login"),
        Grant(USER_ROLE, "account", emails[SUPERVISOR],
              "SSH through OS Login to the dispatcher and trainer VMs, which run as this account"),
    ]
    if firewall_project is not None:
        out.append(Grant("roles/compute.securityAdmin", "project", firewall_project,
                         "the supervisor deletes the run's firewall rules (in the network's project)"))
    if WORKERS in emails and emails[WORKERS] != emails[SUPERVISOR]:
        out.append(Grant(USER_ROLE, "account", emails[WORKERS],
                         "SSH to the worker VMs, and workers created when the run autoscales, run as that account"))
    if machine_kind(spec.trainer.machine).kind == "tpu":
        out.append(Grant("roles/tpu.admin", "project", project,
                         "the supervisor and the watchdogs delete the run's TPU VMs and queued resources"))
    return out + data


@dataclass
class AccountPlan:
    """One account the run's VMs use, and what `ensure` does to it (nothing unless it is dsctl's own)."""

    email: str
    kinds: list[str]  # the kinds of VM that run as it
    source: str  # how it was chosen, for the plan and errors
    create: bool = False
    grant: list[Grant] = field(default_factory=list)


@dataclass
class Accounts:
    """The run's accounts by kind of VM; the caller's own grants `ensure` makes (Service Account User on an account
    dsctl creates, where the caller cannot act as it otherwise); what the plan says."""

    plans: list[AccountPlan]
    caller_grants: list[Grant] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def email(self, kind: str) -> str:
        return next(p.email for p in self.plans if kind in p.kinds)

    @property
    def emails(self) -> dict[str, str]:
        return {k: p.email for p in self.plans for k in p.kinds}


def refuse_none(account: str | None) -> None:
    """`gcp.service_account: none` would make VMs without an end: refused (SpecError), saying what to use instead."""
    if account != "none":
        return
    raise SpecError(
        "gcp.service_account: none would create the run's VMs with no service account, and nothing would end them "
        "should the run's supervisor be lost: each VM's dead man's switch (its watchdog) reads the run's heartbeat in "
        "Cloud Storage and deletes the run's VMs with that account's token, and a TPU VM has no maxRunDuration, so it "
        "would bill until someone deletes it. Without an account the VMs could not fetch their software from the "
        "staging bucket either, nor could the dispatcher VM supervise the run. Nothing was created. Leave "
        "gcp.service_account out (the VMs then run as dsctl's own accounts, made with exactly the roles they need "
        "where you may, else existing accounts checked for them), or name accounts that have those roles "
        "(gcp.service_accounts: {supervisor: ..., workers: ...}).", field="gcp.service_account")


# -- who holds what ---------------------------------------------------------------------------------------------
def _members_roles(bindings, member: str) -> set[str]:
    """Roles of `member` in a policy's unconditional bindings (proto, JSON or storage form)."""
    out = set()
    for b in bindings:
        if isinstance(b, dict):
            role, members, condition = b["role"], b.get("members", ()), b.get("condition")
        else:
            role, members, condition = b.role, b.members, b.condition.expression or None
        if member in members and not condition:
            out.add(role)
    return out


def _held(roles: set[str], needed: str) -> bool:
    return needed in roles or bool(roles & (BASIC | COVERED_BY.get(needed, set())))


class PolicyReader:
    """The allow policies the checks read, each once: a project's, an account's, a bucket's. None: not readable
    (the caller may not read it), a fact the plan states."""

    def __init__(self, clients: Clients):
        self.clients = clients
        self._cache: dict[tuple[str, str], list | None] = {}

    def bindings(self, scope: str, target: str) -> list | None:
        from google.api_core import exceptions as gx

        key = (scope, target)
        if key not in self._cache:
            c = self.clients
            try:
                if scope == "project":
                    policy = call(c.projects.get_iam_policy, request={"resource": f"projects/{target}", "options": {
                        "requested_policy_version": 3}}, doing=f"reading project {target}'s IAM policy")
                    self._cache[key] = list(policy.bindings)
                elif scope == "account":
                    self._cache[key] = call(c.iam.get_account_policy, "-", target,
                                            doing=f"reading who may act as {target}").get("bindings", [])
                else:
                    self._cache[key] = list(call(lambda **_: c.storage.bucket(target).get_iam_policy(
                        requested_policy_version=3), doing=f"reading gs://{target}'s IAM policy").bindings)
            except (gx.Forbidden, gx.NotFound):
                self._cache[key] = None
        return self._cache[key]

    def holds(self, email: str, grant: Grant, project: str) -> bool | None:
        """Whether `email` holds grant's role on its resource, directly or from the project above it; None where
        neither policy can be read."""
        member = f"serviceAccount:{email}"
        above = self.bindings("project", project if grant.scope != "project" else grant.target)
        own = self.bindings(grant.scope, grant.target) if grant.scope != "project" else None
        if above is None and own is None:
            return None
        roles = _members_roles(above or [], member) | _members_roles(own or [], member)
        return _held(roles, grant.role)


def missing_grants(reader: PolicyReader, email: str, grants: list[Grant], project: str) -> tuple[list[Grant], list[Grant]]:
    """(missing, unknown): the grants `email` does not hold, and those whose policies could not be read."""
    missing, unknown = [], []
    for g in grants:
        held = reader.holds(email, g, project)
        if held is None:
            unknown.append(g)
        elif not held:
            missing.append(g)
    return missing, unknown


def commands(grants: list[Grant], email: str) -> str:
    return "; ".join(g.command(f"serviceAccount:{email}") for g in grants)


def _exists(clients: Clients, email: str) -> bool:
    from google.api_core import exceptions as gx

    try:
        call(clients.iam.get_service_account, "-", email, doing=f"looking up {email}")
        return True
    except (gx.NotFound, gx.Forbidden):
        return False


# -- which accounts ------------------------------------------------------------------------------------------------
def named(spec: JobSpec) -> dict[str, tuple[str, str]]:
    """kind -> (email, spec field) of the accounts the spec names."""
    g = spec.gcp
    if g is None:
        return {}
    if g.service_account:
        return {k: (g.service_account, "gcp.service_account") for k in KINDS}
    return {k: (email, f"gcp.service_accounts.{k}") for k, email in (g.service_accounts or {}).items()}


def _needs(spec: JobSpec, kinds: tuple[str, ...], emails: dict[str, str], project: str, bucket: str,
           firewall_project: str | None) -> dict[str, list[Grant]]:
    """email -> every grant the kinds running as it need (an account for both kinds needs both)."""
    out: dict[str, list[Grant]] = {}
    for k in kinds:
        for g in grants_for(k, spec, project, bucket, emails, firewall_project):
            if g not in out.setdefault(emails[k], []):
                out[emails[k]].append(g)
    # One role on a resource that another on the same resource holds (objectViewer beside objectAdmin) is not asked.
    return {e: [g for g in gs if not any(h.scope == g.scope and h.target == g.target and h.role != g.role
                                         and h.role in COVERED_BY.get(g.role, set()) for h in gs)]
            for e, gs in out.items()}


def decide(clients: Clients, spec: JobSpec, project_number: str, *, workers: int, creation_forbidden: bool,
           firewall_project: str | None) -> Accounts:
    """Which accounts the VMs run as and what `ensure` does to them; refuses (SpecError) where a needed role is
    missing and dsctl may not grant it. Only reads."""
    s = clients.settings
    refuse_none(s.service_account)
    kinds = kinds_for(workers)
    reader = PolicyReader(clients)
    spec_named = named(spec)
    if spec_named:
        for k in kinds:
            if k not in spec_named:  # the spec names one kind's account: the other is dsctl's own (below)
                break
        else:
            emails = {k: spec_named[k][0] for k in kinds}
            return _checked(reader, spec, kinds, emails, {k: spec_named[k][1] for k in kinds}, firewall_project,
                            why="the spec names them")
    emails = {k: spec_named[k][0] if k in spec_named else own_account(k, s.project) for k in kinds}
    sources = {k: spec_named[k][1] if k in spec_named else "dsctl's own" for k in kinds}
    exists = {e: _exists(clients, e) for e in set(emails.values())}
    needs = _needs(spec, kinds, emails, s.project, s.bucket, firewall_project)
    own = {e for k, e in emails.items() if k not in spec_named}
    lacking = _caller_lacks(clients, reader, needs, own, exists)
    if creation_forbidden and not all(exists[e] for e in own):
        lacking.insert(0, "an organization policy forbids new service accounts (constraints/"
                          "iam.disableServiceAccountCreation)")
    if not lacking:
        plans = []
        for email in dict.fromkeys(emails.values()):
            mine = [k for k in kinds if emails[k] == email]
            if email not in own:
                plans.append(_named_plan(reader, spec, email, mine, needs[email], sources))
                continue
            grant = needs[email] if not exists[email] else missing_grants(reader, email, needs[email], s.project)[0]
            plans.append(AccountPlan(email=email, kinds=mine, source=sources[mine[0]], create=not exists[email],
                                     grant=grant))
        accounts = Accounts(plans)
        accounts.caller_grants = _caller_grants(clients, emails, exists)
        for p in plans:
            made = "dsctl makes it now" if p.create else "it exists"
            granted = f"; granting {', '.join(f'{g.role} on {g.where()}' for g in p.grant)}" if p.grant else ""
            accounts.notes.append(f"the {' and '.join(p.kinds)} VMs run as {p.email} ({p.source}: {made}{granted})")
        return accounts
    why = "; ".join(lacking)
    if all(exists[e] for e in own):
        return _checked(reader, spec, kinds, emails, sources, firewall_project, why=why)
    default = default_account(project_number)
    fallback = {k: (default if k not in spec_named else emails[k]) for k in kinds}
    fallback_sources = {k: (sources[k] if k in spec_named else "the Compute Engine default account") for k in kinds}
    return _checked(reader, spec, kinds, fallback, fallback_sources, firewall_project, why=why, may_create=True)


def _caller_lacks(clients: Clients, reader: PolicyReader, needs: dict[str, list[Grant]], own: set[str],
                  exists: dict[str, bool]) -> list[str]:
    """What the caller lacks to make dsctl's own accounts and grant them what they miss: each a phrase."""
    from google.api_core import exceptions as gx

    s = clients.settings
    wanted: list[str] = []
    if not all(exists[e] for e in own):
        wanted += ["iam.serviceAccounts.create", "iam.serviceAccounts.getIamPolicy", "iam.serviceAccounts.setIamPolicy"]
    to_grant = [g for e in own for g in (needs[e] if not exists[e] else missing_grants(reader, e, needs[e],
                                                                                          s.project)[0])]
    if any(g.scope == "project" and g.target == s.project for g in to_grant):
        wanted += ["resourcemanager.projects.getIamPolicy", "resourcemanager.projects.setIamPolicy"]
    if any(g.scope == "account" for g in to_grant):
        wanted += ["iam.serviceAccounts.getIamPolicy", "iam.serviceAccounts.setIamPolicy"]
    out = []
    have = access.granted(clients, access.PROJECT, sorted(set(wanted)), f"checking your permissions on project "
                                                                         f"{s.project}") if wanted else set()
    if set(wanted) - have:
        out.append(f"your credentials lack {', '.join(sorted(set(wanted) - have))} on project {s.project}")
    for bucket in sorted({g.target for g in to_grant if g.scope == "bucket"}):
        try:
            gap = access.missing(clients, access.bucket(bucket), ["storage.buckets.getIamPolicy",
                                                                  "storage.buckets.setIamPolicy"],
                                 f"checking your permissions on gs://{bucket}")
        except gx.NotFound:  # the staging bucket, not made yet: its creator (you) may set its policy
            gap = []
        if gap:
            out.append(f"your credentials lack {', '.join(gap)} on gs://{bucket}")
    for project in sorted({g.target for g in to_grant if g.scope == "project" and g.target != s.project}):
        gap = access.missing(clients, access.Where("project", project), ["resourcemanager.projects.setIamPolicy"],
                             f"checking your permissions on project {project}")
        if gap:
            out.append(f"your credentials lack {', '.join(gap)} on project {project}")
    return out


def _caller_grants(clients: Clients, emails: dict[str, str], exists: dict[str, bool]) -> list[Grant]:
    """Service Account User for the caller on each account dsctl creates that the caller cannot act as from the
    project (Owner, Editor or a project-wide Service Account User): the VMs are created to run as it."""
    new = sorted({e for e in emails.values() if not exists.get(e, True)})
    if not new:
        return []
    acts = "iam.serviceAccounts.actAs" in access.granted(
        clients, access.PROJECT, ["iam.serviceAccounts.actAs"], "checking whether you may act as the VMs' accounts")
    return [] if acts else [Grant(USER_ROLE, "account", e, "you create the VMs that run as it") for e in new]


def _named_plan(reader: PolicyReader, spec: JobSpec, email: str, kinds: list[str], needs: list[Grant],
                sources: dict[str, str]) -> AccountPlan:
    """An account the spec names: checked, never changed."""
    missing, _ = missing_grants(reader, email, needs, reader.clients.settings.project)
    if missing:
        _refuse(reader.clients, email, kinds, missing, sources[kinds[0]], why="")
    return AccountPlan(email=email, kinds=kinds, source=sources[kinds[0]])


def _checked(reader: PolicyReader, spec: JobSpec, kinds: tuple[str, ...], emails: dict[str, str],
             sources: dict[str, str], firewall_project: str | None, *, why: str, may_create: bool = False) -> Accounts:
    """Accounts dsctl will not change: every role they need must be there; what cannot be read is a note."""
    s = reader.clients.settings
    needs = _needs(spec, kinds, emails, s.project, s.bucket, firewall_project)
    accounts = Accounts([])
    for email in dict.fromkeys(emails.values()):
        mine = [k for k in kinds if emails[k] == email]
        missing, unknown = missing_grants(reader, email, needs[email], s.project)
        if missing:
            _refuse(reader.clients, email, mine, missing, sources[mine[0]], why=why, may_create=may_create)
        accounts.plans.append(AccountPlan(email=email, kinds=mine, source=sources[mine[0]]))
        if unknown:
            accounts.notes.append(
                f"the {' and '.join(mine)} VMs run as {email} ({sources[mine[0]]}); its roles on "
                f"{', '.join(sorted({g.where() for g in unknown}))} could not be read (you may not read those "
                "policies), so the run's supervisor checks them itself when it starts")
        else:
            accounts.notes.append(f"the {' and '.join(mine)} VMs run as {email} ({sources[mine[0]]}), which has the "
                                  "roles they need")
    return accounts


def _refuse(clients: Clients, email: str, kinds: list[str], missing: list[Grant], source: str, *, why: str,
            may_create: bool = False) -> None:
    s = clients.settings
    reasons = "; ".join(f"{g.role} on {g.where()} ({g.why})" for g in missing)
    own = ""
    if why:
        own = (f" dsctl would make accounts of its own ({', '.join(own_account(k, s.project) for k in kinds)}) with "
               f"exactly these roles, but {why}: roles/iam.serviceAccountAdmin and "
               "roles/resourcemanager.projectIamAdmin on the project let it.") if may_create else f" ({why}.)"
    field = "gcp.service_account" if source == "gcp.service_account" else (
        source if source.startswith("gcp.") else "gcp.service_accounts")
    raise SpecError(
        f"the run's {' and '.join(kinds)} VMs would run as {email} ({source}), which lacks {len(missing)} role(s) they "
        f"need: {reasons}. Nothing was created.{own} Grant them: {commands(missing, email)}; or name accounts that "
        "have them (gcp.service_accounts).", field=field)


# -- making them -------------------------------------------------------------------------------------------------
def ensure(clients: Clients, accounts: Accounts | None, events: EventSink,
           cancel: threading.Event | None = None) -> bool:
    """In `up`, once the bucket exists and before any VM: make dsctl's own accounts, grant each what it lacks on its
    resource (read, modify, write with the policy's etag, again on a concurrent change), and the caller what lets it
    create VMs that run as them; then wait until the caller's new grants are in effect (the VMs are created as them).
    The VMs' own grants are waited for by the VMs (their startup script and the supervisor retry while Google
    propagates them). Nothing to do: no call that changes anything. True if the VMs' accounts were granted anything
    (the supervisor then waits for it to take effect: handoff.check_supervisor)."""
    from google.api_core import exceptions as gx

    if accounts is None:
        return False
    s = clients.settings
    granted = any(p.grant for p in accounts.plans)
    try:
        for plan in accounts.plans:
            if plan.create:
                kind = plan.kinds[0]
                try:
                    call(clients.iam.create_service_account, s.project, ACCOUNT_IDS[kind], DISPLAY_NAMES[kind],
                         DESCRIPTIONS[kind], doing=f"creating the {kind} VMs' service account {plan.email}")
                    events("cloud", f"created the {' and '.join(plan.kinds)} VMs' service account {plan.email}")
                except gx.Conflict:
                    pass  # made meanwhile (another run): the same account
        caller = f"{'serviceAccount' if clients.caller().endswith('.gserviceaccount.com') else 'user'}:{clients.caller()}"
        for plan in accounts.plans:
            for g in plan.grant:
                _grant(clients, g, f"serviceAccount:{plan.email}")
            if plan.grant:
                events("cloud", f"granted {plan.email} " + ", ".join(f"{g.role} on {g.where()}" for g in plan.grant))
        for g in accounts.caller_grants:
            _grant(clients, g, caller)
            events("cloud", f"granted you ({clients.caller()}) {g.role} on {g.where()}: {g.why}")
    except gx.GoogleAPICallError as exc:
        raise from_api_error(exc, doing="preparing the VMs' service accounts") from exc
    for g in accounts.caller_grants:
        left = access.wait_until_granted(clients, access.account(g.target), ["iam.serviceAccounts.actAs"],
                                         what=f"your {g.role} on {g.target}", progress=lambda m: events("cloud", m),
                                         cancel=cancel)
        if left:
            raise GcpError(f"your new {g.role} on {g.target} was not in effect after {access.PROPAGATION_S:.0f} s "
                           "(Google propagates grants within about 7 minutes). Nothing of the run was created yet; "
                           "run dsctl up again in a few minutes.")
    for plan in accounts.plans:
        plan.create, plan.grant = False, []
    accounts.caller_grants = []
    return granted


def _grant(clients: Clients, grant: Grant, member: str, attempts: int = 8) -> None:
    """Add `member` to the grant's role in its resource's policy: read, modify, write with the etag."""
    from google.api_core import exceptions as gx

    wait = 0.5
    for attempt in range(attempts):
        try:
            _write(clients, grant, member)
            return
        except (gx.Conflict, gx.Aborted, gx.BadRequest, gx.PreconditionFailed) as exc:
            # A concurrent change (409 ABORTED, 412 on a bucket: read again), or an account made seconds ago that the
            # policy service does not know yet (400 "does not exist"): both pass.
            if isinstance(exc, gx.BadRequest) and "does not exist" not in str(exc) or attempt == attempts - 1:
                raise
            time.sleep(wait)
            wait = min(wait * 2, 8.0)


def _write(clients: Clients, grant: Grant, member: str) -> None:
    if grant.scope == "project":
        policy = call(clients.projects.get_iam_policy, request={"resource": f"projects/{grant.target}",
                                                                "options": {"requested_policy_version": 3}},
                      doing=f"reading project {grant.target}'s IAM policy")
        if grant.role not in _members_roles(policy.bindings, member):
            policy.bindings.add(role=grant.role, members=[member])
            call(clients.projects.set_iam_policy, request={"resource": f"projects/{grant.target}", "policy": policy},
                 doing=f"granting {member} {grant.role} on project {grant.target}")
    elif grant.scope == "account":
        own = call(clients.iam.get_account_policy, "-", grant.target, doing=f"reading who may act as {grant.target}")
        bindings = own.setdefault("bindings", [])
        if grant.role not in _members_roles(bindings, member):
            bindings.append({"role": grant.role, "members": [member]})
            call(clients.iam.set_account_policy, "-", grant.target, own,
                 doing=f"granting {member} {grant.role} on {grant.target}")
    else:
        bucket = clients.storage.bucket(grant.target)
        policy = call(lambda **_: bucket.get_iam_policy(requested_policy_version=3),
                      doing=f"reading gs://{grant.target}'s IAM policy")
        if grant.role not in _members_roles(policy.bindings, member):
            policy.bindings.append({"role": grant.role, "members": {member}})
            call(lambda **_: bucket.set_iam_policy(policy), doing=f"granting {member} {grant.role} on gs://{grant.target}")
