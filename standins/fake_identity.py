"""Who calls, and what they may do: Google Cloud's identity and authorization as the stand-ins answer them.

Every call to the stand-ins (fake_gce.py; Cloud Storage through storage_gate.py) carries an OAuth 2.0
access token, as the real APIs require, and is authorized from the allow policies that exist, for that
caller, on the resource it names, the way Google documents it:

* Tokens. The stand-in is its own token service: `POST /token` (the token endpoint of an
  `external_account_authorized_user` credentials file, the kind `gcloud auth application-default
  login --login-config` writes) exchanges a refresh token for an access token; a VM's metadata-server
  stand-in (metadata_server.py) asks `issue_token` for its service account's. A call without a token
  is 401 UNAUTHENTICATED, one with a token the stand-in did not issue (or that expired) too
  ("Request had invalid authentication credentials"; https://cloud.google.com/docs/authentication/rest).
* Allow policies, inherited downward only: organization -> project -> the resources in it (a service
  account, a bucket). "The effective allow policy for a resource is the union of the allow policy set
  at that resource and the allow policy inherited from higher up in the hierarchy"
  (https://cloud.google.com/iam/docs/resource-hierarchy-access-control). A role granted on a service
  account or a bucket is never seen at the project: projects.testIamPermissions answers from the
  project's (and organization's) policy alone.
* Roles are sets of permissions (ROLES, from https://cloud.google.com/iam/docs/understanding-roles and
  each product's roles page, cited there); only the permissions the stand-ins check are listed.
* A grant takes effect `grant_delay_s` after the policy that added it was written: "Changes to allow
  policies typically take effect within 2 minutes ... in some cases, it can take 7 minutes or more"
  (https://cloud.google.com/iam/docs/access-change-propagation). Removals take effect at once.
* An API that is off in the project the call is for answers 403 with ErrorInfo reason SERVICE_DISABLED
  (https://cloud.google.com/service-usage/docs/reference/rest and the error model,
  https://cloud.google.com/apis/design/errors#error_info); `services:batchGet` (Service Usage v1)
  says which are on. A new project has only the services Google enables by default
  (https://cloud.google.com/service-usage/docs/enabled-service#default).

* Deny policies (`deny`): a permission denied to a principal on a resource (or above it) is refused whatever the
  allow policies say, "deny policies are evaluated before allow policies"
  (https://cloud.google.com/iam/docs/deny-overview).

Not modelled: IAM conditions (a conditional binding grants nothing here), groups.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import fnmatch
import hashlib
import json
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import parse_qs, unquote

ORGANIZATION = "organizations/123456789012"

# ================================================================================================
# Roles: the permissions each grants that the stand-ins check (https://cloud.google.com/iam/docs/understanding-roles)
# ================================================================================================
_PROJECT_READ = ("resourcemanager.projects.get", "resourcemanager.projects.list")
_COMPUTE_READ = ("compute.*.get", "compute.*.list", "compute.*.getFromFamily", "compute.projects.get",
                 "compute.networks.getEffectiveFirewalls")
ROLES: dict[str, tuple[str, ...]] = {
    # Basic roles (https://cloud.google.com/iam/docs/understanding-roles#basic): Owner everything; Editor everything
    # but managing access (no setIamPolicy on anything); Viewer reads.
    "roles/owner": ("*",),
    "roles/editor": ("*",),
    "roles/viewer": ("*.get", "*.list", "*.getFromFamily", "*.getIamPolicy", "orgpolicy.policy.get",
                     "compute.networks.getEffectiveFirewalls", "serviceusage.services.get", "serviceusage.services.list"),
    # Compute Engine (https://cloud.google.com/compute/docs/access/iam)
    "roles/compute.admin": ("compute.*", *_PROJECT_READ),
    "roles/compute.instanceAdmin.v1": (
        "compute.instances.*", "compute.disks.*", "compute.images.get", "compute.images.getFromFamily",
        "compute.images.list", "compute.images.useReadOnly", "compute.machineTypes.*", "compute.acceleratorTypes.*",
        "compute.diskTypes.*", "compute.zones.*", "compute.regions.*", "compute.projects.get",
        "compute.zoneOperations.*", "compute.regionOperations.get", "compute.regionOperations.list",
        "compute.globalOperations.get", "compute.globalOperations.list", "compute.networks.get",
        "compute.networks.list", "compute.networks.use", "compute.networks.useExternalIp", "compute.subnetworks.get",
        "compute.subnetworks.list", "compute.subnetworks.use", "compute.subnetworks.useExternalIp",
        "compute.addresses.use", "compute.instanceTemplates.*", "compute.instanceGroups.*", *_PROJECT_READ),
    "roles/compute.securityAdmin": (
        "compute.firewalls.*", "compute.firewallPolicies.*", "compute.securityPolicies.*", "compute.sslPolicies.*",
        "compute.sslCertificates.*", "compute.networks.get", "compute.networks.list", "compute.networks.updatePolicy",
        "compute.networks.getEffectiveFirewalls", "compute.globalOperations.get", "compute.globalOperations.list",
        "compute.projects.get", *_PROJECT_READ),
    "roles/compute.networkAdmin": (
        "compute.networks.*", "compute.subnetworks.*", "compute.routers.*", "compute.addresses.*",
        "compute.firewalls.get", "compute.firewalls.list", "compute.globalOperations.*", "compute.regionOperations.*",
        "compute.regions.*", "compute.zones.*", "compute.projects.get", *_PROJECT_READ),
    "roles/compute.networkUser": (
        "compute.networks.get", "compute.networks.list", "compute.networks.use", "compute.networks.useExternalIp",
        "compute.subnetworks.get", "compute.subnetworks.list", "compute.subnetworks.use",
        "compute.subnetworks.useExternalIp", "compute.firewalls.get", "compute.firewalls.list", *_PROJECT_READ),
    "roles/compute.networkViewer": ("compute.networks.get", "compute.networks.list",
                                    "compute.networks.getEffectiveFirewalls", "compute.subnetworks.get",
                                    "compute.subnetworks.list", "compute.firewalls.get", "compute.firewalls.list",
                                    "compute.routers.get", "compute.routers.list", *_PROJECT_READ),
    "roles/compute.viewer": (*_COMPUTE_READ, *_PROJECT_READ),
    "roles/compute.osLogin": ("compute.instances.osLogin", "compute.projects.get", *_PROJECT_READ),
    "roles/compute.osAdminLogin": ("compute.instances.osLogin", "compute.instances.osAdminLogin",
                                   "compute.projects.get", *_PROJECT_READ),
    "roles/compute.imageUser": ("compute.images.get", "compute.images.getFromFamily", "compute.images.list",
                                "compute.images.useReadOnly"),
    # Service accounts (https://cloud.google.com/iam/docs/service-account-permissions,
    # https://cloud.google.com/iam/docs/roles-permissions/iam)
    "roles/iam.serviceAccountUser": ("iam.serviceAccounts.actAs", "iam.serviceAccounts.get",
                                     "iam.serviceAccounts.list", *_PROJECT_READ),
    "roles/iam.serviceAccountAdmin": (
        "iam.serviceAccounts.create", "iam.serviceAccounts.delete", "iam.serviceAccounts.disable",
        "iam.serviceAccounts.enable", "iam.serviceAccounts.get", "iam.serviceAccounts.getIamPolicy",
        "iam.serviceAccounts.list", "iam.serviceAccounts.setIamPolicy", "iam.serviceAccounts.undelete",
        "iam.serviceAccounts.update", *_PROJECT_READ),
    "roles/iam.serviceAccountTokenCreator": ("iam.serviceAccounts.getAccessToken", "iam.serviceAccounts.signBlob",
                                             "iam.serviceAccounts.signJwt", "iam.serviceAccounts.implicitDelegation"),
    "roles/resourcemanager.projectIamAdmin": ("resourcemanager.projects.getIamPolicy",
                                              "resourcemanager.projects.setIamPolicy"),
    "roles/browser": ("resourcemanager.projects.get", "resourcemanager.projects.list",
                      "resourcemanager.organizations.get"),
    # Cloud Storage (https://cloud.google.com/storage/docs/access-control/iam-roles)
    "roles/storage.admin": ("storage.*", *_PROJECT_READ),
    "roles/storage.objectAdmin": ("storage.objects.*", "storage.multipartUploads.*", "storage.managedFolders.*",
                                  "storage.folders.*", *_PROJECT_READ),
    "roles/storage.objectUser": ("storage.objects.create", "storage.objects.delete", "storage.objects.get",
                                 "storage.objects.list", "storage.objects.restore", "storage.objects.update",
                                 "storage.multipartUploads.*", "storage.folders.*", *_PROJECT_READ),
    "roles/storage.objectCreator": ("storage.objects.create", "storage.multipartUploads.create",
                                    "storage.multipartUploads.abort", "storage.multipartUploads.listParts",
                                    "storage.folders.create"),
    "roles/storage.objectViewer": ("storage.objects.get", "storage.objects.list", "storage.folders.get",
                                   "storage.folders.list", "storage.managedFolders.get", "storage.managedFolders.list",
                                   *_PROJECT_READ),
    "roles/storage.legacyBucketOwner": ("storage.buckets.get", "storage.buckets.update",
                                        "storage.buckets.getIamPolicy", "storage.buckets.setIamPolicy",
                                        "storage.objects.create", "storage.objects.delete", "storage.objects.list"),
    "roles/storage.legacyBucketReader": ("storage.buckets.get", "storage.objects.list"),
    "roles/storage.legacyObjectOwner": ("storage.objects.get", "storage.objects.update"),
    "roles/storage.legacyObjectReader": ("storage.objects.get",),
    # Cloud TPU (https://cloud.google.com/tpu/docs/tpu-iam-admin)
    "roles/tpu.admin": ("tpu.*", *_PROJECT_READ),
    "roles/tpu.viewer": ("tpu.*.get", "tpu.*.list", *_PROJECT_READ),
    # Organization policies (https://cloud.google.com/resource-manager/docs/organization-policy/creating-managing-policies)
    "roles/orgpolicy.policyViewer": ("orgpolicy.constraints.list", "orgpolicy.policies.list", "orgpolicy.policy.get"),
    "roles/orgpolicy.policyAdmin": ("orgpolicy.*",),
    # Service Usage (https://cloud.google.com/service-usage/docs/access-control)
    "roles/serviceusage.serviceUsageViewer": ("serviceusage.services.get", "serviceusage.services.list",
                                              "serviceusage.quotas.get", *_PROJECT_READ),
    "roles/serviceusage.serviceUsageConsumer": ("serviceusage.services.get", "serviceusage.services.list",
                                                "serviceusage.services.use", "serviceusage.quotas.get"),
    "roles/serviceusage.serviceUsageAdmin": ("serviceusage.*", *_PROJECT_READ),
    # Cloud Quotas (https://cloud.google.com/docs/quotas/access-control)
    "roles/cloudquotas.viewer": ("cloudquotas.quotas.get", *_PROJECT_READ),
}
# What Editor lacks: managing who has access ("the Editor role doesn't include permissions to ... manage roles and
# permissions", https://cloud.google.com/iam/docs/understanding-roles#basic), and changing organization policies.
EDITOR_LACKS = ("*.setIamPolicy", "iam.roles.*", "orgpolicy.policy.set", "resourcemanager.projects.delete")

# Cloud Storage's convenience values in a bucket's policy (https://cloud.google.com/storage/docs/access-control/iam#
# convenience-values): a new bucket binds legacyBucketOwner to the project's owners and editors, legacyBucketReader
# to its viewers.
_CONVENIENCE = {"projectOwner": "roles/owner", "projectEditor": "roles/editor", "projectViewer": "roles/viewer"}


def grants(role: str, permission: str, custom: dict[str, tuple[str, ...]] | None = None) -> bool:
    """Whether `role` (predefined, or a custom role in `custom`) holds `permission`."""
    patterns = (custom or {}).get(role) if role.startswith(("projects/", "organizations/")) else ROLES.get(role)
    if not patterns:
        return False
    if role == "roles/editor" and any(fnmatch.fnmatchcase(permission, p) for p in EDITOR_LACKS):
        return False
    return any(fnmatch.fnmatchcase(permission, p) for p in patterns)


# ================================================================================================
# Services: on by default in a new project, and the one each call needs
# ================================================================================================
# "Services enabled by default" in a new project (https://cloud.google.com/service-usage/docs/enabled-service#default):
# none of Compute Engine, Cloud TPU, IAM, Resource Manager, Organization Policy or OS Login.
DEFAULT_SERVICES = frozenset({
    "bigquery.googleapis.com", "bigquerymigration.googleapis.com", "bigquerystorage.googleapis.com",
    "cloudapis.googleapis.com", "cloudtrace.googleapis.com", "datastore.googleapis.com", "logging.googleapis.com",
    "monitoring.googleapis.com", "servicemanagement.googleapis.com", "serviceusage.googleapis.com",
    "sql-component.googleapis.com", "storage-api.googleapis.com", "storage-component.googleapis.com",
    "storage.googleapis.com", "dataform.googleapis.com", "dataplex.googleapis.com", "analyticshub.googleapis.com"})
# What a project dsctl has been run in has on: the defaults and what docs/gcp.md says to enable.
DSCTL_SERVICES = DEFAULT_SERVICES | {
    "compute.googleapis.com", "tpu.googleapis.com", "iam.googleapis.com", "cloudresourcemanager.googleapis.com",
    "orgpolicy.googleapis.com", "oslogin.googleapis.com", "cloudquotas.googleapis.com"}
SERVICE_TITLES = {"compute.googleapis.com": "Compute Engine API", "tpu.googleapis.com": "Cloud TPU API",
                  "iam.googleapis.com": "Identity and Access Management (IAM) API",
                  "cloudresourcemanager.googleapis.com": "Cloud Resource Manager API",
                  "orgpolicy.googleapis.com": "Organization Policy API", "oslogin.googleapis.com": "Cloud OS Login API",
                  "serviceusage.googleapis.com": "Service Usage API", "storage.googleapis.com": "Cloud Storage API",
                  "cloudquotas.googleapis.com": "Cloud Quotas API"}

# Organization Policy v2 constraints the stand-in knows (https://cloud.google.com/resource-manager/docs/organization-
# policy/org-policy-constraints; managed constraints: https://cloud.google.com/resource-manager/docs/organization-
# policy/managed-constraints): list constraints take values/allowAll/denyAll, boolean ones enforce.
ORG_CONSTRAINTS = {
    "compute.vmExternalIpAccess": "list", "compute.trustedImageProjects": "list", "gcp.resourceLocations": "list",
    "compute.requireOsLogin": "boolean", "compute.requireShieldedVm": "boolean",
    "compute.skipDefaultNetworkCreation": "boolean", "compute.disableSerialPortAccess": "boolean",
    "compute.disableGuestAttributesAccess": "boolean", "compute.disableNestedVirtualization": "boolean",
    "iam.disableServiceAccountCreation": "boolean", "iam.disableServiceAccountKeyCreation": "boolean",
    "iam.automaticIamGrantsForDefaultServiceAccounts": "boolean", "storage.uniformBucketLevelAccess": "boolean",
    "compute.managed.vmExternalIpAccess": "boolean", "compute.managed.requireOsLogin": "boolean",
    "compute.managed.disableSerialPortAccess": "boolean", "compute.managed.disableGuestAttributesAccess": "boolean",
    "iam.managed.disableServiceAccountCreation": "boolean", "iam.managed.disableServiceAccountKeyCreation": "boolean",
}


def location_admitted(rules: list[dict], location: str) -> bool:
    """Whether gcp.resourceLocations' rules admit `location` (a zone us-central1-b, a region us-central1, a
    multi-region US), from https://cloud.google.com/resource-manager/docs/organization-policy/defining-locations:
    values are locations (`us-central1`, `us-central1-b`, with an optional "is:") or value groups ("in:us-locations":
    every US location; "in:us-central1-locations": that region and its zones); a zone is also admitted by its
    region's group. deniedValues and denyAll win; no rule admits all."""
    location = location.lower()
    region = location if location.count("-") == 1 else location.rsplit("-", 1)[0]

    def matches(value: str) -> bool:
        value = value.lower().removeprefix("is:")
        if value.startswith("in:"):
            group = value[3:].removesuffix("-locations")
            return region == group or location == group or (group in ("us", "europe", "asia", "northamerica",
                                                                       "southamerica", "australia", "me", "africa")
                                                            and region.startswith(group))
        return value == location

    denied = [v for r in rules for v in (r.get("values") or {}).get("deniedValues", [])]
    if any(matches(v) for v in denied) or any(r.get("denyAll") for r in rules):
        return False
    allowed = [v for r in rules for v in (r.get("values") or {}).get("allowedValues", [])]
    return any(r.get("allowAll") for r in rules) or not allowed or any(matches(v) for v in allowed)


