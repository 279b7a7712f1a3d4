"""What `dsctl up` would create on Google Cloud, and what it costs: shown by `--dry-run`, and before asking.

`plan(spec, workers)` needs no credentials and creates nothing. Each line is a machine
type, its count, how it is bought (on-demand or Spot, the spec's `provisioning`) and its
$/hour at that model from the spec's price catalog (never the other model's price); the
job's cost is estimated on the vm-hours basis (whole machines for the whole job, as they
bill) when the job's length can be told: from trainer.duration_s, or from trainer.steps at
a throughput (given, or at most 1000/step_time_ms batches/s for a synthetic model, in
which case the cost is a lower bound). Otherwise the plan gives the cost per hour. It also
says which TensorFlow every VM gets and how (software.py), how dsctl reaches the VMs, and
what else is created; with credentials, `confirm` adds what preflight.py found and asks.

Below the machines, a line per addition to the paper's Equation 1, labelled so: the VMs' external IPv4
addresses (gcp.public_ips) and their boot disks (gcp.boot_disk_gb of gcp.boot_disk_type), priced from the
same catalog (costmodel/additions.py, which also says how TPU VMs are treated: their address is charged as
any VM's, their boot disk comes with the TPU VM and adds nothing). They are not in the machines' total; the
job's estimate says what it comes to with them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from dsctl.costmodel import dispatcher_provisioning
from dsctl.costmodel.additions import priced_sum
from dsctl.specs import SpecError
from dsctl.specs.schema import GcpSpec, JobSpec

from . import naming
from .firewall import ALLOW_PRIORITY, DENY_PRIORITY, ports
from .machinetypes import machine_kind
from .settings import local_tensorflow_version
from .software import Software
from .software import resolve as resolve_software
from .storage import CODE_LIMIT_BYTES

MODEL_NAMES = {"standard": "on-demand", "spot": "Spot"}
ADDITION_LABEL = "not in Equation 1"


@dataclass
class PlanLine:
    role: str  # dispatcher | workers | trainers
    machine: str
    count: int
    kind: str  # "VM", "GPU VM", "TPU VM"
    provisioning: str  # standard | spot
    per_hour_each: float | None  # None: not in the price catalog

    @property
    def per_hour(self) -> float | None:
        return None if self.per_hour_each is None else self.per_hour_each * self.count


@dataclass
class AdditionLine:
    """An addition to Equation 1 the run creates: external IPv4 addresses or boot disks, with its $/hour and,
    when the job's length is known, its cost over the job; per_hour None when the catalog does not price it."""

    name: str  # external IPv4 | boot disks
    quantity: str  # e.g. "18 addresses", "17 x 50 GB pd-balanced"
    count: int
    per_hour: float | None
    cost: float | None = None
    unpriced: str | None = None
    label: str = ADDITION_LABEL


