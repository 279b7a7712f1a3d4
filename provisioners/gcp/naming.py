"""Names, labels and the network tag of one run's resources.

Every resource carries the labels `dsctl-run=<run>` and `dsctl-role=<role>`, so
a run's resources can be found without local state (`down_by_label`). Firewall
rules and TPU queued resources cannot carry labels: they are found by their names,
which are derived from the run id the same way.
"""

from __future__ import annotations

import hashlib
import re

LABEL_RUN = "dsctl-run"
LABEL_ROLE = "dsctl-role"
LABEL_JOB = "dsctl-job"
LABEL_INDEX = "dsctl-index"
MAX_PREFIX = 48  # leaves room for "-dispatcher-0" / "-worker-1234" within 63 characters


def label_value(text: str) -> str:
    """A label value: lower-case letters, digits, '-' and '_', at most 63 characters."""
    value = re.sub(r"[^a-z0-9_-]", "-", text.lower())
    if len(value) > 63:
        value = value[:57] + "-" + hashlib.sha1(text.encode()).hexdigest()[:5]
    return value


def prefix(run_id: str) -> str:
    """Start of every resource name of the run: 'dsctl-<run id>' (shortened with a hash if long)."""
    base = re.sub(r"[^a-z0-9-]", "-", f"dsctl-{run_id}".lower()).strip("-")
    if len(base) > MAX_PREFIX:
        digest = hashlib.sha1(run_id.encode()).hexdigest()[:6]
        base = base[: MAX_PREFIX - 7].rstrip("-") + "-" + digest
    return base


def instance_name(run_id: str, role: str, index: int) -> str:
    return f"{prefix(run_id)}-{role}-{index}"


def firewall_name(run_id: str) -> str:
    """The rule that allows the service ports between the run's VMs."""
    return f"{prefix(run_id)}-svc"


def deny_firewall_name(run_id: str) -> str:
    """The rule that denies the service ports to everything else (above the network's own allow rules)."""
    return f"{prefix(run_id)}-deny"


def firewall_names(run_id: str) -> list[str]:
    return [firewall_name(run_id), deny_firewall_name(run_id)]


def network_tag(run_id: str) -> str:
    """The tag on every VM of the run; the firewall rule admits traffic between tagged VMs only."""
    return prefix(run_id)


def labels(run_id: str, job: str, role: str, extra: dict | None = None, index: int | None = None) -> dict[str, str]:
    out = dict(extra or {})
    out.update({LABEL_RUN: label_value(run_id), LABEL_JOB: label_value(job), LABEL_ROLE: role})
    if index is not None:
        out[LABEL_INDEX] = str(index)
    return out


def run_filter(run_id: str) -> str:
    """Compute Engine list filter for the run's instances."""
    return f'labels.{LABEL_RUN} = "{label_value(run_id)}"'
