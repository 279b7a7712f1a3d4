"""Compute Engine VMs: the request bodies, and the calls that create, list and delete them.

Workers are created with ONE bulkInsert call whatever their number; the
dispatcher and each GPU/CPU trainer with an insert. VMs get an ephemeral external
address (unless gcp.public_ips is false), the run's network tag (for the firewall
rules), its labels, the run's SSH public key and a startup script in their
metadata, its service account (accounts.py) and, where its image supports it, Shielded VM
with Secure Boot (gcp.shielded_vm). Every VM of a run carries a maximum run time (maxRunDuration, with
instanceTerminationAction DELETE): Compute Engine deletes it then, disks and all,
whatever became of dsctl. Spot VMs are created as Spot (provisioningModel SPOT); the
termination action is also what a preemption does, so a preempted Spot VM of a run is
deleted, not stopped. GPU VMs stop for host maintenance, as GPUs cannot live-migrate.
Bulk insert's instanceProperties take bare names (machine, disk and accelerator
types), single inserts zonal URLs: the API refuses the other form.
"""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass
from typing import Literal

from .clients import Clients
from .machinetypes import machine_kind
from .retry import call
from .settings import GcpSettings


@dataclass
class VmConfig:
    """Everything that differs between the run's VMs, besides their names."""

    machine: str
    labels: dict
    tag: str
    metadata: dict  # key -> value (ssh-keys, startup-script, dsctl-*)
    image: str = ""  # boot image (a family or image URL)
    provisioning: Literal["standard", "spot"] = "standard"  # on-demand, or Spot
    max_run_s: float | None = None  # Compute Engine deletes the VM after this long (every run's VMs have one)
    service_account: str | None = None  # what the VM runs as (accounts.py); None: the project's default account
    shielded: bool = False  # Shielded VM with Secure Boot (its image supports it, gcp.shielded_vm)


def _network_url(s: GcpSettings) -> str:
    return s.network if "/" in s.network else f"projects/{s.project}/global/networks/{s.network}"


def _subnetwork_url(s: GcpSettings) -> str | None:
    if not s.subnetwork:
        return None
    return s.subnetwork if "/" in s.subnetwork else f"projects/{s.project}/regions/{s.region}/subnetworks/{s.subnetwork}"