@dataclass
class Plan:
    job: str
    project: str | None
    zone: str | None
    catalog: str
    lines: list[PlanLine]
    per_hour: float | None
    software: list[str] = field(default_factory=list)  # which TensorFlow, installed how, per VM kind
    job_hours: float | None = None
    job_cost: float | None = None
    estimate_basis: str = ""  # how the job's length was told
    lower_bound: bool = False
    creates: list[str] = field(default_factory=list)  # other resources (firewall rules, staging, caches)
    notes: list[str] = field(default_factory=list)
    additions: list[AdditionLine] = field(default_factory=list)  # external IPv4, boot disks: not in Equation 1

    @property
    def additions_per_hour(self) -> float | None:
        return priced_sum(a.per_hour for a in self.additions)

    @property
    def additions_cost(self) -> float | None:
        return priced_sum(a.cost for a in self.additions) if self.additions else None

    def as_dict(self) -> dict:
        out = asdict(self)
        for line, d in zip(self.lines, out["lines"]):
            d["per_hour"] = line.per_hour
        out["additions_per_hour"] = self.additions_per_hour
        out["additions_cost"] = self.additions_cost
        return out

    def render(self) -> str:
        where = f"project {self.project or '(not set)'}, zone {self.zone or '(not set)'}"
        rows = [("", "machine", "count", "bought as", "$/h each", "$/h")]
        for line in self.lines:
            each = "?" if line.per_hour_each is None else f"{line.per_hour_each:.4f}"
            tot = "?" if line.per_hour is None else f"{line.per_hour:.4f}"
            rows.append((line.role, f"{line.machine} ({line.kind})", str(line.count), MODEL_NAMES[line.provisioning], each, tot))
        rows.append(("total", "", str(sum(line.count for line in self.lines)), "", "",
                     "?" if self.per_hour is None else f"{self.per_hour:.4f}"))
        for a in self.additions:  # beside the machines' total, not in it
            rows.append(("+ addition", f"{a.name}: {a.quantity} ({a.label})", str(a.count), "", "",
                         "?" if a.per_hour is None else f"{a.per_hour:.4f}"))
        if self.additions:
            both = self.additions_per_hour
            rows.append(("total with additions", "", "", "", "",
                         "?" if self.per_hour is None or both is None else f"{self.per_hour + both:.4f}"))
        widths = [max(len(r[i]) for r in rows) for i in range(6)]
        fmt = lambda r: "  " + "  ".join(c.ljust(w) if i in (0, 1, 3) else c.rjust(w)  # noqa: E731
                                         for i, (c, w) in enumerate(zip(r, widths)))
        out = [f"Plan for job '{self.job}' on Google Cloud ({where}); prices: {self.catalog}", *map(fmt, rows)]
        if self.job_cost is not None:
            bound = "at least " if self.lower_bound else ""
            hours = self.job_hours
            assert hours is not None, "plan() sets the job's length with its cost"
            length = f"{hours:.2f} h" if hours >= 1 else f"{hours * 60:.1f} min"
            cost = f"${self.job_cost:,.2f}" if self.job_cost >= 0.01 else "under $0.01"
            out.append(f"Estimated job: {self.estimate_basis}: {bound}{length}, {bound}{cost} "
                       "(vm-hours: every machine for the whole job; VM start-up not included).")
            if self.additions:
                extra = self.additions_cost
                parts = ", ".join(f"{a.name} {'?' if a.cost is None else _dollars(a.cost)}" for a in self.additions)
                with_them = "?" if extra is None else _dollars(self.job_cost + extra)
                out.append(f"Additions ({ADDITION_LABEL}): {parts} over the job; with them, {bound}{with_them}.")
        elif self.per_hour is not None:
            out.append(f"Estimated job: {self.estimate_basis}; it costs ${self.per_hour:.2f} per hour it runs"
                       + (f", ${self.per_hour + self.additions_per_hour:.2f} with the additions ({ADDITION_LABEL})."
                          if self.additions and self.additions_per_hour is not None else "."))
        out += [f"Software: {line}" for line in self.software]
        if self.creates:
            out.append("Also creates: " + "; ".join(self.creates) + ".")
        out += [f"Note: {n}" for n in self.notes]
        return "\n".join(out)


def _dollars(v: float) -> str:
    return f"${v:,.2f}" if v >= 0.01 or v == 0 else "under $0.01"


def _priced(catalog, machine: str, provisioning: str) -> bool:
    try:
        catalog.split(machine, provisioning=provisioning, needed_by="for the plan")
    except SpecError:
        return False
    return True


def _kind_label(machine: str) -> str:
    kind = machine_kind(machine).kind
    return {"tpu": "TPU VM", "gpu": "GPU VM"}.get(kind, "VM")


def software_lines(software: Software, trainer_kind: str) -> list[str]:
    out = [f"TensorFlow {software.tensorflow_version} on every VM ({software.why})."]
    for k in software.kinds.values():
        who = {"cpu": "dispatcher, workers and trainers" if trainer_kind == "cpu" else "dispatcher and workers",
               "gpu": "GPU trainers", "tpu": "TPU trainers"}[k.kind]
        if k.jax:
            out.append(f"{who}: JAX's TPU software {k.image}; jax[tpu]=={k.jax} (jax, jaxlib, libtpu) and {k.tensorflow} "
                       f"(the tf.data client) for Python {k.python_version} from a wheelhouse built here and staged in "
                       "Cloud Storage.")
        elif k.uses_image_tensorflow:
            pjrt = ", ".join(f"{name}={value}" for env in k.trainer_file_env.values() for name, value in env.items())
            out.append(f"{who}: TPU runtime {k.image} (TensorFlow included), dsctl added for Python {k.python_version}; "
                       f"trainers run with TensorFlow's PJRT TPU runtime ({pjrt}).")
        else:
            out.append(f"{who}: {k.image.rsplit('/', 1)[-1]}, {k.tensorflow} for Python {k.python_version} from a "
                       "wheelhouse built here and staged in Cloud Storage (no PyPI or apt on the VMs).")
    return out


