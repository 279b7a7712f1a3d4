"""What can go wrong on Google Cloud, as one-paragraph errors the orchestrator reports (exit 1).

These are runtime failures, not mistakes in the spec: GcpError is a DsctlError with exit
code 1, which the orchestrator records as the run's failure. Operation errors are classified
from the operation's own error fields (see operations.py), API errors from the
google.api_core exception the client raised: a quota (never worth retrying) is told apart
from a rate limit (retry.py retries those) here, so the retry policy and the errors agree.
One is not a runtime failure: an organization policy that forbids what the spec asks for
(PolicyRefused) is a SpecError too, exit 2, naming the constraint and the field to change.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from dsctl.errors import DsctlError
from dsctl.specs import SpecError


class GcpError(DsctlError):
    """A Google Cloud failure, explained in one paragraph: what, where, and what to do."""

    def __init__(self, message: str):
        super().__init__(" ".join(message.split()))

    def add_sentence(self, sentence: str) -> GcpError:
        self.args = (f"{self.args[0]} {sentence}",)
        return self


class QuotaExceeded(GcpError):
    """QUOTA_EXCEEDED: the project may not have that many CPUs, GPUs, TPUs or addresses in the region."""


class ZoneExhausted(GcpError):
    """ZONE_RESOURCE_POOL_EXHAUSTED (or a TPU zone out of capacity): the zone has no machines of that type now."""


class OperationFailed(GcpError):
    """An operation ended with an error that is neither quota nor capacity."""


class CloudTimeout(GcpError):
    """Something did not happen in time: an operation, a VM reaching RUNNING, SSH, a server starting."""


class VersionMismatch(GcpError):
    """The machines do not all run the trainer's TensorFlow (or this dsctl)."""


class RemoteError(GcpError):
    """A process on a VM failed, or a VM stopped answering over SSH."""


class SshUnreachable(RemoteError):
    """SSH to a VM failed (refused, timed out, dropped): the VM may be fine and answer again."""


class ApiUnavailable(GcpError):
    """Google Cloud kept answering 429 or 503 after every retry."""


class ApiDisabled(GcpError, SpecError):
    """An API the run calls is off in the project (403, ErrorInfo reason SERVICE_DISABLED): the project's setup, not
    a passing failure; exit 2, naming the command that turns it on."""


def disabled_service(exc: Exception) -> tuple[str, str] | None:
    """(service, consumer project) of a SERVICE_DISABLED refusal (https://cloud.google.com/apis/design/errors#
    error_info: reason SERVICE_DISABLED, metadata service and consumer), else None."""
    if getattr(exc, "reason", None) != "SERVICE_DISABLED":
        return None
    md = dict(getattr(exc, "metadata", None) or {})
    return md.get("service", "the API"), md.get("consumer", "").removeprefix("projects/")


class PolicyRefused(GcpError, SpecError):
    """An organization policy constraint forbids what the run asked for (HTTP 412 conditionNotMet, "Constraint
    constraints/NAME violated for project NUMBER. ..."): retrying cannot help; the spec or the policy must change."""

    def __init__(self, message: str, constraint: str):
        super().__init__(message)
        self.constraint = constraint


@dataclass(frozen=True)
class Constraint:
    """What an organization policy constraint forbids, and how a dsctl user gets past it."""

    forbids: str
    fix: str


