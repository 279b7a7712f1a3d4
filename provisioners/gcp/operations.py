"""Wait for Compute Engine operations with the operations clients, and read their errors.

Not ExtendedOperation.result(): it polls through an operations client built
without our endpoint (the real compute.googleapis.com even in tests). The
public operations API (`wait`, which returns when the operation is done or
after a while) is correct everywhere, and an operation's error is read from
its own fields here, so it can be classified (quota, capacity, other).
"""

from __future__ import annotations

import threading
import time

from .clients import Clients
from .errors import CloudTimeout, GcpError, from_operation_error, quota_info
from .retry import Cancelled, call, is_timeout

WAIT_CALL_S = 10.0  # one wait call at most this long, so a teardown is never stuck behind it


def _done(op) -> bool:
    from google.cloud import compute_v1

    return op.status == compute_v1.Operation.Status.DONE


def wait(clients: Clients, op, *, doing: str, timeout_s: float, cancel: threading.Event | None = None):
    """Wait for a zonal or global operation to be DONE; returns it (check `error_of`)."""
    s = clients.settings
    deadline = time.monotonic() + timeout_s
    zonal = bool(op.zone)
    while not _done(op):
        left = deadline - time.monotonic()
        if left <= 0:
            raise CloudTimeout(f"Google Cloud did not finish {doing} within {timeout_s:.0f} s (operation {op.name}).")
        if cancel is not None and cancel.is_set():
            raise Cancelled()
        # `wait` returns when the operation is done or after a while (up to 2 minutes on the real API);
        # a client-side timeout just means "not done yet".
        try:
            if zonal:
                op = call(clients.zone_operations.wait, project=s.project, zone=s.zone, operation=op.name,
                          doing=f"waiting for {doing}", cancel=cancel, retry_timeouts=False,
                          timeout=min(left, WAIT_CALL_S))
            else:  # a firewall rule's: in the network's project (a Shared VPC host's), which its link names
                project = op.self_link.split("/projects/", 1)[1].split("/", 1)[0] if "/projects/" in op.self_link \
                    else s.project
                op = call(clients.global_operations.wait, project=project, operation=op.name,
                          doing=f"waiting for {doing}", cancel=cancel, retry_timeouts=False,
                          timeout=min(left, WAIT_CALL_S))
        except Exception as exc:
            if not is_timeout(exc):
                raise
    return op


# Codes that say what to change, preferred over the wrappers around them (a bulk insert that cannot
# reach minCount reports VM_MIN_COUNT_NOT_REACHED first and the cause after it).
TELLING = ("QUOTA_EXCEEDED", "ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
           "RESOURCE_EXHAUSTED")


def error_of(op) -> tuple[str, str, dict | None] | None:
    """(code, message, quotaInfo) of a DONE operation's most telling error, or None if it succeeded."""
    errors = list(op.error.errors) if op.error else []
    if errors:
        err = next((e for code in TELLING for e in errors if e.code == code), errors[0])
        quota = next((type(d.quota_info).to_dict(d.quota_info) for d in err.error_details
                      if d.quota_info and d.quota_info.metric_name), None)
        return err.code or "UNKNOWN", err.message or op.http_error_message or "", quota
    if op.http_error_status_code and op.http_error_status_code >= 400:
        return str(op.http_error_status_code), op.http_error_message or "", None
    return None


def check(op, *, resource: str, zone: str, count: int) -> None:
    """Raise the classified GcpError if the operation failed."""
    err = error_of(op)
    if err is not None:
        code, message, quota = err
        raise from_operation_error(code, message, resource=resource, zone=zone, count=count,
                                   quota=quota_info(message, quota_details=quota) if code == "QUOTA_EXCEEDED" else None)


def wait_and_check(clients: Clients, op, *, resource: str, count: int, doing: str, timeout_s: float,
                   cancel: threading.Event | None = None) -> None:
    op = wait(clients, op, doing=doing, timeout_s=timeout_s, cancel=cancel)
    check(op, resource=resource, zone=clients.settings.zone if op.zone else f"project {clients.settings.project}",
          count=count)


__all__ = ["GcpError", "check", "error_of", "wait", "wait_and_check"]