def plan(spec: JobSpec, workers: int | None = None, *, batches_per_s: float | None = None,
         run_id: str = "<run>", project: str | None = None, zone: str | None = None) -> Plan:
    """The machines `dsctl up` would create for `spec` (with `workers` workers), priced; creates nothing.

    SpecError (exit 2) when the run could not start: no TensorFlow version for every machine kind,
    an image whose Python is unknown, a multi-host TPU.
    """
    from dsctl.costmodel import estimate, load_catalog

    from . import data

    g = spec.gcp or GcpSpec()
    n_workers = spec.service.workers if workers is None else workers
    catalog = load_catalog(spec.pricing)
    notes: list[str] = []
    software = resolve_software(spec, local_tensorflow_version())

    def price(machine: str, provisioning: str) -> float | None:
        try:
            hourly = catalog.split(machine, provisioning=provisioning, needed_by="for the plan").total
        except SpecError as exc:
            notes.append(f"no price for {machine}: {exc}")
            return None
        source = catalog.source_of(machine, provisioning)
        if not source.rechecked and f"price of {source.what}" not in " ".join(notes):
            notes.append(f"the catalog's price of {source.what} is {source.source} ({source.date}).")
        return hourly

    svc, tr = spec.service, spec.trainer
    lines = []
    if n_workers:
        dispatcher = dispatcher_provisioning(svc.provisioning, g.supervisor)
        if dispatcher != svc.provisioning:
            notes.append("the dispatcher VM runs the run's supervisor, so it is on-demand whatever "
                         "service.provisioning says: a preempted supervisor would leave the run unsupervised.")
            if not _priced(catalog, svc.dispatcher_machine, dispatcher):
                notes.append(f"this catalog has no on-demand price for {svc.dispatcher_machine}: the dispatcher is "
                             f"priced here as {MODEL_NAMES[svc.provisioning]}, below what it will cost.")
                dispatcher = svc.provisioning
        lines.append(PlanLine("dispatcher", svc.dispatcher_machine, 1, _kind_label(svc.dispatcher_machine),
                              dispatcher, price(svc.dispatcher_machine, dispatcher)))
        lines.append(PlanLine("workers", svc.worker_machine, n_workers, _kind_label(svc.worker_machine),
                              svc.provisioning, price(svc.worker_machine, svc.provisioning)))
    lines.append(PlanLine("trainers", tr.machine, tr.count, _kind_label(tr.machine), tr.provisioning,
                          price(tr.machine, tr.provisioning)))
    priced = [line.per_hour for line in lines if line.per_hour is not None]
    per_hour = sum(priced) if len(priced) == len(lines) else None

    project = project or g.project or os.environ.get("GOOGLE_CLOUD_PROJECT") or os.environ.get("CLOUDSDK_CORE_PROJECT")
    result = Plan(job=spec.name, project=project, zone=zone or g.zone or os.environ.get("CLOUDSDK_COMPUTE_ZONE"),
                  catalog=f"{catalog.name} ({catalog.date})", lines=lines, per_hour=per_hour,
                  software=software_lines(software, machine_kind(tr.machine).kind), notes=notes)
    _add_additions(result, _created(g, lines), catalog, None)
    if not result.project:
        notes.append("no project is set (gcp.project or GOOGLE_CLOUD_PROJECT); the default project of Application "
                     "Default Credentials will be used, if any.")
    if not result.zone:
        notes.append("no zone is set: set gcp.zone (or CLOUDSDK_COMPUTE_ZONE) before `dsctl up`.")
    if n_workers:
        prefix = naming.prefix(run_id) if run_id != "<run>" else "dsctl-<run>"
        result.creates.append(
            f"firewall rules {prefix}-svc and {prefix}-deny (tcp {', '.join(ports(g.dispatcher_port, g.worker_port))} "
            f"and SSH allowed between the run's VMs at priority {ALLOW_PRIORITY}, the service ports denied to all "
            f"others at {DENY_PRIORITY}, above the network's own rules such as the default network's "
            "default-allow-internal)")
    bucket = g.bucket or (f"{result.project}-dsctl" if result.project else "<project>-dsctl")
    staged = "the dsctl wheel, the spec" if g.bootstrap else "the spec"
    if spec.pipeline.entrypoint or spec.trainer.model.kind in ("python", "keras") or spec.trainer.command:
        staged += (f" and the spec's folder: your code, less what its .dsctlignore leaves out, at most "
                   f"{CODE_LIMIT_BYTES // 2**20} MB")
    result.creates.append(f"staging objects under gs://{bucket}/dsctl/runs/{run_id}/ ({staged}; deleted with the run)")
    if g.bootstrap:
        result.creates.append(f"a wheelhouse per VM kind, downloaded here once and kept in gs://{bucket}/dsctl/wheelhouses/")
    data_root = data.root(spec, bucket)
    if data_root:
        result.creates.append(f"the {spec.pipeline.builtin} builtin's TFRecords, generated here once and kept in "
                              f"{data_root}/ (the workers read them there)")
    if g.supervisor == "vm":
        notes.append("this machine connects to no VM: the run is handed over through Cloud Storage, and its "
                     "supervisor on the dispatcher VM reaches the others over SSH at internal addresses (the run's "
                     "own firewall rule admits it); sweeps and the colocated and ideal baselines are supervised "
                     "from here and connect from here.")
    if g.public_ips:
        notes.append("every VM gets an ephemeral external address; a run supervised from here connects over SSH to "
                     "it (the network must admit tcp:22 from here, as the default network's default-allow-ssh does).")
    else:
        notes.append("VMs get internal addresses only (a run supervised from here needs dsctl inside the VPC); their "
                     "subnet needs Private Google Access or a Cloud NAT to reach Cloud Storage (checked before "
                     "anything is created).")
    if "spot" in (svc.provisioning, tr.provisioning):
        notes.append("Spot VMs can be preempted at any time; a preempted VM ends the run (dsctl tears down; "
                     "it does not yet restart preempted VMs).")

    # The job's length, if it can be told.
    rate, lower = batches_per_s, False
    if tr.duration_s:
        result.estimate_basis = f"trainer.duration_s = {tr.duration_s:g} s"
        rate = rate or 1.0  # any rate: the duration fixes the time
    elif tr.steps and rate:
        result.estimate_basis = f"{tr.steps:,} steps at {rate:g} batches/s"
    elif tr.steps and tr.model.kind == "synthetic" and tr.model.step_time_ms > 0:
        rate, lower = 1000.0 / tr.model.step_time_ms, True
        result.estimate_basis = (f"{tr.steps:,} steps at most {rate:.2f} batches/s (model step {tr.model.step_time_ms:g} "
                                 "ms; slower if input-bound)")
    else:
        result.estimate_basis = "the job's length depends on its throughput"
        return result
    if per_hour is None:
        return result
    try:
        b = estimate(spec, catalog, batches_per_sec=rate, basis="vm-hours", workers=n_workers)
    except SpecError as exc:
        notes.append(f"cost estimate unavailable: {exc}")
        return result
    result.job_hours = b.job_time_s / 3600.0
    result.job_cost = b.total
    result.lower_bound = lower
    _add_additions(result, _created(g, lines), catalog, b.job_time_s)
    return result


