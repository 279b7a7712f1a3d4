"""What can go wrong on Google Cloud, as one-paragraph errors the orchestrator reports (exit 1).

These are runtime failures, not mistakes in the spec: GcpError is a RuntimeError,
which the orchestrator turns into RunFailed. Operation errors are classified
from the operation's own error fields (see operations.py), API errors from the
google.api_core exception the client raised.
"""

from __future__ import annotations


class GcpError(RuntimeError):
    """A Google Cloud failure, explained in one paragraph: what, where, and what to do."""

    def __init__(self, message: str):
        super().__init__(" ".join(message.split()))

    def add_sentence(self, sentence: str) -> "GcpError":
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


class ApiUnavailable(GcpError):
    """Google Cloud kept answering 429 or 503 after every retry."""


def describe(count: int, what: str) -> str:
    """describe(1, 'n2-standard-8 worker VM') -> '1 n2-standard-8 worker VM'; plural for more."""
    return f"{count} {what}" + ("" if count == 1 else "s")


def from_operation_error(code: str, message: str, *, resource: str, zone: str, count: int) -> GcpError:
    """Classify an operation's error (`error.errors[0].code`) for `count` of `resource` in `zone`."""
    asked = f"{describe(count, resource)} in zone {zone}"
    message = message.strip().rstrip(".")
    were = f"{count} {'was' if count == 1 else 'were'} asked for"
    if code == "QUOTA_EXCEEDED":
        return QuotaExceeded(
            f"Google Cloud refused to create {asked}: the project's quota is too small ({message}). "
            f"{were}. Ask for more quota (console: IAM & Admin > Quotas, the metric named above), "
            "or ask for fewer or smaller machines (service.workers, service.worker_machine, trainer.machine), "
            "or use a zone in another region (gcp.zone)."
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
    if resource and zone:
        reasons = {e.get("reason", "") for e in (getattr(exc, "errors", None) or []) if isinstance(e, dict)}
        text = f"{detail} {' '.join(reasons)}".lower()
        if "quota" in text:
            return from_operation_error("QUOTA_EXCEEDED", detail, resource=resource, zone=zone, count=count)
        if "resource_pool_exhausted" in text or "does not have enough resources" in text or isinstance(exc, gx.ResourceExhausted):
            return from_operation_error("ZONE_RESOURCE_POOL_EXHAUSTED", detail, resource=resource, zone=zone, count=count)
    if isinstance(exc, gx.PermissionDenied) or isinstance(exc, gx.Forbidden):
        if "quota" in detail.lower():
            return QuotaExceeded(f"Google Cloud refused {doing}: quota exceeded ({detail}).")
        return GcpError(
            f"Google Cloud refused {doing}: permission denied ({detail}). The credentials dsctl uses (Application "
            "Default Credentials) need the Compute Admin, TPU Admin and Storage Admin roles on the project, and "
            "Service Account User on the VMs' service account."
        )
    if isinstance(exc, gx.Unauthorized):
        return GcpError(f"Google Cloud did not accept the credentials while {doing} ({detail}); run "
                        "`gcloud auth application-default login` again.")
    if isinstance(exc, gx.NotFound):
        return GcpError(f"not found while {doing}: {detail}. Check gcp.project, gcp.zone, gcp.network and gcp.subnetwork.")
    if isinstance(exc, gx.ResourceExhausted):
        return ZoneExhausted(f"out of capacity or quota while {doing}: {detail}.")
    return GcpError(f"Google Cloud failed while {doing}: {type(exc).__name__}: {detail}")
