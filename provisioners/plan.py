"""What `dsctl up` would create and what it costs, shown before anything is created: a provider's Bill, priced.

`price_plan(bill, spec, catalog, ...)` needs no credentials and creates nothing: a line per role of the machines the
provider declares (machine type, count, how it is bought, and its $/hour at that provisioning model from the
catalog, never the other model's price), then a line per extra (Equation 1 leaves them out: labelled so, beside the
machines' total, never in it), and the job's cost on the vm-hours basis (whole machines for the whole job, as they
bill) when its length can be told: from trainer.duration_s, or from trainer.steps at a throughput (given, or at most
1000/step_time_ms batches/s for a synthetic model, in which case the cost is a lower bound). Otherwise the plan gives
the cost per hour. The provider adds what only it can say (where, the software its machines get, what else it
creates, notes); a provider whose machines bill (capability Plans) shows it with `--dry-run` and before asking.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from dsctl.costmodel import Catalog, estimate
from dsctl.costmodel.extras import LABEL, price_extras, priced_sum
from dsctl.costmodel.hybrid import STEP_CORES, HybridSaving, PipelineRate, predict_hybrid
from dsctl.costmodel.provisioning import PROVISIONING_LABEL
from dsctl.specs import SpecError
from dsctl.specs.schema import JobSpec

from .contract import Bill, BillRole

ADDITION_LABEL = LABEL


@dataclass
class PlanLine:
    role: BillRole
    machine: str
    count: int
    kind: str  # what the place calls them: "VM", "GPU VM", "TPU VM", "process"
    provisioning: Literal["standard", "spot"]
    per_hour_each: float | None  # None: not in the price catalog

    @property
    def per_hour(self) -> float | None:
        return None if self.per_hour_each is None else self.per_hour_each * self.count


@dataclass
class AdditionLine:
    """An addition to Equation 1 the run creates (an extra: addresses, disks), with its $/hour and, when the job's
    length is known, its cost over the job; per_hour None when the catalog does not price it."""

    name: str
    quantity: str  # e.g. "18 addresses", "17 x 50 GB pd-balanced"
    count: int
    per_hour: float | None
    cost: float | None = None
    unpriced: str | None = None
    label: str = ADDITION_LABEL


@dataclass
class HybridLine:
    """Hybrid placement in the plan: the in-process workers on each trainer host, what they cost (nothing more on the
    vm-hours basis: the host bills whole on the trainers' line), and the remote workers they save, predicted from a
    profile of the pipeline, or why that cannot be predicted."""

    local_per_trainer: int
    trainers: int
    trainer_machine: str
    trainer_vcpus: int | None
    worker_machine: str
    worker_vcpus: int | None
    per_hour: float = 0.0  # vm-hours basis: the trainer host is already billed whole
    saving: HybridSaving | None = None  # predicted
    saving_source: str = ""  # the profile it is predicted from
    saving_per_hour: float | None = None  # the remote workers saved, at the worker's $/h
    not_predicted: str = ""  # why no saving is predicted

    def render(self) -> list[str]:
        host = f"{self.trainer_machine}, {self.trainer_vcpus} vCPUs" if self.trainer_vcpus else self.trainer_machine
        out = [f"Hybrid placement: {self.local_per_trainer} in-process worker(s) in each of {self.trainers} trainer(s) "
               f"({host}): $0.0000/h more on the vm-hours basis, as they run on the trainer hosts, already billed whole "
               "on the trainers' line (on the utilization basis `dsctl cost report` charges the trainer CPU they use, "
               "as measured in the run)."]
        s = self.saving
        if s is None:
            out.append(f"Remote workers saved: not predicted: {self.not_predicted}")
            return out
        reach = "the trainers' consumption, " if s.capped else ""
        money = "" if self.saving_per_hour is None or s.saved <= 0 else f", ${self.saving_per_hour:.4f}/h"
        local_cores = max((self.trainer_vcpus or 0) - STEP_CORES, 0) / self.local_per_trainer
        head = (f"Remote workers saved (predicted from {self.saving_source}): a remote-only placement needs "
                f"{s.remote_only} {self.worker_machine} worker(s) for {reach}{s.throughput_bps:.3g} batches/s; this "
                f"one has {s.remote} remote and {s.trainers * s.local_per_trainer} in-process (one in-process worker "
                f"{s.local_bps:.3g} batches/s on {local_cores:.3g} vCPUs, one remote {s.remote_bps:.3g} on "
                f"{self.worker_vcpus})")
        if s.saved > 0:
            out.append(f"{head}: {s.saved} fewer remote worker(s){money}.")
        else:
            out.append(f"{head}: the remote workers alone reach it, so the in-process ones save none.")
        if s.capped and s.remote_needed < s.remote:
            fewer = (f"{s.remote_needed} remote worker(s) would reach" if s.remote_needed else
                     "no remote worker would be needed to reach (service.workers: 1 is the least a spec asks for)")
            out.append(f"  With the in-process workers, {fewer} the trainers' consumption (predicted): service.workers: "
                       f"{max(s.remote_needed, 1)}.")
        return out


@dataclass
class Plan:
    job: str
    where: str  # where the machines go, as the place says it: "on Google Cloud (project p, zone z)"
    catalog: str
    lines: list[PlanLine]
    per_hour: float | None
    software: list[str] = field(default_factory=list)  # what the machines run, installed how
    job_hours: float | None = None
    job_cost: float | None = None
    estimate_basis: str = ""  # how the job's length was told
    lower_bound: bool = False
    creates: list[str] = field(default_factory=list)  # other resources (firewall rules, staging, caches)
    notes: list[str] = field(default_factory=list)
    additions: list[AdditionLine] = field(default_factory=list)  # extras: not in Equation 1
    hybrid: HybridLine | None = None  # service.placement: hybrid

    @property
    def additions_per_hour(self) -> float | None:
        return priced_sum(a.per_hour for a in self.additions)

    @property
    def additions_cost(self) -> float | None:
        return priced_sum(a.cost for a in self.additions) if self.additions else None

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for line, d in zip(self.lines, out["lines"]):
            d["per_hour"] = line.per_hour
        out["additions_per_hour"] = self.additions_per_hour
        out["additions_cost"] = self.additions_cost
        return out

    def render(self) -> str:
        rows = [("", "machine", "count", "bought as", "$/h each", "$/h")]
        for line in self.lines:
            each = "?" if line.per_hour_each is None else f"{line.per_hour_each:.4f}"
            tot = "?" if line.per_hour is None else f"{line.per_hour:.4f}"
            rows.append((line.role, f"{line.machine} ({line.kind})", str(line.count),
                         PROVISIONING_LABEL.get(line.provisioning, line.provisioning), each, tot))
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
        out = [f"Plan for job '{self.job}' {self.where}; prices: {self.catalog}", *map(fmt, rows)]
        if self.job_cost is not None:
            bound = "at least " if self.lower_bound else ""
            hours = self.job_hours
            assert hours is not None, "price_plan sets the job's length with its cost"
            length = f"{hours:.2f} h" if hours >= 1 else f"{hours * 60:.1f} min"
            cost = f"${self.job_cost:,.2f}" if self.job_cost >= 0.01 else "under $0.01"
            out.append(f"Estimated job: {self.estimate_basis}: {bound}{length}, {bound}{cost} "
                       "(vm-hours: every machine for the whole job; start-up not included).")
            if self.additions:
                extra = self.additions_cost
                parts = ", ".join(f"{a.name} {'?' if a.cost is None else _dollars(a.cost)}" for a in self.additions)
                with_them = "?" if extra is None else _dollars(self.job_cost + extra)
                out.append(f"Additions ({ADDITION_LABEL}): {parts} over the job; with them, {bound}{with_them}.")
        elif self.per_hour is not None:
            out.append(f"Estimated job: {self.estimate_basis}; it costs ${self.per_hour:.2f} per hour it runs"
                       + (f", ${self.per_hour + self.additions_per_hour:.2f} with the additions ({ADDITION_LABEL})."
                          if self.additions and self.additions_per_hour is not None else "."))
        if self.hybrid is not None:
            out += self.hybrid.render()
        out += [f"Software: {line}" for line in self.software]
        if self.creates:
            out.append("Also creates: " + "; ".join(self.creates) + ".")
        out += [f"Note: {n}" for n in self.notes]
        return "\n".join(out)


def _dollars(v: float) -> str:
    return f"${v:,.2f}" if v >= 0.01 or v == 0 else "under $0.01"


def priced(catalog: Catalog, machine: str, provisioning: str) -> bool:
    """Whether the catalog prices `machine` bought this way."""
    try:
        catalog.split(machine, provisioning=provisioning, needed_by="for the plan")
    except SpecError:
        return False
    return True


def price_plan(bill: Bill, spec: JobSpec, catalog: Catalog, *, where: str, workers: int,
               batches_per_s: float | None = None, pipeline_rate: PipelineRate | None = None) -> Plan:
    """The plan of what `bill` creates, priced from `catalog`: its machines, its extras, the job's cost when its
    length can be told (see the module docstring), and with hybrid placement its in-process workers and the remote
    workers they save, predicted from `pipeline_rate` (a profile of the pipeline). `workers` as the bill counts them (0:
    colocated)."""
    notes: list[str] = []

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

    lines = [PlanLine(g.role, g.machine, g.count, g.kind, g.provisioning, price(g.machine, g.provisioning))
             for g in bill.machines]
    hourly = [line.per_hour for line in lines if line.per_hour is not None]
    result = Plan(job=spec.name, where=where, catalog=f"{catalog.name} ({catalog.date})", lines=lines,
                  per_hour=sum(hourly) if len(hourly) == len(lines) else None, notes=notes)
    _add_additions(result, bill, catalog, None)
    if workers and spec.service.placement == "hybrid":
        result.hybrid = hybrid_line(spec, catalog, workers, pipeline_rate)

    # The job's length, if it can be told.
    tr = spec.trainer
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
    if result.per_hour is None:
        return result
    try:
        b = estimate(spec, catalog, batches_per_sec=rate, basis="vm-hours", workers=workers)
    except SpecError as exc:
        notes.append(f"cost estimate unavailable: {exc}")
        return result
    result.job_hours = b.job_time_s / 3600.0
    result.job_cost = b.total
    result.lower_bound = lower
    _add_additions(result, bill, catalog, b.job_time_s)
    return result


def hybrid_line(spec: JobSpec, catalog: Catalog, workers: int, rate: PipelineRate | None) -> HybridLine:
    """The plan's hybrid placement: the in-process workers, their cost, and the remote workers they save (predicted
    from `rate`, else why not)."""
    svc, tr = spec.service, spec.trainer

    def vcpus(machine: str) -> int | None:
        try:
            return catalog.machine(machine).vcpus
        except SpecError:
            return None

    line = HybridLine(local_per_trainer=svc.local_workers, trainers=tr.count, trainer_machine=tr.machine,
                      trainer_vcpus=vcpus(tr.machine), worker_machine=svc.worker_machine,
                      worker_vcpus=vcpus(svc.worker_machine))
    if rate is None:
        line.not_predicted = ("no profile of this job's pipeline is recorded here (`dsctl profile JOB.yaml` makes one; "
                              "the plan then predicts how many remote workers the in-process ones replace).")
        return line
    if line.trainer_vcpus is None or line.worker_vcpus is None:
        line.not_predicted = "the trainer's or the worker's machine type has no known vCPU count."
        return line
    line.saving = predict_hybrid(rate, remote=workers, worker_vcpus=line.worker_vcpus,
                                 trainer_vcpus=line.trainer_vcpus, trainers=tr.count,
                                 local_per_trainer=svc.local_workers)
    line.saving_source = rate.source
    try:
        each = catalog.split(svc.worker_machine, provisioning=svc.provisioning, needed_by="for the plan").total
        line.saving_per_hour = max(line.saving.saved, 0) * each
    except SpecError:
        line.saving_per_hour = None
    return line


def _add_additions(result: Plan, bill: Bill, catalog: Catalog, job_time_s: float | None) -> None:
    """The plan's lines for what Equation 1 leaves out (the bill's extras), and their notes; replaces any made before
    the job's length was known."""
    found = price_extras(bill.extras, catalog, job_time_s)
    result.additions = [AdditionLine(a.name, a.quantity, a.count, a.per_hour, a.cost, a.unpriced) for a in found.items]
    for a in found.items:
        for note in ((f"{a.name} not priced: {a.unpriced}",) if a.unpriced else ()) + a.notes:
            if note not in result.notes:
                result.notes.append(note)


def ask_first(shown: Plan, *, ask: Callable[[str], bool], echo: Callable[[str], None], question: str, refusal: str,
              interactive: bool | None = None) -> bool:
    """Show the plan and ask before creating anything that bills; True to go ahead. Without a terminal
    (`interactive`: sys.stdin is one) this refuses (SpecError `refusal`) instead of waiting for an answer nobody can
    give."""
    echo(shown.render())
    if interactive is None:
        interactive = sys.stdin.isatty()
    if not interactive:
        raise SpecError(refusal)
    return ask(question)