_ADMIN = "ask an organization policy administrator to exempt this project"
CONSTRAINTS: dict[str, Constraint] = {
    "compute.vmExternalIpAccess": Constraint(
        "VMs with external IP addresses",
        "set gcp.public_ips: false (the VMs get internal addresses only, and dsctl must then run inside the VPC, "
        f"e.g. on a VM there), or {_ADMIN} or allow these VMs external addresses"),
    "compute.requireOsLogin": Constraint(
        "VMs that turn OS Login off (metadata enable-oslogin: FALSE, on the VM or the project)",
        f"keep OS Login on for the run's VMs (no enable-oslogin: FALSE in their or the project's metadata), or {_ADMIN}"),
    "compute.trustedImageProjects": Constraint(
        "boot images from projects the policy does not trust",
        "use images from a trusted project (gcp.image, gcp.gpu_image; Google's are in debian-cloud, ubuntu-os-cloud "
        f"and deeplearning-platform-release), or {_ADMIN} or trust the image's project"),
    "compute.requireShieldedVm": Constraint(
        "VMs that are not Shielded VMs with Secure Boot on",
        "keep gcp.shielded_vm true (dsctl then turns Secure Boot on for every VM) and use images that support "
        f"Shielded VM (gcp.image, gcp.gpu_image; Google's public images do), or {_ADMIN}"),
    "iam.automaticIamGrantsForDefaultServiceAccounts": Constraint(
        "roles granted automatically to default service accounts (the Compute Engine default service account "
        "has none, so VMs running as it cannot read the run's staging bucket)",
        "name a service account that has Storage Object Viewer on the bucket in gcp.service_account, or grant the "
        "default one that role"),
    "gcp.resourceLocations": Constraint(
        "resources outside the locations the policy allows",
        "choose a zone (gcp.zone) and a bucket (gcp.bucket) in an allowed location, or ask an organization policy "
        "administrator which locations are allowed"),
}
_CONSTRAINT_IN_MESSAGE = re.compile(r"Constraint\s+(?:constraints/)?([A-Za-z0-9_.]+)\s+violated"
                                    r"(?:\s+for\s+(?:project\s+)?(?:projects/)?([A-Za-z0-9_.:-]*[A-Za-z0-9]))?")
_REQUEST_LINE = re.compile(r"^[A-Z]+ \S+: ")  # google.api_core's "POST https://...: " before the API's message


def policy_refusal(message: str, *, doing: str) -> PolicyRefused | None:
    """The PolicyRefused an API error or failed operation stands for, if its message names a violated constraint."""
    m = _CONSTRAINT_IN_MESSAGE.search(message or "")
    if not m:
        return None
    name, project = m.group(1), m.group(2)
    known = CONSTRAINTS.get(name)
    said = _REQUEST_LINE.sub("", message.strip()).rstrip(".")
    where = f" on project {project}" if project else ""
    what = (f"it forbids {known.forbids}. To run, {known.fix}." if known else
            f"see what it forbids with `gcloud org-policies describe {name} --effective --project=PROJECT`, and change "
            "the spec to keep to it, or ask an organization policy administrator to exempt this project.")
    return PolicyRefused(f"Google Cloud refused {doing}: the organization policy constraint constraints/{name} is "
                         f"enforced{where}, and {what} (Google said: {said}.)", name)


@dataclass(frozen=True)
class QuotaInfo:
    """Which quota refused a request, as far as the error tells: metric, limit and where."""

    metric: str | None = None  # as the error names it: "N2_CPUS"
    limit: str | None = None
    where: str | None = None  # "region us-central1", "zone us-central1-b"
    metric_name: str | None = None  # the Quotas page's metric, when given apart: "compute.googleapis.com/n2_cpus"

    def describe(self) -> str:
        parts = []
        if self.metric:
            parts.append(f"quota {self.metric}")
            if self.metric_name and self.metric_name != self.metric:
                parts.append(f"({self.metric_name})")
        if self.where:
            parts.append(f"in {self.where}")
        if self.limit:
            parts.append(f"(limit {self.limit})")
        return " ".join(parts)


_QUOTA_IN_MESSAGE = re.compile(r"Quota '([^']+)' exceeded\.?\s*Limit:\s*([\d.]+)\s+in\s+(region|zone)\s+([a-z0-9-]+)")
_QUOTA_LIMIT_IN_MESSAGE = re.compile(r"[Qq]uota (?:limit|metric) '([^']+)'")


