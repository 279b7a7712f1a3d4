"""The run's firewall rules: the tf.data service ports open between the run's own VMs, and to nothing else.

tf.data service has no authentication: whoever reaches a worker can run dataset graphs on
it, as the user. Two rules per run, on the run's network tag:
  <prefix>-svc   ALLOW tcp <ports>,22 from the run's tag, priority 900
  <prefix>-deny  DENY  tcp <ports> from 0.0.0.0/0, priority 910
A network's own allow rules sit at lower priority (the default network's
default-allow-internal is 65534, and admits every port from 10.128.0.0/9), so the deny
rule keeps them, and external addresses, off the service ports. `wider_rules()` names
the network rules that would otherwise have opened them, for the plan. SSH (tcp:22) between
the run's VMs is the run's own rule's: the supervisor on the dispatcher VM reaches the
others whatever the network's rules say. SSH from elsewhere (a run supervised from the
user's machine) is left to the network's rules; `ssh_rules()` finds the ones that admit it.
"""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass

from .clients import Clients
from .retry import call

# With port 0 each VM picks its own ports, so the rules cover the unprivileged range (still only the run's VMs).
ANY_PORT = "1024-65535"
ALLOW_PRIORITY = 900
DENY_PRIORITY = 910


@dataclass(frozen=True)
class Rule:
    name: str
    allow: bool
    priority: int
    ports: tuple[str, ...]
    target_tag: str
    source_tag: str | None = None  # allow: the run's VMs
    source_range: str | None = None  # deny: everything
    description: str = ""


def ports(dispatcher_port: int, worker_port: int) -> list[str]:
    if not dispatcher_port or not worker_port:
        return [ANY_PORT]
    return sorted({str(dispatcher_port), str(worker_port)})


def run_rules(run_id: str, tag: str, dispatcher_port: int, worker_port: int) -> list[Rule]:
    from .naming import deny_firewall_name, firewall_name

    p = tuple(ports(dispatcher_port, worker_port))
    return [
        Rule(firewall_name(run_id), True, ALLOW_PRIORITY, (*p, "22"), tag, source_tag=tag,
             description=f"dsctl run {run_id}: tf.data service ports and SSH between the run's VMs (dsctl-run={run_id})"),
        Rule(deny_firewall_name(run_id), False, DENY_PRIORITY, p, tag, source_range="0.0.0.0/0",
             description=f"dsctl run {run_id}: tf.data service ports closed to all others (dsctl-run={run_id})"),
    ]


def network_url(clients: Clients) -> str:
    s = clients.settings
    return s.network if "/" in s.network else f"projects/{s.project}/global/networks/{s.network}"


def body(clients: Clients, rule: Rule):
    from google.cloud import compute_v1 as c

    fw = c.Firewall(name=rule.name, network=network_url(clients), direction="INGRESS", priority=rule.priority,
                    description=rule.description, target_tags=[rule.target_tag])
    spec = [{"I_p_protocol": "tcp", "ports": list(rule.ports)}]
    if rule.allow:
        assert rule.source_tag is not None, "an allow rule names the run's VMs"
        fw.allowed = [c.Allowed(**spec[0])]
        fw.source_tags = [rule.source_tag]
    else:
        assert rule.source_range is not None, "a deny rule names the range it closes to"
        fw.denied = [c.Denied(**spec[0])]
        fw.source_ranges = [rule.source_range]
    return fw


def insert(clients: Clients, rule: Rule, cancel: threading.Event | None = None):
    from google.cloud import compute_v1 as c

    request = c.InsertFirewallRequest(project=clients.settings.project, firewall_resource=body(clients, rule),
                                      request_id=str(uuid.uuid4()))
    return call(clients.firewalls.insert_unary, request=request, doing=f"creating firewall rule {rule.name}",
                cancel=cancel)


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


# -- the network's own rules --------------------------------------------------------------------------------
def network_rules(clients: Clients) -> list:
    """Every enabled ingress rule of the run's network."""
    from google.cloud import compute_v1 as c

    want = network_url(clients).rsplit("/", 1)[-1]
    out = []
    for fw in call(lambda **kw: list(clients.firewalls.list(**kw)),
                   request=c.ListFirewallsRequest(project=clients.settings.project),
                   doing="listing the network's firewall rules"):
        if fw.network.rsplit("/", 1)[-1] == want and fw.direction == "INGRESS" and not fw.disabled:
            out.append(fw)
    return out


def _port_covered(port_specs: list[str], port: int) -> bool:
    if not port_specs:  # no ports: every port
        return True
    for spec in port_specs:
        lo, _, hi = spec.partition("-")
        if int(lo) <= port <= int(hi or lo):
            return True
    return False


def _allows(fw, port: int) -> bool:
    return any(a.I_p_protocol in ("tcp", "all") and _port_covered(list(a.ports), port) for a in fw.allowed)


def _applies_to_all(fw) -> bool:
    """A rule with no target tags or service accounts applies to every VM of the network, the run's too."""
    return not fw.target_tags and not fw.target_service_accounts


def _sources(fw) -> str:
    parts = list(fw.source_ranges) + [f"tag {t}" for t in fw.source_tags]
    return ", ".join(parts) or "anywhere"


def wider_rules(clients: Clients, service_ports: list[str]) -> list[tuple[str, bool]]:
    """The network's own rules that admit more than the run's VMs to a service port, each with whether the
    run's deny rule overrides it (it does unless the rule's priority number is lower than the deny rule's)."""
    probe = int(service_ports[0].split("-")[0])
    return [(f"{fw.name} (priority {fw.priority}, from {_sources(fw)})", fw.priority > DENY_PRIORITY)
            for fw in network_rules(clients) if _applies_to_all(fw) and _allows(fw, probe)]


def _from_outside(fw) -> bool:
    """The rule admits some address outside private ranges (the user's machine, when it reaches external addresses)."""
    import ipaddress

    return any(not ipaddress.ip_network(r, strict=False).is_private for r in fw.source_ranges)


def ssh_rules(clients: Clients, from_outside: bool) -> list[str]:
    """The network's rules that admit SSH (tcp:22) to every VM: from outside the VPC when dsctl connects to
    external addresses, from anywhere when it runs inside the VPC."""
    return [f"{fw.name} (from {_sources(fw)})" for fw in network_rules(clients)
            if _applies_to_all(fw) and _allows(fw, 22) and (_from_outside(fw) or not from_outside)]
