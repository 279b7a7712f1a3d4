"""The run's firewall rule: the dispatcher and worker ports, open only between the run's own VMs.

tf.data service has no authentication: whoever reaches a worker can run dataset
graphs on it. The rule admits TCP to the service ports from instances with the
run's network tag to instances with that tag, and nothing else; it is deleted
with the run. (VMs have internal addresses only unless gcp.public_ips is set, and
SSH reaches them by the network's own rules.)
"""

from __future__ import annotations

import threading
import uuid

from .clients import Clients
from .retry import call

# With port 0 each VM picks its own ports, so the rule opens the unprivileged range (still only between the run's VMs).
ANY_PORT = "1024-65535"


def ports(dispatcher_port: int, worker_port: int) -> list[str]:
    if not dispatcher_port or not worker_port:
        return [ANY_PORT]
    return sorted({str(dispatcher_port), str(worker_port)})


def body(clients: Clients, name: str, tag: str, run_id: str):
    from google.cloud import compute_v1 as c

    s = clients.settings
    network = s.network if "/" in s.network else f"projects/{s.project}/global/networks/{s.network}"
    return c.Firewall(
        name=name, network=network, direction="INGRESS", priority=1000,
        description=f"dsctl run {run_id}: tf.data service ports between the run's VMs only (dsctl-run={run_id})",
        allowed=[c.Allowed(I_p_protocol="tcp", ports=ports(s.dispatcher_port, s.worker_port))],
        source_tags=[tag], target_tags=[tag],
    )


def insert(clients: Clients, name: str, tag: str, run_id: str, cancel: threading.Event | None = None):
    from google.cloud import compute_v1 as c

    request = c.InsertFirewallRequest(project=clients.settings.project, firewall_resource=body(clients, name, tag, run_id),
                                      request_id=str(uuid.uuid4()))
    return call(clients.firewalls.insert_unary, request=request, doing=f"creating firewall rule {name}", cancel=cancel)


def exists(clients: Clients, name: str, cancel: threading.Event | None = None) -> bool:
    from google.cloud import compute_v1 as c

    request = c.ListFirewallsRequest(project=clients.settings.project, filter=f'name = "{name}"')
    page = call(lambda **kw: next(iter(clients.firewalls.list(**kw).pages)), request=request,
                doing=f"looking for firewall rule {name}", cancel=cancel)
    return any(f.name == name for f in page.items)


def delete(clients: Clients, name: str, cancel: threading.Event | None = None):
    """Start deleting the rule; None if it does not exist."""
    from google.api_core import exceptions as gx
    from google.cloud import compute_v1 as c

    request = c.DeleteFirewallRequest(project=clients.settings.project, firewall=name, request_id=str(uuid.uuid4()))
    try:
        return call(clients.firewalls.delete_unary, request=request, doing=f"deleting firewall rule {name}", cancel=cancel)
    except gx.NotFound:
        return None
