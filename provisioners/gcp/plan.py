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
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

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

    def as_dict(self) -> dict:
        out = asdict(self)
        for line, d in zip(self.lines, out["lines"]):
            d["per_hour"] = line.per_hour
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
        elif self.per_hour is not None:
            out.append(f"Estimated job: {self.estimate_basis}; it costs ${self.per_hour:.2f} per hour it runs.")
        out += [f"Software: {line}" for line in self.software]
        if self.creates:
            out.append("Also creates: " + "; ".join(self.creates) + ".")
        out += [f"Note: {n}" for n in self.notes]
        return "\n".join(out)


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
            return catalog.split(machine, provisioning=provisioning, needed_by="for the plan").total
        except SpecError as exc:
            notes.append(f"no price for {machine}: {exc}")
            return None

    svc, tr = spec.service, spec.trainer
    lines = []
    if n_workers:
        # The dispatcher VM that runs the run's supervisor is never Spot (vms.record).
        dispatcher = "standard" if g.supervisor == "vm" else svc.provisioning
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
    if not result.project:
        notes.append("no project is set (gcp.project or GOOGLE_CLOUD_PROJECT); the default project of Application "
                     "Default Credentials will be used, if any.")
    if not result.zone:
        notes.append("no zone is set: set gcp.zone (or CLOUDSDK_COMPUTE_ZONE) before `dsctl up`.")
    if n_workers:
        prefix = naming.prefix(run_id) if run_id != "<run>" else "dsctl-<run>"
        result.creates.append(
            f"firewall rules {prefix}-svc and {prefix}-deny (tcp {', '.join(ports(g.dispatcher_port, g.worker_port))} "
            f"allowed between the run's VMs at priority {ALLOW_PRIORITY}, denied to all others at {DENY_PRIORITY}, "
            "above the network's own rules such as the default network's default-allow-internal)")
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
    if g.public_ips:
        notes.append("every VM gets an ephemeral external address; dsctl connects over SSH to it from here (the "
                     "network must admit tcp:22, as the default network's default-allow-ssh does).")
    else:
        notes.append("VMs get internal addresses only: run dsctl inside the VPC; their subnet needs Private Google "
                     "Access or a Cloud NAT to reach Cloud Storage (checked before anything is created).")
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
    return result


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
    findings = preflight.run(Clients(settings), spec, settings.run_software)  # refuses before asking, if it must
    shown = plan(spec, workers, project=settings.project, zone=settings.zone)
    shown.notes += findings.notes
    echo(shown.render())
    if interactive is None:
        interactive = sys.stdin.isatty()
    if not interactive:
        raise SpecError("provider: gcp creates machines that bill by the hour; pass --yes to create them without "
                        "asking (or --dry-run to see the plan only).")
    return ask("Create these machines on Google Cloud?")
