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


# Standing rules: where the caller may not create firewall rules in the network's project (a Shared VPC host), a
# network administrator adds these once for every dsctl run on that network, and every dsctl VM carries SHARED_TAG.
SHARED_TAG = "dsctl-vm"


def standing_rules(network: str, dispatcher_port: int, worker_port: int) -> list[Rule]:
    """The two rules a network's administrator adds for dsctl: the service ports and SSH between dsctl's VMs, the
    service ports closed to everything else. Named per network, so a Shared VPC host can hold several."""
    p = tuple(ports(dispatcher_port, worker_port))
    net = network.rsplit("/", 1)[-1]
    return [Rule(f"dsctl-{net}-svc"[:63], True, ALLOW_PRIORITY, (*p, "22"), SHARED_TAG, source_tag=SHARED_TAG,
                 description="dsctl: tf.data service ports and SSH between dsctl's VMs"),
            Rule(f"dsctl-{net}-deny"[:63], False, DENY_PRIORITY, p, SHARED_TAG, source_range="0.0.0.0/0",
                 description="dsctl: tf.data service ports closed to all but dsctl's VMs")]


def missing_standing(clients: Clients, rules: list[Rule]) -> list[Rule]:
    """The standing rules that are not there as they must be (their ports, targets and sources)."""
    have = {fw.name: fw for fw in network_rules(clients)}
    out = []
    for rule in rules:
        fw = have.get(rule.name)
        if fw is None or list(fw.target_tags) != [rule.target_tag] or fw.priority > rule.priority:
            out.append(rule)
        elif rule.allow and not (list(fw.source_tags) == [rule.source_tag]
                                 and all(_allows(fw, int(p.split("-")[0])) for p in rule.ports)):
            out.append(rule)
        elif not rule.allow and not (rule.source_range in list(fw.source_ranges) and all(
                any(d.I_p_protocol in ("tcp", "all") and _port_covered(list(d.ports), int(p.split("-")[0]))
                    for d in fw.denied) for p in rule.ports)):
            out.append(rule)
    return out


def commands(rules: list[Rule], project: str, network: str) -> list[str]:
    """The gcloud commands that add `rules` to `network` in `project`."""
    net = network.rsplit("/", 1)[-1]
    out = []
    for r in rules:
        what = ",".join(f"tcp:{p}" for p in r.ports)
        source = f"--source-tags={r.source_tag}" if r.allow else f"--source-ranges={r.source_range}"
        out.append(f"gcloud compute firewall-rules create {r.name} --project={project} --network={net} "
                   f"--direction=INGRESS --action={'allow' if r.allow else 'deny'} --rules={what} {source} "
                   f"--target-tags={r.target_tag} --priority={r.priority}")
    return out


def network_url(clients: Clients) -> str:
    s = clients.settings
    return s.network if "/" in s.network else f"projects/{s.network_project}/global/networks/{s.network}"


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

    request = c.InsertFirewallRequest(project=clients.settings.network_project, firewall_resource=body(clients, rule),
                                      request_id=str(uuid.uuid4()))
    return call(clients.firewalls.insert_unary, request=request, doing=f"creating firewall rule {rule.name}",
                cancel=cancel)


def exists(clients: Clients, name: str, cancel: threading.Event | None = None) -> bool:
    from google.cloud import compute_v1 as c

    request = c.ListFirewallsRequest(project=clients.settings.network_project, filter=f'name = "{name}"')
    page = call(lambda **kw: next(iter(clients.firewalls.list(**kw).pages)), request=request,
                doing=f"looking for firewall rule {name}", cancel=cancel)
    return any(f.name == name for f in page.items)


def delete(clients: Clients, name: str, cancel: threading.Event | None = None):
    """Start deleting the rule; None if it does not exist."""
    from google.api_core import exceptions as gx
    from google.cloud import compute_v1 as c

    request = c.DeleteFirewallRequest(project=clients.settings.network_project, firewall=name, request_id=str(uuid.uuid4()))
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
                   request=c.ListFirewallsRequest(project=clients.settings.network_project),
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