class ApiRefusal(Exception):
    """A refusal in the google.rpc.Status form (fake_gce.ApiError wraps it for each API's own shape)."""

    def __init__(self, status: int, message: str, grpc: str, reason: str, details: list | None = None):
        super().__init__(message)
        self.status, self.message, self.grpc, self.reason, self.details = status, message, grpc, reason, details or []


def unauthenticated(why: str = "missing") -> ApiRefusal:
    """401: no token, or one the service does not accept (https://cloud.google.com/docs/authentication/rest)."""
    if why == "missing":
        msg = ("Request is missing required authentication credential. Expected OAuth 2 access token, login cookie or "
               "other valid authentication credential. See https://developers.google.com/identity/sign-in/web/"
               "devconsole-project.")
    else:
        msg = ("Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie or other "
               "valid authentication credential. See https://developers.google.com/identity/sign-in/web/"
               "devconsole-project.")
    return ApiRefusal(401, msg, "UNAUTHENTICATED", "required" if why == "missing" else "authError",
                      [{"@type": "type.googleapis.com/google.rpc.ErrorInfo",
                        "reason": "CREDENTIALS_MISSING" if why == "missing" else "ACCESS_TOKEN_TYPE_UNSUPPORTED",
                        "domain": "googleapis.com"}])


@dataclass
class Policy:
    """An allow policy: bindings (role -> members) and, per (role, member), when the grant takes effect."""

    bindings: list[dict] = field(default_factory=list)
    version: int = 1
    serial: int = 0
    since: dict[tuple[str, str], float] = field(default_factory=dict)

    def etag(self) -> str:
        digest = hashlib.sha1(json.dumps(self.bindings, sort_keys=True).encode() + str(self.serial).encode())
        return base64.b64encode(digest.digest()[:8]).decode()

    def view(self) -> dict:
        out: dict = {"version": self.version, "etag": self.etag()}
        if self.bindings:
            out["bindings"] = copy.deepcopy(self.bindings)
        return out

    def pairs(self) -> list[tuple[str, str, bool]]:
        """(role, member, conditional) of every binding."""
        return [(b.get("role", ""), m, bool(b.get("condition"))) for b in self.bindings for m in b.get("members", [])]

    def write(self, bindings: list[dict], version: int, now: float, delay_s: float) -> None:
        """Replace the bindings; a (role, member) pair new to the policy takes effect `delay_s` from now."""
        before = {(r, m) for r, m, _ in self.pairs()}
        self.bindings, self.version, self.serial = copy.deepcopy(bindings), version, self.serial + 1
        after = {(r, m) for r, m, _ in self.pairs()}
        self.since = {k: (self.since.get(k, now) if k in before else now + delay_s) for k in after}

    def add(self, role: str, member: str, effective_at: float) -> None:
        for b in self.bindings:
            if b.get("role") == role and not b.get("condition"):
                if member not in b.setdefault("members", []):
                    b["members"].append(member)
                break
        else:
            self.bindings.append({"role": role, "members": [member]})
        self.serial += 1
        self.since.setdefault((role, member), effective_at)