def _common(s: GcpSettings, vm: VmConfig, *, zonal_urls: bool) -> dict:
    """Fields shared by Instance (single insert, zonal URLs) and InstanceProperties (bulk, bare names)."""
    from google.cloud import compute_v1 as c

    kind = machine_kind(vm.machine)
    disk_type = f"zones/{s.zone}/diskTypes/{s.boot_disk_type}" if zonal_urls else s.boot_disk_type
    nic = c.NetworkInterface(network=_network_url(s))
    subnetwork = _subnetwork_url(s)
    if subnetwork:
        nic.subnetwork = subnetwork
    if s.public_ips:
        nic.access_configs = [c.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")]
    fields = dict(
        labels=dict(vm.labels),
        tags=c.Tags(items=tags(s, vm.tag)),
        disks=[c.AttachedDisk(boot=True, auto_delete=True, initialize_params=c.AttachedDiskInitializeParams(
            source_image=vm.image, disk_size_gb=s.boot_disk_gb, disk_type=disk_type, labels=dict(vm.labels)))],
        network_interfaces=[nic],
        metadata=c.Metadata(items=[c.Items(key=k, value=v) for k, v in vm.metadata.items()]),
    )
    fields["service_accounts"] = [c.ServiceAccount(email=vm.service_account or "default",
                                                   scopes=["https://www.googleapis.com/auth/cloud-platform"])]
    if vm.shielded:
        # What compute.requireShieldedVm requires of a new VM: Secure Boot, vTPM and integrity monitoring
        # (https://cloud.google.com/compute/shielded-vm/docs/shielded-vm).
        fields["shielded_instance_config"] = c.ShieldedInstanceConfig(
            enable_secure_boot=True, enable_vtpm=True, enable_integrity_monitoring=True)
    if kind.kind == "gpu":
        acc_type = f"zones/{s.zone}/acceleratorTypes/{kind.accelerator}" if zonal_urls else kind.accelerator
        fields["guest_accelerators"] = [c.AcceleratorConfig(accelerator_type=acc_type, accelerator_count=kind.count)]
    fields["scheduling"] = scheduling(vm.provisioning, gpu=kind.kind == "gpu", max_run_s=vm.max_run_s)
    return fields


def tags(s: GcpSettings, run_tag: str) -> list[str]:
    """A VM's network tags: the run's (its own firewall rules name it), and where the network's standing dsctl rules
    are used instead, the tag those name (firewall.SHARED_TAG)."""
    from .firewall import SHARED_TAG

    return [run_tag, SHARED_TAG] if s.standing_rules else [run_tag]


def scheduling(provisioning: str, *, gpu: bool, max_run_s: float | None = None):
    """Spot: preemptible, never restarted by Compute Engine; GPU VMs stop for host maintenance (they cannot
    live-migrate) and come back; others live-migrate.

    With max_run_s, Compute Engine itself deletes the VM after that long (maxRunDuration, 30 s to 120 days),
    whatever happens to dsctl. The action is DELETE for Spot VMs too: STOP would leave their disks billing, and
    one termination action serves both the limit and a preemption. Without a limit a Spot VM is stopped when
    preempted (what Compute Engine does by default).
    """
    from google.cloud import compute_v1 as c

    limit = {}
    if max_run_s is not None:
        limit = dict(max_run_duration=c.Duration(seconds=int(max_run_s)), instance_termination_action="DELETE")
    if provisioning == "spot":
        return c.Scheduling(provisioning_model="SPOT", automatic_restart=False, on_host_maintenance="TERMINATE",
                            **{"instance_termination_action": "STOP", **limit})
    if gpu:
        return c.Scheduling(provisioning_model="STANDARD", on_host_maintenance="TERMINATE", automatic_restart=True,
                            **limit)
    return c.Scheduling(provisioning_model="STANDARD", on_host_maintenance="MIGRATE", automatic_restart=True, **limit)


def instance_body(s: GcpSettings, name: str, vm: VmConfig):
    from google.cloud import compute_v1 as c

    return c.Instance(name=name, machine_type=f"zones/{s.zone}/machineTypes/{vm.machine}",
                      **_common(s, vm, zonal_urls=True))


def bulk_body(s: GcpSettings, names: list[str], vm: VmConfig):
    """One bulkInsert request for `names`: all or nothing (min_count = count)."""
    from google.cloud import compute_v1 as c

    props = c.InstanceProperties(machine_type=vm.machine, **_common(s, vm, zonal_urls=False))
    return c.BulkInsertInstanceResource(
        count=len(names), min_count=len(names), instance_properties=props,
        per_instance_properties={n: c.BulkInsertInstanceResourcePerInstanceProperties() for n in names},
    )


# -- calls ---------------------------------------------------------------------------------------------
def insert(clients: Clients, name: str, vm: VmConfig, cancel: threading.Event | None = None):
    from google.cloud import compute_v1 as c

    s = clients.settings
    request = c.InsertInstanceRequest(project=s.project, zone=s.zone, instance_resource=instance_body(s, name, vm),
                                      request_id=str(uuid.uuid4()))
    return call(clients.instances.insert_unary, request=request, doing=f"creating VM {name}", cancel=cancel)


def bulk_insert(clients: Clients, names: list[str], vm: VmConfig, cancel: threading.Event | None = None):
    from google.cloud import compute_v1 as c

    s = clients.settings
    request = c.BulkInsertInstanceRequest(project=s.project, zone=s.zone,
                                          bulk_insert_instance_resource_resource=bulk_body(s, names, vm),
                                          request_id=str(uuid.uuid4()))
    return call(clients.instances.bulk_insert_unary, request=request,
                doing=f"creating {len(names)} VMs ({names[0]} ...)", cancel=cancel)


def list_instances(clients: Clients, filter_: str, cancel: threading.Event | None = None) -> list:
    """Every instance in the zone matching the filter (all pages)."""
    from google.cloud import compute_v1 as c

    s = clients.settings
    out, token = [], None
    while True:
        request = c.ListInstancesRequest(project=s.project, zone=s.zone, filter=filter_, max_results=500,
                                         page_token=token or "")
        # One page per call, so each call is retried on its own.
        page = call(lambda **kw: next(iter(clients.instances.list(**kw).pages)), request=request,
                    doing="listing the run's VMs", cancel=cancel)
        out.extend(page.items)
        token = page.next_page_token
        if not token:
            return out


def delete(clients: Clients, name: str, cancel: threading.Event | None = None):
    """Start deleting a VM; None if it does not exist."""
    from google.api_core import exceptions as gx
    from google.cloud import compute_v1 as c

    s = clients.settings
    request = c.DeleteInstanceRequest(project=s.project, zone=s.zone, instance=name, request_id=str(uuid.uuid4()))
    try:
        return call(clients.instances.delete_unary, request=request, doing=f"deleting VM {name}", cancel=cancel)
    except gx.NotFound:
        return None


def start(clients: Clients, name: str, cancel: threading.Event | None = None):
    """Start a stopped VM (a preempted Spot VM, or one stopped by hand); it keeps its internal address."""
    from google.cloud import compute_v1 as c

    s = clients.settings
    request = c.StartInstanceRequest(project=s.project, zone=s.zone, instance=name, request_id=str(uuid.uuid4()))
    return call(clients.instances.start_unary, request=request, doing=f"starting VM {name}", cancel=cancel)


def statuses(clients: Clients, filter_: str, cancel: threading.Event | None = None) -> dict:
    """name -> (status, internal address, external address) of every instance matching the filter."""
    return {i.name: (i.status, *addresses(i)) for i in list_instances(clients, filter_, cancel)}


def addresses(instance) -> tuple[str | None, str | None]:
    """(internal, external) address of an instance; external is None without an access config."""
    nics = list(instance.network_interfaces)
    if not nics:
        return None, None
    external = next((ac.nat_i_p for ac in nics[0].access_configs if ac.nat_i_p), None)
    return nics[0].network_i_p or None, external
