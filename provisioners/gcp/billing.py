"""What a gcp run creates that bills, as the provider declares it (the contract's Bill): its VMs by role and how
each is bought, and, beside the paper's Equation 1, what they bring besides their vCPUs, memory and accelerators:
  external IPv4 addresses  one per VM while it runs when gcp.public_ips is true, priced by how the VM is bought
                           (Google's VPC pricing: $0.005/h on a standard VM, $0.0025/h on a Spot VM);
  boot disks               a gcp.boot_disk_gb disk of gcp.boot_disk_type per Compute Engine VM, for all of the job
                           (a stopped VM's disk still bills), $ per GB-month turned into hours as Google does (730 h).
The cost model prices them from the catalog's external_ipv4 (by provisioning model) and boot_disks (by disk type).

TPU VMs (Cloud TPU) are treated so:
  - external IPv4: a TPU VM gets an external address unless gcp.public_ips is false (tpu.py asks for one with
    enable_external_ips). Google's IP pricing does not single out TPU VMs, so the address is charged as any VM's, at
    the rate of how the TPU VM is bought: if Google does not bill it, this overstates the cost by $0.005/h per TPU VM,
    beside a TPU VM's dollars per hour.
  - boot disk: none. Cloud TPU bills a TPU VM per chip-hour with its host, and the TPU VM comes with its own boot disk
    ("A TPU VM includes a 100 GiB boot disk", Cloud TPU documentation); dsctl neither sizes nor types it
    (gcp.boot_disk_gb and gcp.boot_disk_type apply to Compute Engine VMs only), so nothing is added for it.

What a run created is kept with its record when it ends (Created.to_dict, in the summary's cost.created): the
spec's gcp.public_ips, gcp.boot_disk_gb and gcp.boot_disk_type (or the defaults of the dsctl that ran it) and its
VMs by role. An older record without it is read from its spec when the spec says all three; when it left them to
defaults, which have changed (public_ips was false once), it is "not recorded" rather than a guess.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any, Literal

from dsctl.costmodel import Catalog
from dsctl.costmodel.extras import Addition, Additions, Charge, Extra, price_extras
from dsctl.costmodel.machines import accelerator_of
from dsctl.costmodel.provisioning import PROVISIONING_LABEL
from dsctl.specs.schema import GcpSpec, JobSpec

from ..contract import Bill, Billed, BillRole, MachineGroup
from .machinetypes import machine_kind

RECORDED = "recorded"
FROM_SPEC = "from the run's spec"
SETTINGS = ("public_ips", "boot_disk_gb", "boot_disk_type")  # what the spec says of the additions


@dataclass(frozen=True)
class VmGroup:
    """VMs of one role: how many, of which machine type, bought how, and whether they are TPU VMs."""

    role: BillRole
    machine: str
    count: int
    provisioning: Literal["standard", "spot"]
    tpu: bool = False


@dataclass(frozen=True)
class Created:
    """What a gcp run creates besides its machines' vCPUs and memory: external addresses (or not), boot disks, and
    its VMs; kept with the run's record when it ends."""

    public_ips: bool
    boot_disk_gb: int
    boot_disk_type: str
    vms: tuple[VmGroup, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"public_ips": self.public_ips, "boot_disk_gb": self.boot_disk_gb, "boot_disk_type": self.boot_disk_type,
                "vms": [asdict(g) for g in self.vms]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Created:
        return cls(public_ips=bool(d["public_ips"]), boot_disk_gb=int(d["boot_disk_gb"]),
                   boot_disk_type=str(d["boot_disk_type"]), vms=tuple(VmGroup(**g) for g in d["vms"]))


def dispatcher_provisioning(service: Literal["standard", "spot"],
                            supervisor: str) -> Literal["standard", "spot"]:
    """How the dispatcher VM is bought: on-demand when it runs the run's supervisor (gcp.supervisor: vm), whatever
    service.provisioning says, since a preempted supervisor would leave the run unsupervised; else as the service."""
    return "standard" if supervisor == "vm" else service


def created_from_spec(spec: JobSpec, *, workers: int | None = None, trainers: int | None = None) -> Created:
    """What `spec` creates on Google Cloud with `workers` workers (default the spec's; 0: colocated, no dispatcher)
    and `trainers` trainers: the gcp section's settings, or their defaults when it has none."""
    g = spec.gcp or GcpSpec()
    n_workers = spec.service.workers if workers is None else workers
    n_trainers = spec.trainer.count if trainers is None else trainers
    svc, tr = spec.service, spec.trainer
    vms = []
    if n_workers:
        dispatcher = dispatcher_provisioning(svc.provisioning, g.supervisor)  # its address is charged at that rate
        vms.append(VmGroup("dispatcher", svc.dispatcher_machine, 1, dispatcher, _tpu(svc.dispatcher_machine)))
        vms.append(VmGroup("workers", svc.worker_machine, n_workers, svc.provisioning, _tpu(svc.worker_machine)))
    vms.append(VmGroup("trainers", tr.machine, n_trainers, tr.provisioning, _tpu(tr.machine)))
    return Created(public_ips=g.public_ips, boot_disk_gb=g.boot_disk_gb, boot_disk_type=g.boot_disk_type,
                   vms=tuple(vms))


def _tpu(machine: str) -> bool:
    return accelerator_of(machine)[0] == "tpu"


def _plural(n: int, word: str, words: str | None = None) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {words or word + 's'}"


def ipv4(created: Created) -> Extra:
    """External IPv4 addresses: one per VM (TPU VMs included) while it runs when gcp.public_ips is true, none
    otherwise."""
    if not created.public_ips:
        return Extra("external_ipv4", "ipv4_cost", "external IPv4", "none (gcp.public_ips: false)", 0)
    count = sum(g.count for g in created.vms)
    charges = tuple(Charge("external_ipv4", g.provisioning, g.count, role=g.role, while_running=True,
                           what=f"external IPv4 addresses on {PROVISIONING_LABEL[g.provisioning]} VMs",
                           source_label=f"external IPv4 ({'Spot' if g.provisioning == 'spot' else 'standard'} VMs)")
                    for g in created.vms)
    notes = ("TPU VMs' external addresses are charged as any VM's (Google's IP pricing does not single out TPU VMs; an "
             "upper bound)",) if any(g.tpu for g in created.vms) else ()
    return Extra("external_ipv4", "ipv4_cost", "external IPv4", _plural(count, "address", "addresses"), count,
                 charges, notes)


def boot_disks(created: Created) -> Extra:
    """A gcp.boot_disk_gb disk of gcp.boot_disk_type per Compute Engine VM, none for TPU VMs (theirs comes with the
    TPU VM). Billed while the VMs exist, stopped or not: for all of the job's time."""
    disks = sum(g.count for g in created.vms if not g.tpu)
    notes = ("TPU VMs: no boot disk added (a TPU VM comes with its own, billed with the TPU VM; gcp.boot_disk_gb "
             "does not size it)",) if any(g.tpu for g in created.vms) else ()
    if not disks:
        return Extra("boot_disks", "boot_disk_cost", "boot disks", "none", 0, notes=notes)
    kind = created.boot_disk_type
    charges = tuple(Charge("boot_disks", kind, g.count, per_machine=created.boot_disk_gb, role=g.role,
                           price_unit="per_gb_month", what=f"{kind} boot disks", source_label=f"{kind} boot disk")
                    for g in created.vms if not g.tpu)
    return Extra("boot_disks", "boot_disk_cost", "boot disks", f"{disks} x {created.boot_disk_gb} GB {kind}", disks,
                 charges, notes)


def _kind(machine: str) -> str:
    return {"tpu": "TPU VM", "gpu": "GPU VM"}.get(machine_kind(machine).kind, "VM")


def bill_of(created: Created) -> Bill:
    """The Bill of what a gcp run created: its VMs, and their addresses and boot disks."""
    machines = tuple(MachineGroup(g.role, g.machine, g.count, g.provisioning, _kind(g.machine)) for g in created.vms)
    return Bill(machines=machines, extras=(ipv4(created), boot_disks(created)), kept=created.to_dict())


def bill(spec: JobSpec, workers: int, trainers: int) -> Bill:
    """What a gcp run of `spec` with `workers` workers (0: colocated) and `trainers` trainers creates that bills."""
    return bill_of(created_from_spec(spec, workers=workers, trainers=trainers))


def billed(kept: dict[str, Any] | None, spec_json: str, workers: int, trainers: int) -> Billed:
    """What a recorded gcp run created: as it recorded it, else from its spec when the spec names every setting it
    depends on (gcp.public_ips, gcp.boot_disk_gb, gcp.boot_disk_type), else not known."""
    if kept:
        return Billed(bill_of(Created.from_dict(kept)), RECORDED)
    raw = json.loads(spec_json).get("gcp")
    if isinstance(raw, dict) and all(k in raw for k in SETTINGS):
        return Billed(bill(JobSpec.model_validate_json(spec_json), workers, trainers), FROM_SPEC)
    return Billed(None, "not recorded: the run's record predates dsctl keeping what a run created, and its spec left "
                        "gcp.public_ips, gcp.boot_disk_gb or gcp.boot_disk_type to defaults that have changed since")


@dataclass(frozen=True)
class GcpAdditions:
    """A gcp run's two additions to Equation 1, by name."""

    additions: Additions

    @property
    def ipv4(self) -> Addition:
        found = self.additions.get("external_ipv4")
        assert found is not None, "every gcp bill has its external IPv4 addresses"
        return found

    @property
    def boot_disks(self) -> Addition:
        found = self.additions.get("boot_disks")
        assert found is not None, "every gcp bill has its boot disks"
        return found

    @property
    def per_hour(self) -> float | None:
        return self.additions.per_hour

    @property
    def cost(self) -> float | None:
        return self.additions.cost

    @property
    def sources(self) -> tuple[Any, ...]:
        return self.additions.sources

    def to_dict(self) -> dict[str, Any]:
        return self.additions.to_dict()


def price_additions(created: Created, catalog: Catalog, job_time_s: float | None = None,
                    stopped_s: dict[str, float] | None = None) -> GcpAdditions:
    """Both additions for what a gcp run created, per hour and (when job_time_s is given) over the job."""
    return GcpAdditions(price_extras(bill_of(created).extras, catalog, job_time_s, stopped_s))
