"""Checks against the live project before anything is created: a refusal here costs nothing.

- permissions: the caller's, by Cloud Resource Manager's testIamPermissions on the project,
  for exactly what this run will do (instances, firewall rules, TPU queued resources, the
  staging bucket, acting as the VMs' service account);
- the organization's policies that would refuse the run's VMs (orgpolicy.py: external
  addresses, boot images), where the caller may read them (else a note in the plan);
- the VMs' service account (serviceaccount.py): dsctl's own where the caller may make it
  (made in `up`, after the plan is confirmed), else the chosen one, checked for the roles
  the VMs need;
- what the spec names exists in the zone: machine types, GPU types, boot images, TPU types
  and the TPU runtime;
- the region's Compute Engine quota for the VMs' vCPUs and GPUs, at the run's largest
  (quota.py; TPU quota is Cloud TPU's and is not read);
- the network: some rule admits SSH to the VMs; with gcp.public_ips false, the subnet can
  reach Cloud Storage (Private Google Access, or a Cloud NAT on the region's router), else
  no VM could fetch its wheelhouse; and which of the network's own rules would have opened
  the service ports (the run's deny rule closes them), for the plan.

Each refusal is one paragraph naming the cause and the command or field that fixes it
(SpecError: exit 2, nothing created). Only reads are made here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dsctl.specs import SpecError
from dsctl.specs.schema import JobSpec

from . import firewall, orgpolicy, quota, serviceaccount
from .clients import Clients
from .machinetypes import machine_kind
from .retry import call
from .software import Software, tpu_generation

ROLES = {
    "compute.instances.osLogin": "Compute OS Login (SSH to the run's VMs through OS Login)",
    "compute.": "Compute Instance Admin (v1) and Compute Security Admin (firewall rules)",
    "tpu.": "TPU Admin",
    "storage.": "Storage Admin",
    "iam.serviceAccounts.actAs": "Service Account User (on the VMs' service account)",
}


@dataclass
class Findings:
    """What the checks learned, for the plan and the run."""

    project_number: str | None = None
    service_account: str | None = None  # the VMs' service account
    account: serviceaccount.AccountPlan | None = None  # ... and what `up` does to it (serviceaccount.ensure)
    notes: list[str] = field(default_factory=list)


def required_permissions(spec: JobSpec, public_ips: bool) -> list[str]:
    perms = ["compute.instances.create", "compute.instances.delete", "compute.instances.get", "compute.instances.list",
             "compute.instances.setMetadata", "compute.instances.setTags", "compute.instances.setLabels",
             "compute.instances.setServiceAccount", "compute.disks.create", "compute.subnetworks.use",
             "compute.firewalls.create", "compute.firewalls.delete", "compute.firewalls.list",
             "compute.networks.updatePolicy", "compute.zoneOperations.get", "compute.globalOperations.get",
             "iam.serviceAccounts.actAs", "compute.instances.osLogin",
             "storage.buckets.get", "storage.buckets.getIamPolicy", "storage.buckets.setIamPolicy",
             "storage.objects.create", "storage.objects.delete", "storage.objects.get", "storage.objects.list"]
    if public_ips:
        perms.append("compute.subnetworks.useExternalIp")
    if machine_kind(spec.trainer.machine).kind == "tpu":
        perms += ["tpu.nodes.get", "tpu.nodes.list", "tpu.nodes.delete", "tpu.queuedResources.create",
                  "tpu.queuedResources.get", "tpu.queuedResources.list", "tpu.queuedResources.delete",
                  "tpu.operations.get"]
    return perms


def supervisor_permissions(spec: JobSpec, public_ips: bool) -> list[str]:
    """What a run's supervisor on the dispatcher VM does with the VMs' service account (orchestrator/supervise.py):
    watch and restart VMs, publish the record, delete everything; with autoscaling, create workers too."""
    perms = ["compute.instances.delete", "compute.instances.get", "compute.instances.list", "compute.instances.start",
             "compute.instances.osLogin", "iam.serviceAccounts.actAs", "compute.firewalls.delete",
             "compute.firewalls.list", "compute.zoneOperations.get",
             "compute.globalOperations.get", "storage.objects.create", "storage.objects.delete",
             "storage.objects.get", "storage.objects.list"]
    if spec.autoscale is not None:
        perms += [p for p in required_permissions(spec, public_ips) if p.startswith("compute.") and p not in perms]
    if machine_kind(spec.trainer.machine).kind == "tpu":
        perms += ["tpu.nodes.get", "tpu.nodes.list", "tpu.nodes.delete", "tpu.queuedResources.get",
                  "tpu.queuedResources.list", "tpu.queuedResources.delete", "tpu.operations.get"]
    return perms


def missing_permissions(clients: Clients, wanted: list[str], doing: str) -> list[str]:
    """The permissions of `wanted` the caller's credentials do not have on the run's project."""
    s = clients.settings
    granted: set[str] = set()
    for i in range(0, len(wanted), 100):  # the API takes at most 100 at a time
        reply = call(clients.projects.test_iam_permissions,
                     request={"resource": f"projects/{s.project}", "permissions": wanted[i:i + 100]}, doing=doing)
        granted |= set(reply.permissions)
    return [p for p in wanted if p not in granted]


def check_permissions(clients: Clients, spec: JobSpec) -> None:
    s = clients.settings
    missing = missing_permissions(clients, required_permissions(spec, s.public_ips),
                                  f"checking your permissions on project {s.project}")
    if missing:
        roles = sorted({next(role for prefix, role in ROLES.items() if p.startswith(prefix)) for p in missing
                        if any(p.startswith(prefix) for prefix in ROLES)})
        raise SpecError(
            f"your credentials lack {len(missing)} permission(s) this run needs on project {s.project}: "
            f"{', '.join(missing[:8])}{' ...' if len(missing) > 8 else ''}. Nothing was created. Grant the roles "
            f"{'; '.join(roles)} (gcloud projects add-iam-policy-binding {s.project} --member=user:YOU --role=...), "
            "or run dsctl with credentials that have them.")


def project_number(clients: Clients) -> str:
    s = clients.settings
    project = call(clients.projects.get_project, name=f"projects/{s.project}", doing=f"reading project {s.project}")
    return project.name.rsplit("/", 1)[-1]


def _exists(fn, doing: str, **kwargs) -> bool:
    from google.api_core import exceptions as gx

    try:
        call(fn, doing=doing, **kwargs)
        return True
    except gx.NotFound:
        return False


def check_catalog(clients: Clients, spec: JobSpec, software: Software) -> None:
    """The machine types, GPU types, images and TPU runtime the run names exist in its zone."""
    s = clients.settings
    machines = {("service", "worker_machine"): spec.service.worker_machine,
                ("service", "dispatcher_machine"): spec.service.dispatcher_machine}
    kind = machine_kind(spec.trainer.machine)
    if kind.kind != "tpu":
        machines[("trainer", "machine")] = spec.trainer.machine
    for loc, machine in machines.items():
        if not _exists(clients.machine_types.get, f"looking up machine type {machine}", project=s.project, zone=s.zone,
                       machine_type=machine):
            raise SpecError(f"machine type {machine} is not offered in zone {s.zone} (`gcloud compute machine-types "
                            f"list --zones {s.zone}`); pick another type or zone (gcp.zone).", field=".".join(loc))
    if kind.kind == "gpu" and not _exists(clients.accelerator_types.get, f"looking up GPU type {kind.accelerator}",
                                          project=s.project, zone=s.zone, accelerator_type=kind.accelerator):
        raise SpecError(f"{spec.trainer.machine}'s GPUs ({kind.accelerator}) are not offered in zone {s.zone} "
                        f"(`gcloud compute accelerator-types list --filter=zone:{s.zone}`); pick another zone.",
                        field="trainer.machine")
    for k in software.kinds.values():
        if k.kind != "tpu" and not _image_exists(clients, k.image):
            raise SpecError(f"the boot image {k.image} does not exist or is not readable; check the family "
                            f"(`gcloud compute images describe-from-family ...`).",
                            field="gcp.gpu_image" if k.kind == "gpu" else "gcp.image")
    if kind.kind == "tpu":
        generation, _ = tpu_generation(spec.trainer.machine)
        accelerator = spec.trainer.machine.removeprefix("tpu-")
        where = f"projects/{s.project}/locations/{s.zone}"
        if not _exists(clients.tpu.get_accelerator_type, f"looking up TPU type {accelerator}",
                       name=f"{where}/acceleratorTypes/{accelerator}"):
            raise SpecError(f"TPU {accelerator} is not offered in zone {s.zone} (`gcloud compute tpus accelerator-types "
                            f"list --zone {s.zone}`); pick another zone (gcp.zone).", field="trainer.machine")
        tpu = software.for_kind("tpu")
        runtime = tpu.image
        if not _exists(clients.tpu.get_runtime_version, f"looking up TPU runtime {runtime}",
                       name=f"{where}/runtimeVersions/{runtime}"):
            listed = f"is not offered in zone {s.zone} (`gcloud compute tpus versions list --zone {s.zone}`)"
            if tpu.jax:  # JAX's TPU software: the image does not depend on the TensorFlow version
                raise SpecError(f"the TPU runtime {runtime} (JAX's TPU software for TPU {generation}) {listed}; name one "
                                "that is in gcp.tpu_runtime_version, or pick another zone.",
                                field="gcp.tpu_runtime_version")
            raise SpecError(f"the TPU runtime {runtime} (TensorFlow {software.tensorflow_version} on TPU {generation}) "
                            f"{listed}; set gcp.tensorflow_version to another version, or another zone.",
                            field="gcp.tensorflow_version")


def _image_exists(clients: Clients, image: str) -> bool:
    parts = image.split("/")
    if "projects" not in parts or "images" not in parts:
        return True  # an image URL form dsctl does not parse: the insert will tell
    project = parts[parts.index("projects") + 1]
    if parts[-2] == "family":
        return _exists(clients.images.get_from_family, f"looking up image family {parts[-1]}", project=project,
                       family=parts[-1])
    return _exists(clients.images.get, f"looking up image {parts[-1]}", project=project, image=parts[-1])


def _subnet(clients: Clients) -> tuple[str, str]:
    """(subnet name, network name) the VMs get their internal addresses from."""
    s = clients.settings
    network = s.network.rsplit("/", 1)[-1]
    if s.subnetwork:
        return s.subnetwork.rsplit("/", 1)[-1], network
    net = call(clients.networks.get, project=s.project, network=network, doing=f"reading network {network}")
    if not net.auto_create_subnetworks:
        raise SpecError(f"network {network} is a custom-mode VPC: name the subnet in region {s.region} the VMs use "
                        "(gcp.subnetwork).", field="gcp.subnetwork")
    return network, network  # an auto-mode network's subnet in each region has the network's name


def check_egress(clients: Clients) -> None:
    """With internal addresses only, the VMs reach Cloud Storage through Private Google Access or a Cloud NAT."""
    s = clients.settings
    subnet, network = _subnet(clients)
    sub = call(clients.subnetworks.get, project=s.project, region=s.region, subnetwork=subnet,
               doing=f"reading subnet {subnet}")
    if sub.private_ip_google_access:
        return
    for router in call(lambda **kw: list(clients.routers.list(**kw)), project=s.project, region=s.region,
                       doing=f"listing the routers of region {s.region}"):
        if router.network.rsplit("/", 1)[-1] != network:
            continue
        for nat in router.nats:
            scope = nat.source_subnetwork_ip_ranges_to_nat
            if scope in ("ALL_SUBNETWORKS_ALL_IP_RANGES", "ALL_SUBNETWORKS_ALL_PRIMARY_IP_RANGES") or any(
                    n.name.rsplit("/", 1)[-1] == subnet for n in nat.subnetworks):
                return
    raise SpecError(
        f"gcp.public_ips is false, so the VMs get internal addresses only, but subnet {subnet} (region {s.region}) has "
        "neither Private Google Access nor a Cloud NAT: the VMs could not reach Cloud Storage for their wheelhouse. "
        "Nothing was created. Turn on Private Google Access (enough for dsctl: `gcloud compute networks subnets update "
        f"{subnet} --region {s.region} --enable-private-ip-google-access`), or add a Cloud NAT (`gcloud compute routers "
        f"create dsctl-nat --network {network} --region {s.region} && gcloud compute routers nats create dsctl-nat "
        f"--router dsctl-nat --region {s.region} --auto-allocate-nat-external-ips --nat-all-subnet-ip-ranges`), or "
        "set gcp.public_ips: true.", field="gcp.public_ips")


def check_network(clients: Clients, findings: Findings, reaches_vms: bool = True) -> None:
    """SSH to the VMs from this machine (`reaches_vms`: a run supervised from here; a run handed over is reached
    from its dispatcher VM only, through the run's own rule), their way out to Cloud Storage, and the network's
    rules that admit the service ports."""
    s = clients.settings
    if reaches_vms and not firewall.ssh_rules(clients, from_outside=s.public_ips):
        network = s.network.rsplit("/", 1)[-1]
        where = "from outside the VPC (dsctl connects to the VMs' external addresses)" if s.public_ips else ""
        raise SpecError(
            f"no firewall rule of network {network} admits SSH (tcp:22) to the VMs {where}, and dsctl starts the "
            f"runtime over SSH. Nothing was created. Add one, e.g. `gcloud compute firewall-rules create "
            f"{network}-allow-ssh --network {network} --allow tcp:22 --source-ranges YOUR_IP/32`.", field="gcp.network")
    if not s.public_ips:
        check_egress(clients)
    service_ports = firewall.ports(s.dispatcher_port, s.worker_port)
    for rule, closed in firewall.wider_rules(clients, service_ports):
        if closed:
            findings.notes.append(f"the network's rule {rule} admits the service ports; the run's deny rule "
                                  "(priority 910) keeps them to the run's VMs")
        else:
            findings.notes.append(f"WARNING: the network's rule {rule} admits the service ports ahead of the run's "
                                  "deny rule, so machines outside the run can reach the unauthenticated tf.data "
                                  "service ports; raise its priority number above 910 or narrow it")


def run(clients: Clients, spec: JobSpec, software: Software, reaches_vms: bool = True,
        workers: int | None = None) -> Findings:
    """Every check, in the order that fails cheapest; returns what the plan should say. `reaches_vms`: this machine
    connects to the VMs (a run supervised from here), so SSH from here must be admitted; else the run is handed over
    to its dispatcher VM. `workers`: the most workers the run will have (None: from the spec; 0: trainers only)."""
    findings = Findings()
    serviceaccount.refuse_none(clients.settings.service_account)  # VMs that nothing could end
    check_permissions(clients, spec)
    findings.project_number = project_number(clients)
    check_catalog(clients, spec, software)
    findings.notes += quota.check(clients, spec, workers=workers, hands_off=not reaches_vms)
    policies = orgpolicy.check(clients, software)
    findings.notes += policies.notes
    s = clients.settings
    lacking = [] if s.service_account else missing_permissions(clients, serviceaccount.MAKES_ACCOUNTS,
                                                               f"checking your permissions on project {s.project}")
    findings.account = serviceaccount.decide(clients, spec, findings.project_number, lacking=lacking,
                                             may_not_create=policies.service_account_creation_disabled)
    findings.service_account = findings.account.email
    findings.notes += findings.account.notes
    check_network(clients, findings, reaches_vms)
    return findings
