"""The run's network, checked before anything is created: that it is there, that the run may use it, and what its
firewalls let through.

- The network: `default` unless gcp.network names another; a project made under
  compute.skipDefaultNetworkCreation has none, which is said with the fix, not found at create time.
- Shared VPC: a network of another project (gcp.network: projects/HOST/global/networks/NET) belongs to a host
  project this project must be attached to (projects.getXpnHost); the VMs' subnet must be usable by you
  (compute.subnetworks.use on the subnet itself, where a network administrator grants it: subnetworks'
  testIamPermissions); and firewall rules live in the host project. Where you may create rules there, the run's
  own rules are made there as anywhere; where you may not, a network administrator adds two standing rules
  for every dsctl run on that network, once, and dsctl uses them (firewall.standing_rules); until then the
  run is refused with the commands that add them.
- With gcp.public_ips false: the subnet reaches Cloud Storage through Private Google Access or a Cloud NAT.
- What the network's firewalls do to the run, as networks.getEffectiveFirewalls reports them: the organization's
  firewall policies are evaluated before the network's rules
  (https://cloud.google.com/firewall/docs/firewall-policies-overview#rule-evaluation), so a policy rule that denies
  the service ports or SSH between the run's VMs refuses the run, and one that admits them from anywhere is a
  warning (the run's deny rule cannot close what a policy allowed first); the network's own rules that admit the
  service ports are named for the plan (the run's deny rule, priority 910, closes them); and for a run supervised
  from this machine some rule must admit SSH from here.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any

from dsctl.specs import SpecError

from . import firewall
from .clients import Clients
from .retry import call


@dataclass
class NetworkFindings:
    notes: list[str] = field(default_factory=list)
    standing_rules: bool = False  # the network's standing dsctl rules are used instead of the run's own
    subnet_range: str | None = None  # the VMs' internal addresses come from here


def _name(value: str) -> str:
    return value.rsplit("/", 1)[-1]


def check(clients: Clients, *, reaches_vms: bool) -> NetworkFindings:
    """Every check of this module, in order; SpecError at the first refusal."""
    from google.api_core import exceptions as gx

    s = clients.settings
    found = NetworkFindings()
    host = s.network_project
    if host != s.project:
        _shared_vpc(clients, host)
    net = _network(clients, host, found.notes)
    subnet, sub = _subnet(clients, host, net)
    found.subnet_range = sub.ip_cidr_range or None
    _may_use_subnet(clients, host, subnet)
    found.standing_rules = _rules_where(clients, host, found.notes)
    if reaches_vms and not firewall.ssh_rules(clients, from_outside=s.public_ips):
        network = _name(s.network)
        where = " from outside the VPC (dsctl connects to the VMs' external addresses)" if s.public_ips else ""
        raise SpecError(
            f"no firewall rule of network {network} admits SSH (tcp:22) to the VMs{where}, and dsctl starts the "
            f"runtime over SSH. Nothing was created. Add one, e.g. `gcloud compute firewall-rules create "
            f"{network}-allow-ssh --network {network} --allow tcp:22 --source-ranges YOUR_IP/32"
            f"{' --project=' + host if host != s.project else ''}`.", field="gcp.network")
    if not s.public_ips:
        _egress(clients, host, subnet, sub)
    found.notes += _policies(clients, host, found.subnet_range)
    service_ports = firewall.ports(s.dispatcher_port, s.worker_port)
    try:
        wider = firewall.wider_rules(clients, service_ports)
    except gx.Forbidden:
        wider = []
        found.notes.append(f"WARNING: the firewall rules of network {_name(s.network)} could not be read (you lack "
                           f"compute.firewalls.list on project {host}): a rule that admits the tf.data service ports "
                           "from outside the run ahead of its deny rule would go unseen")
    for rule, closed in wider:
        if closed:
            found.notes.append(f"the network's rule {rule} admits the service ports; the run's deny rule "
                               "(priority 910) keeps them to the run's VMs")
        else:
            found.notes.append(f"WARNING: the network's rule {rule} admits the service ports ahead of the run's "
                               "deny rule, so machines outside the run can reach the unauthenticated tf.data "
                               "service ports; raise its priority number above 910 or narrow it")
    return found


def _network(clients: Clients, host: str, notes: list[str]):
    """The run's network; None where it belongs to a host project whose networks you may not read (the subnet is
    what you use there, and gcp.subnetwork must name it)."""
    from google.api_core import exceptions as gx

    s = clients.settings
    name = _name(s.network)
    try:
        return call(clients.networks.get, project=host, network=name, doing=f"reading network {name}")
    except gx.Forbidden:
        if host == s.project:
            raise
        notes.append(f"network {name} of host project {host} could not be read (compute.networks.get): the subnet "
                     "gcp.subnetwork names is checked instead")
        return None
    except gx.NotFound:
        if name == "default" and host == s.project:
            raise SpecError(
                f"project {s.project} has no network named default (projects made under the organization policy "
                "constraints/compute.skipDefaultNetworkCreation have none), and the run's VMs need one. Nothing was "
                "created. Name the network to use (gcp.network, and gcp.subnetwork for a custom-mode one; a Shared "
                "VPC network as projects/HOST/global/networks/NAME), or create one: `gcloud compute networks create "
                f"dsctl --subnet-mode=auto --project={s.project}` (then gcp.network: dsctl).", field="gcp.network"
            ) from None
        raise SpecError(f"network {name} does not exist in project {host} (`gcloud compute networks list "
                        f"--project={host}`).", field="gcp.network") from None


def _shared_vpc(clients: Clients, host: str) -> None:
    """A network of another project is usable only from a Shared VPC service project of that host."""
    s = clients.settings
    attached = call(clients.compute_projects.get_xpn_host, project=s.project,
                    doing=f"reading project {s.project}'s Shared VPC host")
    if (attached.name or "") != host:
        now = f"it is attached to {attached.name}" if attached.name else "it is attached to no host project"
        raise SpecError(
            f"gcp.network names a network of project {host}, which project {s.project} can use only as a Shared VPC "
            f"service project of {host}; {now}. Nothing was created. A Shared VPC administrator attaches it: "
            f"`gcloud compute shared-vpc associated-projects add {s.project} --host-project={host}`; or use a "
            "network of this project.", field="gcp.network")


def _subnet(clients: Clients, host: str, net) -> tuple[str, Any]:
    """The subnet the VMs get their internal addresses from: gcp.subnetwork, else an auto-mode network's own in the
    region (it has the network's name)."""
    s = clients.settings
    if s.subnetwork:
        subnet = _name(s.subnetwork)
    elif net is not None and net.auto_create_subnetworks:
        subnet = _name(s.network)
    else:
        raise SpecError(f"network {_name(s.network)} is a custom-mode VPC: name the subnet in region {s.region} the "
                        "VMs use (gcp.subnetwork).", field="gcp.subnetwork")
    from google.api_core import exceptions as gx

    try:
        sub = call(clients.subnetworks.get, project=host, region=s.region, subnetwork=subnet,
                   doing=f"reading subnet {subnet}")
    except gx.NotFound:
        raise SpecError(f"subnet {subnet} does not exist in region {s.region} of project {host} (`gcloud compute "
                        f"networks subnets list --network={_name(s.network)} --project={host}`).",
                        field="gcp.subnetwork") from None
    return subnet, sub


def _may_use_subnet(clients: Clients, host: str, subnet: str) -> None:
    """compute.subnetworks.use (and useExternalIp with external addresses) on the subnet itself: a network
    administrator grants Compute Network User on one subnet of a host project, which the project never shows."""
    s = clients.settings
    wanted = ["compute.subnetworks.use"] + (["compute.subnetworks.useExternalIp"] if s.public_ips else [])
    reply = call(clients.subnetworks.test_iam_permissions, project=host, region=s.region, resource=subnet,
                 test_permissions_request_resource={"permissions": wanted},
                 doing=f"checking your permissions on subnet {subnet}")
    lacking = [p for p in wanted if p not in set(reply.permissions)]
    if lacking:
        raise SpecError(
            f"your credentials lack {', '.join(lacking)} on subnet {subnet} (region {s.region}, project {host}), so "
            "no VM could be created on it. Nothing was created. A network administrator grants it: `gcloud compute "
            f"networks subnets add-iam-policy-binding {subnet} --region={s.region} --project={host} "
            "--member=user:YOU --role=roles/compute.networkUser`.", field="gcp.subnetwork")


def _rules_where(clients: Clients, host: str, notes: list[str]) -> bool:
    """Whether the run uses the network's standing dsctl rules (True) or makes its own (False): its own where you
    may create firewall rules in the network's project; else the standing ones, which must be there (where you may
    not list the host's rules either, that is a warning with the commands that add them)."""
    from google.api_core import exceptions as gx

    from . import access

    s = clients.settings
    lacking = access.missing(clients, access.Where("project", host), ["compute.firewalls.create",
                                                                      "compute.firewalls.delete",
                                                                      "compute.networks.updatePolicy"],
                             f"checking your permissions on project {host}")
    if not lacking:
        return False
    standing = firewall.standing_rules(_name(s.network), s.dispatcher_port, s.worker_port)
    try:
        missing = firewall.missing_standing(clients, standing)
    except gx.Forbidden:
        notes.append(f"WARNING: the run uses network {_name(s.network)}'s standing dsctl rules, and you may not list "
                     f"project {host}'s firewall rules to see that they are there; without them the run's VMs cannot "
                     f"reach one another. A network administrator adds them: "
                     f"{'; '.join(firewall.commands(standing, host, s.network))}")
        return True
    if not missing:
        return True
    shared = f" (the Shared VPC host of project {s.project})" if host != s.project else ""
    raise SpecError(
        f"you may not create firewall rules in project {host}{shared} (you lack {', '.join(lacking)}), where the "
        "run's own rules would go, and the network has no standing dsctl rules to use instead. Nothing was created. "
        f"A network administrator adds them once, for every dsctl run on network {_name(s.network)}: "
        f"{'; '.join(firewall.commands(missing, host, s.network))}. They admit the tf.data service ports and SSH "
        f"between VMs tagged {firewall.SHARED_TAG} only, and close those ports to everything else; or grant you "
        f"roles/compute.securityAdmin on project {host}.", field="gcp.network")


def _egress(clients: Clients, host: str, subnet: str, sub) -> None:
    """With internal addresses only, the VMs reach Cloud Storage through Private Google Access or a Cloud NAT."""
    s = clients.settings
    if sub.private_ip_google_access:
        return
    network = _name(s.network)
    for router in call(lambda **kw: list(clients.routers.list(**kw)), project=host, region=s.region,
                       doing=f"listing the routers of region {s.region}"):
        if _name(router.network) != network:
            continue
        for nat in router.nats:
            scope = nat.source_subnetwork_ip_ranges_to_nat
            if scope in ("ALL_SUBNETWORKS_ALL_IP_RANGES", "ALL_SUBNETWORKS_ALL_PRIMARY_IP_RANGES") or any(
                    _name(n.name) == subnet for n in nat.subnetworks):
                return
    where = f" --project={host}" if host != s.project else ""
    raise SpecError(
        f"gcp.public_ips is false, so the VMs get internal addresses only, but subnet {subnet} (region {s.region}) has "
        "neither Private Google Access nor a Cloud NAT: the VMs could not reach Cloud Storage for their wheelhouse. "
        "Nothing was created. Turn on Private Google Access (enough for dsctl: `gcloud compute networks subnets update "
        f"{subnet} --region {s.region} --enable-private-ip-google-access{where}`), or add a Cloud NAT (`gcloud compute "
        f"routers create dsctl-nat --network {network} --region {s.region}{where} && gcloud compute routers nats create "
        f"dsctl-nat --router dsctl-nat --region {s.region} --auto-allocate-nat-external-ips --nat-all-subnet-ip-ranges"
        f"{where}`), or set gcp.public_ips: true.", field="gcp.public_ips")


# -- firewall policies (hierarchical, network) -----------------------------------------------------------------------
def _covers(ranges: list[str], subnet_range: str | None) -> bool:
    """A rule's source ranges reach the run's VMs' addresses (its subnet), or everywhere."""
    if not ranges:
        return True
    for r in ranges:
        net = ipaddress.ip_network(r, strict=False)
        if net.prefixlen == 0:
            return True
        sub = ipaddress.ip_network(subnet_range, strict=False) if subnet_range else None
        if sub is not None and sub.version == net.version and sub.subnet_of(net):  # type: ignore[arg-type]
            return True
    return False


def _matches_port(rule, port: int) -> bool:
    configs = list(rule.match.layer4_configs)
    for cfg in configs:
        if cfg.ip_protocol in ("tcp", "all") and (not cfg.ports or any(
                int(p.partition("-")[0]) <= port <= int(p.partition("-")[2] or p.partition("-")[0]) for p in cfg.ports)):
            return True
    return not configs


def _policies(clients: Clients, host: str, subnet_range: str | None) -> list[str]:
    """Refuse what the firewall policies ahead of the network's rules would block between the run's VMs; warn of what
    they admit from anywhere. Policies without permission to read them (compute.networks.getEffectiveFirewalls) are a
    note."""
    from google.api_core import exceptions as gx

    s = clients.settings
    try:
        effective = call(clients.networks.get_effective_firewalls, project=host, network=_name(s.network),
                         doing=f"reading the firewall policies of network {_name(s.network)}")
    except gx.Forbidden:
        return [f"the firewall policies that apply to network {_name(s.network)} could not be read (you lack "
                "compute.networks.getEffectiveFirewalls): a policy that blocks the service ports between the run's VMs "
                "would show only when the run starts"]
    probe_ports = {p: w for p, w in ((int(firewall.ports(s.dispatcher_port, s.worker_port)[0].split("-")[0]),
                                      "the tf.data service ports"), (22, "SSH"))}
    notes = []
    for port, what in probe_ports.items():
        decided = False
        for policy in effective.firewall_policys:
            for rule in sorted(policy.rules, key=lambda r: r.priority):
                if decided or rule.direction not in ("INGRESS", "") or getattr(rule, "disabled", False):
                    continue
                if not _matches_port(rule, port):
                    continue
                ranges = list(rule.match.src_ip_ranges)
                if rule.action == "deny" and _covers(ranges, subnet_range):
                    raise SpecError(
                        f"the firewall policy {policy.short_name or policy.name} (rule priority {rule.priority}) denies "
                        f"tcp:{port} ({what}) from the run's VMs' addresses before the network's own rules are "
                        "evaluated, so the run's VMs could not reach one another. Nothing was created. Ask a network "
                        f"administrator to let tcp:{port} between VMs tagged {firewall.SHARED_TAG} through (a rule with "
                        "action goto_next or allow ahead of it), or use another network (gcp.network).",
                        field="gcp.network")
                if rule.action == "allow":
                    if any(ipaddress.ip_network(r, strict=False).prefixlen == 0 for r in ranges) and port != 22:
                        notes.append(f"WARNING: the firewall policy {policy.short_name or policy.name} (priority "
                                     f"{rule.priority}) admits {what} from anywhere ahead of the run's deny rule, so "
                                     "machines outside the run can reach the unauthenticated tf.data service")
                    decided = True
                elif rule.action == "deny":
                    decided = True
    return notes