def _created(g: GcpSpec, lines: list[PlanLine]):
    """What the plan's VMs bring besides themselves: their external addresses and boot disks."""
    from dsctl.costmodel import Created
    from dsctl.costmodel.additions import VmGroup

    return Created(public_ips=g.public_ips, boot_disk_gb=g.boot_disk_gb, boot_disk_type=g.boot_disk_type,
                   vms=tuple(VmGroup(line.role, line.machine, line.count, line.provisioning, line.kind == "TPU VM")
                             for line in lines))


def _add_additions(result: Plan, created, catalog, job_time_s: float | None) -> None:
    """The plan's lines for what Equation 1 leaves out (external IPv4 addresses, boot disks), and their notes;
    replaces any made before the job's length was known."""
    from dsctl.costmodel import price_additions

    found = price_additions(created, catalog, job_time_s)
    result.additions = [AdditionLine(a.name, a.quantity, a.count, a.per_hour, a.cost, a.unpriced) for a in found.items]
    for a in found.items:
        for note in ((f"{a.name} not priced: {a.unpriced}",) if a.unpriced else ()) + a.notes:
            if note not in result.notes:
                result.notes.append(note)


def confirm(spec: JobSpec, workers: int | None, *, yes: bool, ask: Callable[[str], bool],
            echo: Callable[[str], None], interactive: bool | None = None) -> bool:
    """Show the plan and ask before creating anything that bills; True to go ahead (at once with `yes`).

    Project, zone, credentials, permissions and the network are checked first (SpecError, preflight.py), so nobody
    is asked about a run that cannot start. `ask(question) -> bool` is e.g. typer.confirm; without a terminal
    (`interactive`: sys.stdin is one) and without --yes this refuses (SpecError) instead of waiting for an answer
    nobody can give.
    """
    if yes:
        return True
    from . import preflight
    from .clients import Clients
    from .settings import resolve

    settings = resolve(spec)
    # Refuses before asking, if it must. SSH from here is checked where the run is supervised from here only; a run
    # that turns out to be (another --mode) is refused by the provider's own check, still before anything is made.
    handed_off = (spec.gcp.supervisor if spec.gcp else "vm") == "vm"
    findings = preflight.run(Clients(settings), spec, settings.run_software, reaches_vms=not handed_off,
                             workers=workers)
    shown = plan(spec, workers, project=settings.project, zone=settings.zone)
    shown.notes += findings.notes
    echo(shown.render())
    if interactive is None:
        interactive = sys.stdin.isatty()
    if not interactive:
        raise SpecError("provider: gcp creates machines that bill by the hour; pass --yes to create them without "
                        "asking (or --dry-run to see the plan only).")
    return ask("Create these machines on Google Cloud?")