def quota_info(message: str, *, metadata: dict | None = None, quota_details: dict | None = None) -> QuotaInfo:
    """QuotaInfo from an error's structured details (ErrorInfo metadata, Compute's quotaInfo) or its message."""
    if quota_details:
        dims = quota_details.get("dimensions") or {}
        where = next((f"{k} {v}" for k, v in dims.items() if k in ("region", "zone")), None)
        limit = quota_details.get("limit")
        metric_name = quota_details.get("metric_name") or quota_details.get("metricName")
        named = _QUOTA_IN_MESSAGE.search(message or "")
        return QuotaInfo(named.group(1) if named else metric_name, None if limit is None else f"{float(limit):g}",
                         where, metric_name)
    md = metadata or {}
    if md.get("quota_metric") or md.get("quota_limit"):
        loc = md.get("quota_location")
        return QuotaInfo(md.get("quota_metric") or md.get("quota_limit"), md.get("quota_limit_value"),
                         f"{'zone' if loc and loc.count('-') == 2 else 'region'} {loc}" if loc else None)
    m = _QUOTA_IN_MESSAGE.search(message or "")
    if m:
        return QuotaInfo(m.group(1), f"{float(m.group(2)):g}", f"{m.group(3)} {m.group(4)}")
    m = _QUOTA_LIMIT_IN_MESSAGE.search(message or "")
    return QuotaInfo(m.group(1) if m else None)


_RATE_REASONS = {"rateLimitExceeded", "userRateLimitExceeded", "RATE_LIMIT_EXCEEDED"}
_QUOTA_REASONS = {"quotaExceeded", "QUOTA_EXCEEDED", "RESOURCE_QUOTA_EXCEEDED"}
_PER_TIME = re.compile(r"per (second|minute|100 seconds|day)", re.IGNORECASE)


def _reasons(exc: Exception) -> set[str]:
    out = {e.get("reason") for e in (getattr(exc, "errors", None) or []) if isinstance(e, dict)}
    reason = getattr(exc, "reason", None)  # google.rpc.ErrorInfo, when the API sent one
    return {r for r in out | {reason} if r}


def is_rate_limit(exc: Exception) -> bool:
    """A request-rate limit (retry later): its reason says so, or its quota is per unit of time."""
    return bool(_reasons(exc) & _RATE_REASONS) or bool(_PER_TIME.search(getattr(exc, "message", None) or str(exc)))


def is_quota(exc: Exception) -> bool:
    """An exhausted resource quota (CPUs, GPUs, TPUs, addresses): retrying cannot help."""
    if is_rate_limit(exc):
        return False
    text = (getattr(exc, "message", None) or str(exc)).lower()
    return bool(_reasons(exc) & _QUOTA_REASONS) or "quota" in text


def describe(count: int, what: str) -> str:
    """describe(1, 'n2-standard-8 worker VM') -> '1 n2-standard-8 worker VM'; plural for more."""
    return f"{count} {what}" + ("" if count == 1 else "s")


def from_operation_error(code: str, message: str, *, resource: str, zone: str, count: int,
                         quota: QuotaInfo | None = None) -> GcpError:
    """Classify an operation's error (`error.errors[0].code`) for `count` of `resource` in `zone`."""
    asked = f"{describe(count, resource)} in zone {zone}"
    refused = policy_refusal(message, doing=f"to create {asked}")
    if refused is not None:
        return refused
    message = message.strip().rstrip(".")
    were = f"{count} {'was' if count == 1 else 'were'} asked for"
    if code == "QUOTA_EXCEEDED":
        q = quota or quota_info(message)
        named = q.describe() or "a quota"
        metric = f"the metric {q.metric}" if q.metric else "the metric named above"
        return QuotaExceeded(
            f"Google Cloud refused to create {asked}: {named} is too small for it ({message}). "
            f"{were}. This is a quota, not a passing rate limit: ask for more (console: IAM & Admin > Quotas, "
            f"{metric}{', ' + q.where if q.where else ''}), or ask for fewer or smaller machines (service.workers, "
            "service.worker_machine, trainer.machine), or use a zone in another region (gcp.zone)."
        )
    if code in ("ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", "RESOURCE_EXHAUSTED"):
        return ZoneExhausted(
            f"zone {zone} has no capacity for {describe(count, resource)} right now ({code}: {message}). "
            f"{were}. Try another zone (gcp.zone), another machine type, or again later."
        )
    return OperationFailed(f"Google Cloud could not create {asked}: {code}: {message}.")


