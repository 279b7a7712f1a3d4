"""What the caller may do, asked of the resource each grant lives on.

Google's allow policies are inherited downward only (organization -> project -> a service account, a
bucket: https://cloud.google.com/iam/docs/resource-hierarchy-access-control), so a permission is tested
where it is used: a project's with Resource Manager's projects.testIamPermissions, acting as a service
account with that account's own testIamPermissions (IAM v1), a bucket's with the bucket's
(https://cloud.google.com/storage/docs/json_api/v1/buckets/testIamPermissions). A project-level test
never sees a role granted on an account or a bucket, and each answer is for the identity whose
credentials asked: on a VM, its service account.

Grants take a while to be seen by the services that enforce them ("typically ... 2 minutes, but could
potentially take 7 minutes or longer", https://cloud.google.com/iam/docs/access-change-propagation):
`wait_until_granted` probes until a permission dsctl granted is in effect, or the bound passes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from .clients import Clients
from .retry import call

Scope = Literal["project", "account", "bucket"]  # what a grant or a permission test is on

PROPAGATION_S = 480.0  # Google's "7 minutes or longer", and a minute more


@dataclass(frozen=True)
class Where:
    """A resource permissions are tested on: the project (name ""), a service account, a bucket."""

    kind: Scope
    name: str = ""

    def describe(self, project: str) -> str:
        return {"project": f"project {self.name or project}", "account": f"service account {self.name}",
                "bucket": f"bucket gs://{self.name}"}[self.kind]


PROJECT = Where("project")


def account(email: str) -> Where:
    return Where("account", email)


def bucket(name: str) -> Where:
    return Where("bucket", name)


def granted(clients: Clients, where: Where, wanted: list[str], doing: str) -> set[str]:
    """The permissions of `wanted` the caller holds on `where`. google.api_core errors propagate (NotFound for an
    account or bucket that does not exist, Forbidden where the caller may not even ask)."""
    s = clients.settings
    out: set[str] = set()
    for i in range(0, len(wanted), 100):  # each API takes at most 100 at a time
        part = wanted[i:i + 100]
        if where.kind == "project":
            reply = call(clients.projects.test_iam_permissions,
                         request={"resource": f"projects/{where.name or s.project}", "permissions": part}, doing=doing)
            out |= set(reply.permissions)
        elif where.kind == "account":
            out |= set(call(clients.iam.test_account_permissions, where.name, part, doing=doing))
        else:
            out |= set(call(lambda perms, **_: clients.storage.bucket(where.name).test_iam_permissions(perms), part,
                            doing=doing))
    return out


def missing(clients: Clients, where: Where, wanted: list[str], doing: str) -> list[str]:
    have = granted(clients, where, wanted, doing)
    return [p for p in wanted if p not in have]


def wait_until_granted(clients: Clients, where: Where, wanted: list[str], *, what: str,
                       progress: Callable[[str], None], cancel: threading.Event | None = None,
                       bound_s: float = PROPAGATION_S, poll_s: float = 5.0) -> list[str]:
    """Probe `where` until the caller holds every permission of `wanted` (grants just made take minutes to be
    enforced everywhere) or `bound_s` passes; returns what is still missing. Says what it waits for once, then
    every minute."""
    started = time.monotonic()
    said = -60.0
    while True:
        left = missing(clients, where, wanted, f"checking that {what} is in effect")
        elapsed = time.monotonic() - started
        if not left or elapsed >= bound_s:
            return left
        if elapsed - said >= 60.0:
            progress(f"waiting for {what} to take effect ({', '.join(left)} not yet; Google says grants take about 2 "
                     f"minutes, sometimes 7): {elapsed:.0f} s so far")
            said = elapsed
        if cancel is not None and cancel.wait(poll_s):
            return left
        if cancel is None:
            time.sleep(poll_s)
