"""What a run creates besides its machines' vCPUs, memory and accelerators: additions to the paper's Equation 1.

Equation 1 (equation.py) prices a job's machines. A Google Cloud run also bills for:
  external IPv4 addresses  $ per hour per in-use address, by the VM's provisioning model
                           (Google's VPC pricing: $0.005/h on a standard VM, $0.0025/h on a Spot VM);
  boot disks               $ per GB-month by disk type, turned into hours as Google does (730 h a month).
Neither is in the paper's model, so dsctl shows them beside Equation 1's total, labelled as additions, never
inside it: the paper's figures stay reproducible, and what the bill will also say is in sight.

What a run created (`Created`) is the spec's gcp.public_ips, gcp.boot_disk_gb and gcp.boot_disk_type and how
many VMs of each role it had. TPU VMs (Cloud TPU) are treated so:
  - external IPv4: a TPU VM gets an external address unless gcp.public_ips is false (providers/gcp/tpu.py
    asks for one with enable_external_ips). Google's IP pricing does not single out TPU VMs, so the address is
    charged as any VM's, at the rate of how the TPU VM is bought (Spot or standard): if Google does not bill it,
    this overstates the cost by $0.005/h per TPU VM, beside a TPU VM's dollars per hour.
  - boot disk: none. Cloud TPU bills a TPU VM per chip-hour with its host, and the TPU VM comes with its own
    boot disk ("A TPU VM includes a 100 GiB boot disk", Cloud TPU documentation); dsctl neither sizes nor types
    it (gcp.boot_disk_gb and gcp.boot_disk_type apply to Compute Engine VMs only), so nothing is added for it.
Over the job's time t (Equation 1's): addresses for the VM-hours held (a stopped VM gives its ephemeral
address back), disks for every VM for all of t (a stopped VM's disk still bills). Start-up and teardown are
left out, as they are from Equation 1.

Pure arithmetic: the plan (providers/gcp/plan.py) and `dsctl cost` (orchestrator/pricing.py, cli/cost.py)
say where the numbers come from.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

from dsctl.specs import JobSpec
from dsctl.specs.schema import GcpSpec

from .catalog import Catalog, PriceSource
from .machines import accelerator_of
from .provisioning import PROVISIONING_LABEL, check_provisioning, dispatcher_provisioning
from .storage import HOURS_PER_MONTH

LABEL = "not in Equation 1"  # how every addition is labelled wherever it is shown
ROLES = ("dispatcher", "workers", "trainers")


@dataclass(frozen=True)
class VmGroup:
    """VMs of one role: how many, of which machine type, bought how, and whether they are TPU VMs."""

    role: str  # dispatcher | workers | trainers
    machine: str
    count: int
    provisioning: str  # standard | spot
    tpu: bool = False


@dataclass(frozen=True)
class Created:
    """What a run creates that Equation 1 leaves out: external addresses (or not), boot disks, and its VMs."""

    public_ips: bool
    boot_disk_gb: int
    boot_disk_type: str
    vms: tuple[VmGroup, ...]

    def to_dict(self) -> dict:
        return {"public_ips": self.public_ips, "boot_disk_gb": self.boot_disk_gb, "boot_disk_type": self.boot_disk_type,
                "vms": [asdict(g) for g in self.vms]}

    @classmethod
    def from_dict(cls, d: dict) -> Created:
        return cls(public_ips=bool(d["public_ips"]), boot_disk_gb=int(d["boot_disk_gb"]),
                   boot_disk_type=str(d["boot_disk_type"]), vms=tuple(VmGroup(**g) for g in d["vms"]))


def created_from_spec(spec: JobSpec, *, workers: int | None = None, trainers: int | None = None) -> Created:
    """What `spec` creates on Google Cloud with `workers` workers (default the spec's; 0: colocated, no dispatcher)
    and `trainers` trainers: the gcp section's settings, or their defaults when it has none."""
    g = spec.gcp or GcpSpec()
    n_workers = spec.service.workers if workers is None else workers
    n_trainers = spec.trainer.count if trainers is None else trainers
    svc, tr = spec.service, spec.trainer
    dispatcher = dispatcher_provisioning(svc.provisioning, g.supervisor)  # its address is charged at that rate
    vms = []
    if n_workers:
        vms.append(VmGroup("dispatcher", svc.dispatcher_machine, 1, dispatcher,
                           accelerator_of(svc.dispatcher_machine)[0] == "tpu"))
        vms.append(VmGroup("workers", svc.worker_machine, n_workers, svc.provisioning,
                           accelerator_of(svc.worker_machine)[0] == "tpu"))
    vms.append(VmGroup("trainers", tr.machine, n_trainers, tr.provisioning, accelerator_of(tr.machine)[0] == "tpu"))
    return Created(public_ips=g.public_ips, boot_disk_gb=g.boot_disk_gb, boot_disk_type=g.boot_disk_type,
                   vms=tuple(vms))


@dataclass(frozen=True)
class Addition:
    """One addition to Equation 1: what it is, its dollars per hour while everything runs and over the job.

    per_hour / cost are None when the catalog has no price for it (`unpriced` says why); cost is None too when
    the job's length is not known (a plan without one).
    """

    name: str  # "external IPv4" | "boot disks"
    quantity: str  # e.g. "18 addresses", "17 x 50 GB pd-balanced"
    count: int  # addresses or disks
    per_hour: float | None
    cost: float | None
    unpriced: str | None = None
    sources: tuple[PriceSource, ...] = ()
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {"name": self.name, "label": LABEL, "quantity": self.quantity, "count": self.count,
                "per_hour": self.per_hour, "cost": self.cost, "unpriced": self.unpriced,
                "sources": [s.to_dict() for s in self.sources], "notes": list(self.notes)}


@dataclass(frozen=True)
class Additions:
    """Both additions to Equation 1 for one run or plan."""

    ipv4: Addition
    boot_disks: Addition
    notes: tuple[str, ...] = field(default=())

    @property
    def items(self) -> tuple[Addition, Addition]:
        return self.ipv4, self.boot_disks

    @property
    def per_hour(self) -> float | None:
        """Both per hour; None when either is unpriced."""
        return priced_sum(a.per_hour for a in self.items)

    @property
    def cost(self) -> float | None:
        """Both over the job; None when either is unpriced or the job's length is unknown."""
        return priced_sum(a.cost for a in self.items)

    @property
    def sources(self) -> tuple[PriceSource, ...]:
        return tuple(s for a in self.items for s in a.sources)

    def to_dict(self) -> dict:
        return {"label": LABEL, "external_ipv4": self.ipv4.to_dict(), "boot_disks": self.boot_disks.to_dict(),
                "per_hour": self.per_hour, "cost": self.cost, "notes": list(self.notes)}


def priced_sum(values: Iterable[float | None]) -> float | None:
    """The sum of prices, or None when any of them is unpriced (a part missing makes the total unknown)."""
    total = 0.0
    for value in values:
        if value is None:
            return None
        total += value
    return total


def _plural(n: int, word: str, words: str | None = None) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {words or word + 's'}"


def ipv4(created: Created, catalog: Catalog, job_time_s: float | None = None,
         stopped_s: dict[str, float] | None = None) -> Addition:
    """External IPv4 addresses: one per VM (TPU VMs included) when gcp.public_ips is true, none otherwise.

    stopped_s: VM-seconds each role's VMs spent stopped (they hold no ephemeral address meanwhile)."""
    if not created.public_ips:
        return Addition("external IPv4", "none (gcp.public_ips: false)", 0, 0.0, 0.0 if job_time_s is not None else None)
    stopped_s = stopped_s or {}
    count = sum(g.count for g in created.vms)
    per_hour, held_hours, sources, missing = 0.0, 0.0, [], []
    for g in created.vms:
        found = catalog.ipv4_hour(check_provisioning(g.provisioning))
        if found is None:
            missing.append(g.provisioning)
            continue
        rate, source = found
        if source not in sources:
            sources.append(source)
        per_hour += g.count * rate
        if job_time_s is not None:
            vm_s = max(g.count * job_time_s - min(stopped_s.get(g.role, 0.0), g.count * job_time_s), 0.0)
            held_hours += vm_s / 3600.0 * rate
    quantity = _plural(count, "address", "addresses")
    notes = []
    tpus = sum(g.count for g in created.vms if g.tpu)
    if tpus:
        notes.append("TPU VMs' external addresses are charged as any VM's (Google's IP pricing does not single out "
                     "TPU VMs; an upper bound)")
    if missing:
        kinds = " and ".join(sorted({PROVISIONING_LABEL[p] for p in missing}))
        why = (f"catalog {catalog.name} has no price for external IPv4 addresses on {kinds} VMs "
               f"(add 'external_ipv4: {{{missing[0]}: {{per_hour: ..., source: ..., date: ...}}}}' to a copy of it)")
        return Addition("external IPv4", quantity, count, None, None, why, tuple(sources), tuple(notes))
    return Addition("external IPv4", quantity, count, per_hour, held_hours if job_time_s is not None else None,
                    None, tuple(sources), tuple(notes))


def boot_disks(created: Created, catalog: Catalog, job_time_s: float | None = None) -> Addition:
    """A gcp.boot_disk_gb disk of gcp.boot_disk_type per Compute Engine VM; none for TPU VMs (theirs comes with
    the TPU VM). Billed while the VMs exist, stopped or not: for all of the job's time."""
    disks = sum(g.count for g in created.vms if not g.tpu)
    tpus = sum(g.count for g in created.vms if g.tpu)
    notes = ("TPU VMs: no boot disk added (a TPU VM comes with its own, billed with the TPU VM; gcp.boot_disk_gb "
             "does not size it)",) if tpus else ()
    quantity = f"{disks} x {created.boot_disk_gb} GB {created.boot_disk_type}" if disks else "none"
    if not disks:
        return Addition("boot disks", quantity, 0, 0.0, 0.0 if job_time_s is not None else None, notes=notes)
    found = catalog.disk_gb_month(created.boot_disk_type)
    if found is None:
        have = ", ".join(sorted(catalog.data.boot_disks)) or "none"
        why = (f"catalog {catalog.name} has no price for {created.boot_disk_type} boot disks (it prices: {have}; add "
               f"'boot_disks: {{{created.boot_disk_type}: {{per_gb_month: ..., source: ..., date: ...}}}}' to a copy)")
        return Addition("boot disks", quantity, disks, None, None, why, notes=notes)
    gb_month, source = found
    per_hour = disks * created.boot_disk_gb * gb_month / HOURS_PER_MONTH
    cost = per_hour * job_time_s / 3600.0 if job_time_s is not None else None
    return Addition("boot disks", quantity, disks, per_hour, cost, None, (source,), notes)


def price_additions(created: Created, catalog: Catalog, job_time_s: float | None = None,
              stopped_s: dict[str, float] | None = None) -> Additions:
    """Both additions for what a run created, per hour and (when job_time_s is given) over the job."""
    return Additions(ipv4=ipv4(created, catalog, job_time_s, stopped_s),
                     boot_disks=boot_disks(created, catalog, job_time_s))