def member_of(account: str) -> str:
    """A binding's member for an account (or a member already written as one: allUsers, serviceAccount:...)."""
    if ":" in account or account in ("allUsers", "allAuthenticatedUsers"):
        return account
    return f"serviceAccount:{account}" if account.endswith(".gserviceaccount.com") else f"user:{account}"


class IdentityApis:
    """Tokens, allow policies, services and organization policies; IAM service accounts, Resource Manager's IAM
    calls, Organization Policy and OS Login; FakeCloud's other APIs authorize through `require`.

    Tests shape who may do what with `define_project` (a project's owners, services and network, in or out of the
    organization), `grant`/`revoke` (a role on a project, an organization, a service account or a bucket),
    `add_custom_role`, `grant_delay_s`, `set_org_policy`, `disable_service`, and sign callers in with
    `sign_in` (a refresh token for a credentials file) or `issue_token` (a VM's metadata server)."""

    lock: threading.RLock
    created: list

    def _init_identity(self) -> None:
        # Set before a project's first use: its default Compute Engine account gets no role, as under
        # iam.automaticIamGrantsForDefaultServiceAccounts (organizations made since May 2024).
        self.secure_by_default = False
        self.grant_delay_s = 0.0
        self.policies: dict[str, Policy] = {}  # resource name -> its own allow policy
        self.custom_roles: dict[str, tuple[str, ...]] = {}  # projects/P/roles/NAME -> permissions
        self.denials: list[tuple[str, str, str]] = []  # (member, permission, resource) of deny policies
        self.tokens: dict[str, tuple[str, float]] = {}  # access token -> (account, expiry)
        self.refresh_tokens: dict[str, str] = {}  # refresh token -> account
        self.token_lifetime_s = 3599
        self.services: dict[str, set[str]] = {}  # project id -> enabled services
        self.project_options: dict[str, dict] = {}  # project id -> define_project's options, before first use
        self.service_accounts: dict[str, dict] = {}  # email -> ServiceAccount resource
        self.org_policies: dict[str, list[dict]] = {}  # constraint name -> the effective policy's rules (in the org)
        self.oslogin_profiles: dict[str, dict] = {}  # account email -> {"keys": {fingerprint: key}}
        # POSIX usernames an administrator set (Cloud Identity lets them replace the derived one), by account: the
        # test sshd has one local user, so tests give every identity that user.
        self.posix_usernames: dict[str, str] = {}
        self.every_posix_username: str | None = None  # one username for every identity (the test sshd's one user)
        self.on_oslogin_changed: list[Callable[[], None]] = []  # a key was imported or deleted (the guest agent)
        self.bucket_projects: dict[str, str] = {}  # bucket -> the project that holds it (storage_gate.py)
        self.default_bucket_project: str | None = None  # a bucket the stand-in never saw created belongs here
        self._who = threading.local()  # the caller of the request this thread serves
        self.authorizations: list[tuple[str | None, str, str, bool]] = []  # (member, permission, resource, allowed)

    def project_number(self, project: str) -> str:  # FakeCloud's
        raise NotImplementedError

    def _project(self, project: str) -> dict:  # FakeCloud's
        raise NotImplementedError

    # -- projects: who owns them, what is on -----------------------------------------------------------------
    def define_project(self, project: str, *, owners: tuple[str, ...] = (), services: frozenset[str] | None = None,
                       organization: str | None = ORGANIZATION, default_network: bool = True,
                       default_account_roles: tuple[str, ...] | None = None) -> None:
        """A project as it is before its first use: `owners` hold roles/owner on it; `services` on (default:
        DSCTL_SERVICES); in `organization` or none (a personal project has no parent, so no organization policy
        applies); with or without the default network (compute.skipDefaultNetworkCreation). Its Compute Engine
        default service account gets `default_account_roles` (default: Editor, as before May 2024; () under
        iam.automaticIamGrantsForDefaultServiceAccounts)."""
        with self.lock:
            assert project not in self.services, f"project {project} is already in use"
            self.project_options[project] = dict(organization=organization, default_network=default_network,
                                                 default_account_roles=default_account_roles)
            self.services[project] = set(DSCTL_SERVICES if services is None else services)
            for owner in owners:
                self._policy(f"projects/{project}").add("roles/owner", member_of(owner), 0.0)

    def organization_of(self, project: str) -> str | None:
        return self.project_options.get(project, {}).get("organization", ORGANIZATION)

    def _project_created(self, project: str) -> None:
        """FakeCloud._project calls this once a project exists: its default account and that account's roles."""
        self.services.setdefault(project, set(DSCTL_SERVICES))
        default = self._default_account(project)
        roles = self.project_options.get(project, {}).get("default_account_roles")
        if roles is None:
            roles = () if self.secure_by_default or self.org_policy_enforced(
                project, "iam.automaticIamGrantsForDefaultServiceAccounts") else ("roles/editor",)
        for role in roles:
            self._policy(f"projects/{project}").add(role, f"serviceAccount:{default}", 0.0)

    def enable_service(self, project: str, service: str) -> None:
        with self.lock:
            self.services.setdefault(project, set(DSCTL_SERVICES)).add(service)

    def disable_service(self, project: str, service: str) -> None:
        with self.lock:
            self.services.setdefault(project, set(DSCTL_SERVICES)).discard(service)

    def require_service(self, project: str, service: str) -> None:
        """403 SERVICE_DISABLED where `service` is off in `project` (the project the call consumes)."""
        with self.lock:
            if project in ("-", "_") or project in GOOGLE_PROJECTS:
                return
            self._project(project)
            if service in self.services.get(project, DSCTL_SERVICES):
                return
            number = self.project_number(project)
        title = SERVICE_TITLES.get(service, service)
        raise ApiRefusal(
            403, f"{title} has not been used in project {number} before or it is disabled. Enable it by visiting "
                 f"https://console.developers.google.com/apis/api/{service}/overview?project={number} then retry. If "
                 "you enabled this API recently, wait a few minutes for the action to propagate to our systems and "
                 "retry.", "PERMISSION_DENIED", "accessNotConfigured",
            [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "SERVICE_DISABLED",
              "domain": "googleapis.com",
              "metadata": {"service": service, "consumer": f"projects/{number}", "serviceTitle": title,
                           "containerInfo": number, "activationUrl":
                           f"https://console.developers.google.com/apis/api/{service}/overview?project={number}"}},
             {"@type": "type.googleapis.com/google.rpc.Help", "links": [{
                 "description": "Google developers console API activation",
                 "url": f"https://console.developers.google.com/apis/api/{service}/overview?project={number}"}]}])

    def service_usage_batch_get(self, project: str, query: dict) -> dict:
        """services:batchGet (https://cloud.google.com/service-usage/docs/reference/rest/v1/services/batchGet): at most
        30 names, each projects/{P}/services/{NAME} of this parent; needs serviceusage.services.get."""
        names = query.get("names") or []
        if not names or len(names) > 30:
            raise ApiRefusal(400, "names must name between 1 and 30 services.", "INVALID_ARGUMENT", "badRequest")
        with self.lock:
            self.require("serviceusage.services.get", f"projects/{project}")
            number = self.project_number(project)
            on = self.services.get(project, set(DSCTL_SERVICES))
            out = []
            for name in names:
                m = re.fullmatch(r"projects/([^/]+)/services/([^/]+)", name)
                if not m or m.group(1) not in (project, number):
                    raise ApiRefusal(400, f"Invalid service name {name}.", "INVALID_ARGUMENT", "badRequest")
                service = m.group(2)
                out.append({"name": f"projects/{number}/services/{service}", "parent": f"projects/{number}",
                            "config": {"name": service, "title": SERVICE_TITLES.get(service, service)},
                            "state": "ENABLED" if service in on else "DISABLED"})
            return {"services": out}

    # -- tokens: who calls ---------------------------------------------------------------------------------------
    def sign_in(self, account: str) -> str:
        """A refresh token for `account`, for a credentials file (the token endpoint exchanges it)."""
        token = "1//dsctl-test-" + secrets.token_urlsafe(24)
        with self.lock:
            self.refresh_tokens[token] = account
        return token

    def issue_token(self, account: str, lifetime_s: float | None = None) -> str:
        token = "ya29.dsctl-test-" + secrets.token_urlsafe(24)
        with self.lock:
            self.tokens[token] = (account, time.time() + (lifetime_s or self.token_lifetime_s))
        return token

    def token_endpoint(self, raw: bytes) -> dict:
        """POST /token, the OAuth 2.0 refresh grant (RFC 6749 section 6) an external_account_authorized_user
        credentials file makes (google-auth's sts.Client.refresh_token): a form body with grant_type=refresh_token and
        refresh_token. An unknown refresh token is 400 invalid_grant."""
        form = {k: v[0] for k, v in parse_qs(raw.decode()).items()}
        if form.get("grant_type") != "refresh_token":
            raise ApiRefusal(400, "unsupported_grant_type", "INVALID_ARGUMENT", "unsupported_grant_type")
        with self.lock:
            account = self.refresh_tokens.get(form.get("refresh_token", ""))
        if account is None:
            raise ApiRefusal(400, "invalid_grant", "INVALID_ARGUMENT", "invalid_grant")
        return {"access_token": self.issue_token(account), "expires_in": self.token_lifetime_s,
                "token_type": "Bearer", "issued_token_type": "urn:ietf:params:oauth:token-type:access_token"}

    def account_of(self, token: str) -> str | None:
        with self.lock:
            account, expiry = self.tokens.get(token, (None, 0.0))
        return account if account and expiry > time.time() else None

    def authenticate(self, authorization: str | None, style: str = "google") -> None:
        """Who calls on this thread, from the request's Authorization header: None (anonymous) without one; 401 for a
        token the stand-in did not issue or that expired."""
        self._who.style = style
        self._who.member = None
        if not authorization:
            return
        kind, _, token = authorization.partition(" ")
        account = self.account_of(token.strip()) if kind.lower() == "bearer" else None
        if account is None:
            raise unauthenticated("invalid")
        self._who.member = member_of(account)

    @contextlib.contextmanager
    def acting_as(self, account: str):
        """A test's direct call (not over HTTP) made as `account`."""
        before = getattr(self._who, "member", None)
        self._who.member = member_of(account)
        try:
            yield
        finally:
            self._who.member = before

    @property
    def caller(self) -> str | None:
        """The member (user:EMAIL, serviceAccount:EMAIL) of the call this thread serves; None if anonymous."""
        return getattr(self._who, "member", None)

    # -- allow policies --------------------------------------------------------------------------------------
    def _policy(self, resource: str) -> Policy:
        policy = self.policies.get(resource)
        if policy is None:
            policy = self.policies[resource] = Policy()
            bucket = re.fullmatch(r"projects/_/buckets/([^/]+)", resource)
            if bucket:  # a new bucket's policy: the convenience values (storage's own default)
                project = self.bucket_project(bucket.group(1))
                for value, role in (("projectOwner", "roles/storage.legacyBucketOwner"),
                                    ("projectEditor", "roles/storage.legacyBucketOwner"),
                                    ("projectViewer", "roles/storage.legacyBucketReader")):
                    policy.add(role, f"{value}:{project}", 0.0)
        return policy

    def bucket_project(self, bucket: str) -> str:
        return self.bucket_projects.get(bucket) or self.default_bucket_project or "unknown-project"

    def ancestors(self, resource: str) -> list[str]:
        """The resource and what it inherits from, nearest first."""
        m = re.fullmatch(r"projects/_/buckets/([^/]+)(/.*)?", resource)
        if m:
            project = self.bucket_project(m.group(1))
            return [f"projects/_/buckets/{m.group(1)}", *self.ancestors(f"projects/{project}")]
        m = re.fullmatch(r"projects/([^/]+)(/.*)?", resource)
        if m:
            project = m.group(1)
            if project in ("-", "_"):
                return [resource]
            own = [resource] if m.group(2) else []
            org = self.organization_of(project)
            return own + [f"projects/{project}"] + ([org] if org else [])
        return [resource]

    def _holds(self, member: str, permission: str, resource: str, now: float) -> bool:
        if any(m == member and p == permission and r in self.ancestors(resource) for m, p, r in self.denials):
            return False
        for name in self.ancestors(resource):
            policy = self.policies.get(name)
            if policy is None and re.fullmatch(r"projects/_/buckets/[^/]+", name):
                policy = self._policy(name)
            if policy is None:
                continue
            for role, who, conditional in policy.pairs():
                if conditional or policy.since.get((role, who), 0.0) > now:
                    continue
                if not grants(role, permission, self.custom_roles):
                    continue
                if who == member or who == "allUsers" or (who == "allAuthenticatedUsers" and member):
                    return True
                value, _, project = who.partition(":")
                if value in _CONVENIENCE and self._holds_role(member, _CONVENIENCE[value], project, now):
                    return True
        return False

    def _holds_role(self, member: str, role: str, project: str, now: float) -> bool:
        policy = self.policies.get(f"projects/{project}")
        return bool(policy) and any(r == role and w == member and not c and policy.since.get((r, w), 0.0) <= now
                                    for r, w, c in policy.pairs())

    def allowed(self, member: str | None, permission: str, resource: str) -> bool:
        with self.lock:
            ok = bool(member) and self._holds(member, permission, resource, time.time())  # type: ignore[arg-type]
            self.authorizations.append((member, permission, resource, ok))
            return ok

    def require(self, permission: str, resource: str, *, message: str | None = None) -> None:
        """The caller may `permission` on `resource`, or the call is refused: 401 anonymous, 403 otherwise."""
        member = self.caller
        if member is None:
            raise unauthenticated()
        if self.allowed(member, permission, resource):
            return
        style = getattr(self._who, "style", "google")
        if message is None:
            if style == "compute":  # Compute Engine's own wording (https://cloud.google.com/compute/docs/troubleshooting)
                message = f"Required '{permission}' permission for '{resource}'"
            elif style == "storage":
                message = (f"{member.partition(':')[2]} does not have {permission} access to the Google Cloud Storage "
                           f"{'object' if '/objects/' in resource else 'bucket'}. Permission '{permission}' denied on "
                           "resource (or it may not exist).")
            else:
                message = f"Permission '{permission}' denied on resource '{resource}' (or it may not exist)."
        raise ApiRefusal(403, message, "PERMISSION_DENIED", "forbidden", [
            {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "IAM_PERMISSION_DENIED",
             "domain": "iam.googleapis.com", "metadata": {"permission": permission, "resource": resource}}])

    def test_permissions(self, resource: str, permissions: list[str]) -> list[str]:
        """testIamPermissions on `resource` for the caller: the subset it holds. "Permissions with wildcards (such
        as * or storage.*) are not allowed" (https://cloud.google.com/resource-manager/reference/rest/v3/projects/
        testIamPermissions)."""
        member = self.caller
        if member is None:
            raise unauthenticated()
        for perm in permissions:
            if "*" in perm or not re.fullmatch(r"[a-z][a-zA-Z0-9]*(\.[a-zA-Z0-9]+){2,}", perm):
                raise ApiRefusal(400, f"Permission {perm} is not valid.", "INVALID_ARGUMENT", "badRequest")
        return [p for p in permissions if self.allowed(member, p, resource)]

    def grant(self, member: str, role: str, resource: str, *, delayed: bool = False) -> None:
        """A test's grant (an administrator's), in effect at once unless `delayed` (then after grant_delay_s)."""
        member = member_of(member)
        with self.lock:
            self._policy(resource).add(role, member, time.time() + (self.grant_delay_s if delayed else 0.0))

    def revoke(self, member: str, role: str, resource: str) -> None:
        member = member_of(member)
        with self.lock:
            policy = self._policy(resource)
            for b in policy.bindings:
                if b.get("role") == role and member in b.get("members", []):
                    b["members"].remove(member)
            policy.bindings = [b for b in policy.bindings if b.get("members")]
            policy.serial += 1
            policy.since.pop((role, member), None)

    def deny(self, member: str, permission: str, resource: str) -> None:
        """A deny policy: `member` may not `permission` on `resource` and what it holds, whatever it is granted."""
        with self.lock:
            self.denials.append((member_of(member), permission, resource))

    def add_custom_role(self, project: str, name: str, permissions: list[str]) -> str:
        role = f"projects/{project}/roles/{name}"
        with self.lock:
            self.custom_roles[role] = tuple(permissions)
        return role

    def roles_on(self, resource: str, account: str) -> set[str]:
        """For assertions: the roles `resource`'s own policy grants `account`."""
        member = member_of(account)
        with self.lock:
            return {r for r, w, _ in self._policy(resource).pairs() if w == member}

    def roles_of(self, project: str, email: str) -> set[str]:
        return self.roles_on(f"projects/{project}", email)

    def _set_policy(self, resource: str, body: dict) -> dict:
        """setIamPolicy: a stale etag is 409 ABORTED; members and roles must be well formed; a service account
        member must exist (https://cloud.google.com/iam/docs/reference/rest/v1/Policy)."""
        policy = body.get("policy") or {}
        stored = self._policy(resource)
        if policy.get("etag") and policy["etag"] != stored.etag():
            raise ApiRefusal(409, "There were concurrent policy changes. Please retry the whole read-modify-write "
                             "with exponential backoff.", "ABORTED", "aborted")
        bindings = policy.get("bindings") or []
        for b in bindings:
            if not ROLE_RE.fullmatch(b.get("role") or ""):
                raise ApiRefusal(400, f"Role {b.get('role')} is not supported for this resource.", "INVALID_ARGUMENT",
                                 "badRequest")
            for m in b.get("members") or []:
                if not MEMBER_RE.fullmatch(m):
                    raise ApiRefusal(400, f"Invalid member: {m}", "INVALID_ARGUMENT", "badRequest")
                email = m.removeprefix("serviceAccount:")
                if m.startswith("serviceAccount:") and email.endswith(".iam.gserviceaccount.com") \
                        and email not in self.service_accounts:
                    raise ApiRefusal(400, f"Service account {email} does not exist.", "INVALID_ARGUMENT", "badRequest")
        stored.write(bindings, int(policy.get("version", 1)), time.time(), self.grant_delay_s)
        return stored.view()

    # -- Resource Manager's IAM calls -------------------------------------------------------------------------
    def crm_get_iam_policy(self, project: str) -> dict:
        with self.lock:
            self.require_service(project, "cloudresourcemanager.googleapis.com")
            self._project(project)
            self.require("resourcemanager.projects.getIamPolicy", f"projects/{project}")
            return self._policy(f"projects/{project}").view()

    def crm_set_iam_policy(self, project: str, body: dict) -> dict:
        with self.lock:
            self.require_service(project, "cloudresourcemanager.googleapis.com")
            self._project(project)
            self.require("resourcemanager.projects.setIamPolicy", f"projects/{project}")
            return self._set_policy(f"projects/{project}", body)

    # -- service accounts ------------------------------------------------------------------------------------
    def _default_account(self, project: str) -> str:
        """The project's Compute Engine default service account exists with the project."""
        email = f"{self.project_number(project)}-compute@developer.gserviceaccount.com"
        if email not in self.service_accounts:
            self._new_account(project, email, "Compute Engine default service account")
        return email

    def _new_account(self, project: str, email: str, display: str, description: str = "") -> dict:
        unique = str(100000000000000000000 + int(hashlib.sha1(email.encode()).hexdigest()[:15], 16) % 10**20)
        sa = {"name": f"projects/{project}/serviceAccounts/{email}", "projectId": project, "uniqueId": unique,
              "email": email, "displayName": display, "etag": "MDEwMjE5MjA=", "oauth2ClientId": unique}
        if description:
            sa["description"] = description
        self.service_accounts[email] = sa
        return sa

    def _account(self, project: str, email: str) -> dict:
        """The account projects/{PROJECT or -}/serviceAccounts/{EMAIL or UNIQUE_ID} names; 404 if none. The caller
        must hold `iam.serviceAccounts.get` on it, and a 403 hides whether it exists."""
        email = unquote(email)
        if project != "-":
            self._project(project)
        sa = self.service_accounts.get(email) or next(
            (a for a in self.service_accounts.values() if a["uniqueId"] == email), None)
        owner = sa["projectId"] if sa else (project if project != "-" else email.partition("@")[2].split(".")[0])
        self.require_service(owner, "iam.googleapis.com")
        self.require("iam.serviceAccounts.get", f"projects/{owner}/serviceAccounts/{email}")
        if sa is None or (project != "-" and sa["projectId"] != project):
            raise ApiRefusal(404, f"Unknown service account: projects/{project}/serviceAccounts/{email}", "NOT_FOUND",
                             "notFound")
        return sa

    def account_resource(self, email: str) -> str:
        sa = self.service_accounts.get(email)
        project = sa["projectId"] if sa else email.partition("@")[2].split(".")[0]
        return f"projects/{project}/serviceAccounts/{email}"

    def iam_get_account(self, project: str, email: str) -> dict:
        with self.lock:
            return dict(self._account(project, email))

    def iam_create_account(self, project: str, body: dict) -> dict:
        """projects.serviceAccounts.create: accountId 6-30 characters of [a-z]([-a-z0-9]*[a-z0-9]); only
        displayName and description are assignable; an existing one is 409 ALREADY_EXISTS; refused under
        iam.disableServiceAccountCreation (and its managed twin) with FAILED_PRECONDITION."""
        with self.lock:
            self._project(project)
            self.require_service(project, "iam.googleapis.com")
            self.require("iam.serviceAccounts.create", f"projects/{project}")
            for constraint in ("iam.disableServiceAccountCreation", "iam.managed.disableServiceAccountCreation"):
                if self.org_policy_enforced(project, constraint):
                    raise ApiRefusal(400, f"Service account creation is not allowed on this project (constraints/"
                                     f"{constraint}).", "FAILED_PRECONDITION", "failedPrecondition")
            account_id = body.get("accountId") or ""
            if not (6 <= len(account_id) <= 30 and SA_ACCOUNT_ID_RE.fullmatch(account_id)):
                raise ApiRefusal(400, f"Invalid account ID '{account_id}'. The account ID must be between 6 and 30 "
                                 "characters and match the regular expression [a-z]([-a-z0-9]*[a-z0-9]).",
                                 "INVALID_ARGUMENT", "badRequest")
            given = body.get("serviceAccount") or {}
            extra = set(given) - {"displayName", "description"}
            if extra:
                raise ApiRefusal(400, f"Only displayName and description can be set on create, not {sorted(extra)}.",
                                 "INVALID_ARGUMENT", "badRequest")
            email = f"{account_id}@{project}.iam.gserviceaccount.com"
            if email in self.service_accounts:
                raise ApiRefusal(409, f"Service account {account_id} already exists within project "
                                 f"projects/{project}.", "ALREADY_EXISTS", "alreadyExists")
            self.created.append(("service_account", copy.deepcopy(body)))
            return dict(self._new_account(project, email, given.get("displayName", ""), given.get("description", "")))

    def iam_get_account_policy(self, project: str, email: str) -> dict:
        with self.lock:
            sa = self._account(project, email)
            resource = self.account_resource(sa["email"])
            self.require("iam.serviceAccounts.getIamPolicy", resource)
            return self._policy(resource).view()

    def iam_set_account_policy(self, project: str, email: str, body: dict) -> dict:
        with self.lock:
            sa = self._account(project, email)
            resource = self.account_resource(sa["email"])
            self.require("iam.serviceAccounts.setIamPolicy", resource)
            return self._set_policy(resource, body)

    def iam_test_account_permissions(self, project: str, email: str, body: dict) -> dict:
        """serviceAccounts.testIamPermissions: the caller's permissions on the account itself, its own policy and
        what it inherits (https://cloud.google.com/iam/docs/reference/rest/v1/projects.serviceAccounts/
        testIamPermissions). An account that does not exist is 404."""
        with self.lock:
            email = unquote(email)
            sa = self.service_accounts.get(email)
            owner = sa["projectId"] if sa else email.partition("@")[2].split(".")[0]
            self.require_service(owner, "iam.googleapis.com")
            if self.caller is None:
                raise unauthenticated()
            if sa is None:
                raise ApiRefusal(404, f"Unknown service account: {email}", "NOT_FOUND", "notFound")
            granted = self.test_permissions(self.account_resource(email), list(body.get("permissions") or []))
            return {"permissions": granted} if granted else {}

    # -- organization policies -------------------------------------------------------------------------------
    def set_org_policy(self, constraint: str, rules: list[dict] | None) -> None:
        """The effective policy of `constraint` (e.g. "compute.vmExternalIpAccess") in the organization; None: not
        set. Projects outside the organization are not bound by it."""
        assert constraint in ORG_CONSTRAINTS, constraint
        with self.lock:
            if rules is None:
                self.org_policies.pop(constraint, None)
            else:
                self.org_policies[constraint] = copy.deepcopy(rules)

    def org_rules(self, project: str, constraint: str) -> list[dict]:
        return list(self.org_policies.get(constraint, [])) if self.organization_of(project) else []

    def org_policy_enforced(self, project: str, constraint: str) -> bool:
        return any(r.get("enforce") for r in self.org_rules(project, constraint) if not r.get("condition"))

    def orgpolicy_effective(self, project: str, constraint: str) -> dict:
        """projects.policies.getEffectivePolicy (v2): needs orgpolicy.policy.get; an unknown constraint is 400."""
        with self.lock:
            self._project(project)
            self.require_service(project, "orgpolicy.googleapis.com")
            self.require("orgpolicy.policy.get", f"projects/{project}")
            if constraint not in ORG_CONSTRAINTS:
                raise ApiRefusal(400, f"Constraint constraints/{constraint} is not supported.", "INVALID_ARGUMENT",
                                 "badRequest")
            number = self.project_number(project)
            spec: dict = {"etag": "CAE=", "updateTime": "2024-05-03T00:00:00Z"}
            rules = self.org_rules(project, constraint)
            if rules:
                spec["rules"] = copy.deepcopy(rules)
            return {"name": f"projects/{number}/policies/{constraint}", "spec": spec}

    # -- OS Login v1 (https://cloud.google.com/compute/docs/oslogin/rest/v1/users) ---------------------------------
    def _posix_username(self, account: str) -> str:
        """The POSIX username OS Login gives: a user's email with every character that is not a letter or digit as
        "_" (user@example.com -> user_example_com); a service account's is sa_<uniqueId>."""
        if account in self.posix_usernames:
            return self.posix_usernames[account]
        if self.every_posix_username:
            return self.every_posix_username
        sa = self.service_accounts.get(account)
        if account.endswith(".gserviceaccount.com"):
            unique = sa["uniqueId"] if sa else str(int(hashlib.sha1(account.encode()).hexdigest()[:15], 16))
            return f"sa_{unique}"
        return re.sub(r"[^a-zA-Z0-9]", "_", account)[:32]

    def _login_profile(self, account: str, project: str | None) -> dict:
        prof = self.oslogin_profiles.setdefault(account, {"keys": {}})
        now_us = time.time() * 1e6
        keys = {fp: k for fp, k in prof["keys"].items()
                if not k.get("expirationTimeUsec") or int(k["expirationTimeUsec"]) > now_us}
        username = self._posix_username(account)
        uid = str(1000 + int(hashlib.sha1(account.encode()).hexdigest()[:6], 16) % 100000)
        posix = {"primary": True, "username": username, "uid": uid, "gid": uid,
                 "homeDirectory": f"/home/{username}", "shell": "/bin/bash", "gecos": account,
                 "systemId": "", "accountId": project or "", "operatingSystemType": "LINUX",
                 "name": f"users/{account}/projects/{project or ''}"}
        return {"name": account, "posixAccounts": [posix], "sshPublicKeys": copy.deepcopy(keys)}

    def _oslogin_user(self, user: str, project: str | None) -> str:
        """users/{user} is the caller's own profile: "The user ... must be the authenticated user"
        (https://cloud.google.com/compute/docs/oslogin/rest/v1/users/importSshPublicKey)."""
        account = unquote(user)
        if "@" not in account:
            raise ApiRefusal(400, f"Invalid user: users/{account}", "INVALID_ARGUMENT", "badRequest")
        if project:
            self.require_service(project, "oslogin.googleapis.com")
        if self.caller is None:
            raise unauthenticated()
        if self.caller.partition(":")[2] != account:
            raise ApiRefusal(403, "The caller does not have permission", "PERMISSION_DENIED", "forbidden")
        return account

    def oslogin_import_key(self, user: str, query: dict, body: dict) -> dict:
        """users.importSshPublicKey: the key (OpenSSH "type base64 [comment]") with an optional
        expirationTimeUsec; returns the login profile. Keys are identified by their SHA-256 fingerprint."""
        import binascii

        project = (query.get("projectId") or [None])[0]
        with self.lock:
            account = self._oslogin_user(user, project)
        key = (body.get("key") or "").strip()
        parts = key.split()
        try:
            blob = base64.b64decode(parts[1], validate=True) if len(parts) >= 2 else b""
        except (binascii.Error, ValueError):
            blob = b""
        if not parts or not parts[0].startswith(("ssh-", "ecdsa-", "sk-")) or not blob:
            raise ApiRefusal(400, "Invalid key format.", "INVALID_ARGUMENT", "badRequest")
        with self.lock:
            fingerprint = hashlib.sha256(blob).hexdigest()
            entry = {"key": key, "fingerprint": fingerprint, "name": f"users/{account}/sshPublicKeys/{fingerprint}"}
            if body.get("expirationTimeUsec"):
                entry["expirationTimeUsec"] = str(body["expirationTimeUsec"])
            self.oslogin_profiles.setdefault(account, {"keys": {}})["keys"][fingerprint] = entry
            profile = self._login_profile(account, project)
        for hook in self.on_oslogin_changed:
            hook()
        return {"loginProfile": profile}

    def oslogin_get_profile(self, user: str, query: dict) -> dict:
        project = (query.get("projectId") or [None])[0]
        with self.lock:
            account = self._oslogin_user(user, project)
            return self._login_profile(account, project)

    def oslogin_delete_key(self, user: str, fingerprint: str) -> dict:
        with self.lock:
            account = self._oslogin_user(user, None)
            keys = self.oslogin_profiles.get(account, {"keys": {}})["keys"]
            if fingerprint not in keys:
                raise ApiRefusal(404, f"Requested entity was not found: users/{account}/sshPublicKeys/{fingerprint}",
                                 "NOT_FOUND", "notFound")
            del keys[fingerprint]
        for hook in self.on_oslogin_changed:
            hook()
        return {}

    def oslogin_keys(self, username: str) -> list[str]:
        """For the test sshd: the unexpired public keys registered for the POSIX user `username`."""
        with self.lock:
            return [k["key"] for account in list(self.oslogin_profiles)
                    if self._posix_username(account) == username
                    for k in self._login_profile(account, None)["sshPublicKeys"].values()]


# Projects that hold Google's public images: every authenticated caller may use their images
# (https://cloud.google.com/compute/docs/images/managing-access-custom-images#public-images).
GOOGLE_PROJECTS = frozenset({"debian-cloud", "ubuntu-os-cloud", "deeplearning-platform-release", "cos-cloud",
                             "ml-images"})
# IAM v1 projects.serviceAccounts: https://cloud.google.com/iam/docs/reference/rest/v1/projects.serviceAccounts
# "accountId ... must be 6-30 characters long, and match the regular expression [a-z]([-a-z0-9]*[a-z0-9])".
SA_ACCOUNT_ID_RE = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])")
# Members of a binding: https://cloud.google.com/iam/docs/reference/rest/v1/Policy#Binding (and Cloud Storage's
# convenience values)
MEMBER_RE = re.compile(r"(user|serviceAccount|group|domain|principal|principalSet|projectOwner|projectEditor|"
                       r"projectViewer|deleted:serviceAccount):.+|allUsers|allAuthenticatedUsers")
ROLE_RE = re.compile(r"roles/[a-zA-Z0-9_.]+|(projects|organizations)/[^/]+/roles/[a-zA-Z0-9_.]+")