def from_api_error(exc: Exception, *, doing: str, resource: str | None = None, zone: str | None = None,
                   count: int = 1) -> GcpError:
    """A google.api_core exception raised while `doing` something, as a GcpError.

    With resource/zone/count (a create call refused outright), quota and capacity errors read
    like the same errors reported by an operation.
    """
    from google.api_core import exceptions as gx

    detail = getattr(exc, "message", None) or str(exc)
    refused = policy_refusal(detail, doing=doing)
    if refused is not None:
        return refused
    off = disabled_service(exc)
    if off is not None:
        service, project = off
        return ApiDisabled(f"Google Cloud refused {doing}: {service} is off in project {project or 'the run`s'} "
                           f"({detail}). Turn it on with `gcloud services enable {service}"
                           f"{' --project=' + project if project else ''}` (it takes a minute or two), then run dsctl "
                           "again; `dsctl check gcp` lists every API a run needs.")
    quota = quota_info(detail, metadata=dict(getattr(exc, "metadata", None) or {})) if is_quota(exc) else None
    if resource and zone:
        reasons = {e.get("reason", "") for e in (getattr(exc, "errors", None) or []) if isinstance(e, dict)}
        text = f"{detail} {' '.join(reasons)}".lower()
        if quota is not None:
            return from_operation_error("QUOTA_EXCEEDED", detail, resource=resource, zone=zone, count=count, quota=quota)
        if "resource_pool_exhausted" in text or "does not have enough resources" in text or isinstance(exc, gx.ResourceExhausted):
            return from_operation_error("ZONE_RESOURCE_POOL_EXHAUSTED", detail, resource=resource, zone=zone, count=count)
    if quota is not None:
        return QuotaExceeded(f"Google Cloud refused {doing}: {quota.describe() or 'a quota'} is exceeded ({detail}). "
                             "This is a quota, not a passing rate limit: ask for more (console: IAM & Admin > Quotas).")
    if isinstance(exc, gx.PermissionDenied) or isinstance(exc, gx.Forbidden):
        return GcpError(
            f"Google Cloud refused {doing}: permission denied ({detail}). `dsctl check gcp JOB.yaml` names every "
            "permission a run needs, on the resource it is granted on, and the command that grants it.")
    if isinstance(exc, gx.Unauthorized):
        return GcpError(f"Google Cloud did not accept the credentials while {doing} ({detail}); run "
                        "`gcloud auth application-default login` again.")
    if isinstance(exc, gx.NotFound):
        return GcpError(f"not found while {doing}: {detail}. Check gcp.project, gcp.zone, gcp.network and gcp.subnetwork.")
    if isinstance(exc, gx.ResourceExhausted):
        return ZoneExhausted(f"out of capacity or quota while {doing}: {detail}.")
    return GcpError(f"Google Cloud failed while {doing}: {type(exc).__name__}: {detail}")


F = TypeVar("F", bound=Callable)
DOING = "dsctl_doing"  # the attribute a failed call's exception carries (retry.call): what dsctl was doing


def explained(fn: F) -> F:
    """`fn`, with any Google Cloud API answer or credentials failure it did not handle turned into one paragraph that
    names the call (retry.DOING, set by retry.call) instead of a traceback."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from google.api_core import exceptions as gx
        from google.auth import exceptions as ga

        try:
            return fn(*args, **kwargs)
        except DsctlError:
            raise
        except gx.GoogleAPICallError as exc:
            raise from_api_error(exc, doing=getattr(exc, DOING, f"a Google Cloud call ({fn.__name__})")) from exc
        except ga.GoogleAuthError as exc:
            raise GcpError(f"Google Cloud did not accept dsctl's credentials ({type(exc).__name__}: {exc}); run "
                           "`gcloud auth application-default login` again, or check GOOGLE_APPLICATION_CREDENTIALS."
                           ) from exc
    return wrapper  # type: ignore[return-value]
