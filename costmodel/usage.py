"""What a run used, and its price under a catalog and a basis.

`price()` is the one place that turns usage into dollars: `dsctl cost report` calls it
per recorded run, `estimate()` calls it with usage made up from a spec.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from dsctl.specs.errors import SpecError

from .catalog import Catalog, ProvisioningError
from .equation import BASES, CostBreakdown, Rates, equation_1, vm_hours
from .provisioning import check_provisioning, provisioning_label

# The spec field that chooses each part's provisioning model, and what it prices.
SERVICE_FIELD = ("service.provisioning", "the service (dispatcher and workers)")
TRAINER_FIELD = ("trainer.provisioning", "the trainers")


@dataclass(frozen=True, kw_only=True)
class RunUsage:
    """Plain numbers describing one run; machine types are what the processes stand for.

    Measured means (per worker / for the dispatcher) are None when unknown, e.g. before
    a run; the utilization basis then charges those machines whole and says so.
    n_workers 0 with no dispatcher_machine is a colocated run (no tf.data service).
    """

    job_time_s: float
    batches: float | None = None
    n_trainers: int = 1
    trainer_machine: str
    accelerators_per_trainer: int | None = None  # None: the machine's
    n_workers: int = 0
    worker_machine: str | None = None
    worker_avg_cpu_cores: float | None = None
    worker_avg_mem_gb: float | None = None
    dispatcher_machine: str | None = None
    dispatcher_avg_cpu_cores: float | None = None
    dispatcher_avg_mem_gb: float | None = None
    # Recorded for reports only: Equation 1 charges trainer hosts on what they have.
    trainer_avg_cpu_cores: float | None = None
    trainer_avg_mem_gb: float | None = None
    # How the machines are bought, which picks the catalog's prices: 'standard' (on-demand,
    # the catalog's top level) or 'spot' (its spot section). The service model prices the
    # workers and the dispatcher (spec service.provisioning), the trainer model the trainers.
    service_provisioning: str = "standard"
    trainer_provisioning: str = "standard"
    # VM-seconds the workers (and the dispatcher) spent stopped, e.g. preempted Spot VMs waiting to be
    # started again: a stopped VM is not charged for its vCPUs and memory, so neither is it here.
    worker_stopped_s: float = 0.0
    dispatcher_stopped_s: float = 0.0
    # Hybrid placement (service.placement: hybrid): workers inside each trainer process, on the trainer host, counted
    # apart from the remote n_workers; the vCPUs they kept busy on average per trainer, and how that is known
    # (local_cpu_source: 'measured here' or 'estimated: ...'); None when not known.
    local_workers: int = 0
    local_cpu_cores: float | None = None
    local_cpu_source: str | None = None


def _positive(value, what: str, zero_ok: bool = False) -> None:
    bad = value is None or not isinstance(value, (int, float)) or not math.isfinite(value)
    bad = bad or value < 0 or (value == 0 and not zero_ok)
    if bad:
        need = "zero or more" if zero_ok else "more than zero"
        raise SpecError(f"{what} must be a number {need}, got {value!r}.")


def _check(u: RunUsage, basis: str) -> None:
    if basis not in BASES:
        raise SpecError(f"unknown cost basis '{basis}'; use 'utilization' (Equation 1) or 'vm-hours' (whole machines per hour).")
    _positive(u.job_time_s, "the job time in seconds")
    if u.batches is not None:
        _positive(u.batches, "the number of batches", zero_ok=True)
    if not isinstance(u.n_trainers, int) or u.n_trainers < 1:
        raise SpecError(f"a run has at least one trainer, got n_trainers={u.n_trainers!r}.")
    if not isinstance(u.n_workers, int) or u.n_workers < 0:
        raise SpecError(f"the number of workers must be 0 (colocated) or more, got {u.n_workers!r}.")
    if u.n_workers and not u.worker_machine:
        raise SpecError(f"{u.n_workers} workers were given but no worker machine type to price them as.")
    check_provisioning(u.service_provisioning, "service_provisioning (how the dispatcher and workers are bought)")
    check_provisioning(u.trainer_provisioning, "trainer_provisioning (how the trainers are bought)")
    for name in ("worker_avg_cpu_cores", "worker_avg_mem_gb", "dispatcher_avg_cpu_cores", "dispatcher_avg_mem_gb"):
        if getattr(u, name) is not None:
            _positive(getattr(u, name), f"the measured {name.replace('_', ' ')}", zero_ok=True)
    if not isinstance(u.local_workers, int) or u.local_workers < 0:
        raise SpecError(f"the number of local workers per trainer must be 0 or more, got {u.local_workers!r}.")
    if u.local_cpu_cores is not None:
        _positive(u.local_cpu_cores, "the local workers' CPU use in vCPUs per trainer", zero_ok=True)
    _positive(u.worker_stopped_s, "the workers' VM-seconds stopped", zero_ok=True)
    _positive(u.dispatcher_stopped_s, "the dispatcher's VM-seconds stopped", zero_ok=True)
    if u.worker_stopped_s > u.n_workers * u.job_time_s or u.dispatcher_stopped_s > u.job_time_s:
        raise SpecError(f"VMs cannot be stopped longer than the job ran: {u.worker_stopped_s:.0f} s of {u.n_workers} "
                        f"workers and {u.dispatcher_stopped_s:.0f} s of the dispatcher in a {u.job_time_s:.0f} s job.")


def held(usage: RunUsage) -> tuple[float, float]:
    """Workers and dispatchers held on average over the job: the counts less the share of time stopped."""
    t = usage.job_time_s
    dispatcher = 1.0 if usage.dispatcher_machine else 0.0
    return usage.n_workers - usage.worker_stopped_s / t, dispatcher - (usage.dispatcher_stopped_s / t if dispatcher else 0.0)


def _for(field: tuple[str, str], lookup, *args, **kwargs):
    """A catalog lookup whose 'only the other provisioning model is priced' error names the spec field to change."""
    try:
        return lookup(*args, **kwargs)
    except ProvisioningError as exc:
        raise exc.for_field(*field) from None


def _service_use(catalog: Catalog, machine: str, cpu, mem, role: str,
                 provisioning: str) -> tuple[Rates, float, float, bool]:
    """Rates, vCPUs and GB to charge one worker (or the dispatcher) on the utilization basis.

    Measured use when known; otherwise the whole machine (last item True), which
    needs only the machine's price, not per-resource rates.
    """
    if cpu is not None and mem is not None:
        rates = _for(SERVICE_FIELD, catalog.unit_rates, machine, provisioning=provisioning,
                     needed_by=f"by the utilization basis to charge the {role} on measured use")
        return rates, cpu, mem, False
    m = catalog.machine(machine)
    s = _for(SERVICE_FIELD, catalog.split, machine, provisioning=provisioning, needed_by=f"to price the {role}")
    rates = Rates(cpu=s.cpu / m.vcpus if m.vcpus else 0.0, mem=s.memory / m.memory_gb if m.memory_gb else 0.0)
    return rates, float(m.vcpus), m.memory_gb, True


def price(usage: RunUsage, catalog: Catalog, basis: str = "utilization") -> CostBreakdown:
    """Price one run: Equation 1 ('utilization') or whole machines per hour ('vm-hours')."""
    _check(usage, basis)
    notes: list[str] = []
    t_machine = catalog.machine(usage.trainer_machine)
    n_acc = t_machine.accelerators if usage.accelerators_per_trainer is None else usage.accelerators_per_trainer
    if n_acc > t_machine.accelerators:
        raise SpecError(
            f"accelerators_per_trainer is {n_acc} but a {t_machine.name} has {t_machine.accelerators} "
            f"({t_machine.accelerator_type or 'no accelerators'}); use at most {t_machine.accelerators} or a larger machine type."
        )
    svc_p, trn_p = usage.service_provisioning, usage.trainer_provisioning
    has_service = bool(usage.n_workers or usage.dispatcher_machine)
    split = _for(TRAINER_FIELD, catalog.split, usage.trainer_machine, provisioning=trn_p, needed_by="to price the trainers")
    if split.whole:
        where = "accelerators (host CPU and memory included)" if t_machine.accelerators else "trainer CPU (memory included)"
        notes.append(f"catalog {catalog.name} prices {t_machine.name} only as a whole machine ({provisioning_label(trn_p)} "
                     f"price); its price is shown under {where}.")
    parts = {"workers and dispatcher": svc_p if has_service else None, "trainers": trn_p}
    spot = [part for part, p in parts.items() if p == "spot"]
    if spot:
        on_demand = [part for part, p in parts.items() if p == "standard"]
        notes.append(f"catalog {catalog.name}'s Spot prices are used for the {' and the '.join(spot)}"
                     + (f" (on-demand prices for the {on_demand[0]})" if on_demand else "")
                     + ": Spot VMs can be preempted at any time, and what preemptions cost (restarts, lost steps) "
                     "is not priced.")
    svc_model = svc_p if has_service else None
    n_w, n_d = held(usage)
    if usage.worker_stopped_s or usage.dispatcher_stopped_s:
        stopped_h = (usage.worker_stopped_s + usage.dispatcher_stopped_s) / 3600
        notes.append(f"the service is charged for the VM-hours it held: {stopped_h:.3g} "
                     "VM-hours stopped (e.g. preempted Spot VMs before they ran again) are not charged.")

    if basis == "vm-hours":
        if n_acc < t_machine.accelerators:
            notes.append(f"trainers use {n_acc} of the {t_machine.accelerators} accelerators of a {t_machine.name}; "
                         "the vm-hours basis charges the whole machine.")
        b = vm_hours(
            usage.job_time_s,
            n_w=n_w,
            worker_vm_hour=_for(SERVICE_FIELD, catalog.machine_hour, usage.worker_machine, provisioning=svc_p,
                                needed_by="to price the workers") if usage.n_workers else 0.0,
            dispatcher_vm_hour=n_d * _for(SERVICE_FIELD, catalog.machine_hour, usage.dispatcher_machine,
                                          provisioning=svc_p, needed_by="to price the dispatcher")
            if usage.dispatcher_machine else 0.0,
            n_t=usage.n_trainers,
            trainer_cpu_hour=split.cpu,
            trainer_memory_hour=split.memory,
            trainer_accelerators_hour=split.accelerators,
        )
        local, local_notes = _local_vm_hours(usage)
        return replace(b, batches=usage.batches, notes=tuple(notes + local_notes), service_provisioning=svc_model,
                       trainer_provisioning=trn_p, local_preprocessing=local,
                       local_cpu_source=usage.local_cpu_source if usage.local_workers else None)

    if n_acc < t_machine.accelerators:
        notes.append(f"trainers use {n_acc} of the {t_machine.accelerators} accelerators of a {t_machine.name}; "
                     f"Equation 1 charges the {n_acc} used (n_ACC/T).")
    trainer_rates = Rates(
        cpu=split.cpu / t_machine.vcpus if t_machine.vcpus else 0.0,
        mem=split.memory / t_machine.memory_gb if t_machine.memory_gb else 0.0,
        acc=split.accelerators / t_machine.accelerators if t_machine.accelerators else 0.0,
    )
    whole = []
    w_rates, w_cpu, w_mem = trainer_rates, 0.0, 0.0
    if usage.n_workers:
        assert usage.worker_machine is not None, "_check: workers come with their machine type"
        w_rates, w_cpu, w_mem, w_whole = _service_use(
            catalog, usage.worker_machine, usage.worker_avg_cpu_cores, usage.worker_avg_mem_gb, "workers", svc_p)
        if w_whole:
            whole.append(f"{usage.n_workers} x {usage.worker_machine} for the workers")
    d_rates, d_cpu, d_mem = w_rates, 0.0, 0.0
    if usage.dispatcher_machine:
        d_rates, d_cpu, d_mem, d_whole = _service_use(
            catalog, usage.dispatcher_machine, usage.dispatcher_avg_cpu_cores, usage.dispatcher_avg_mem_gb, "dispatcher",
            svc_p)
        if d_whole:
            whole.append(f"1 x {usage.dispatcher_machine} for the dispatcher")
    if whole:
        notes.append(
            "measured CPU and memory use of the service is not known (as before a run), so whole machines are "
            f"charged ({', '.join(whole)}): an upper bound for the utilization basis."
        )
    b = equation_1(
        usage.job_time_s,
        n_w=n_w, avg_cpu_w=w_cpu, avg_mem_w=w_mem,
        n_t=usage.n_trainers, cpu_a_t=t_machine.vcpus, mem_a_t=t_machine.memory_gb, n_acc_t=n_acc,
        rates=trainer_rates, dispatcher_cpu=n_d * d_cpu, dispatcher_mem=n_d * d_mem,
        worker_rates=w_rates, dispatcher_rates=d_rates,
    )
    local, local_notes = _local_share(usage, trainer_rates.cpu, t_machine.vcpus,
                                      whole_with_accelerators=split.whole and bool(t_machine.accelerators))
    return replace(b, batches=usage.batches, notes=tuple(notes + local_notes), service_provisioning=svc_model,
                   trainer_provisioning=trn_p, local_preprocessing=local,
                   local_cpu_source=usage.local_cpu_source if usage.local_workers else None)


def _local_vm_hours(usage: RunUsage) -> tuple[float | None, list[str]]:
    """Local workers on the vm-hours basis: the trainer VMs are charged whole whether their CPUs run local workers or
    not, so local preprocessing adds no dollars."""
    if not usage.local_workers:
        return None, []
    return 0.0, [f"local preprocessing: {usage.local_workers} worker(s) inside each trainer process run on the "
                 "trainer VMs, which the vm-hours basis charges whole whether those CPUs are used or not: they add no "
                 "dollars (local_preprocessing 0), and the remote count alone is priced as workers."]


def _local_share(usage: RunUsage, trainer_cpu_rate: float, vcpus: int,
                 whole_with_accelerators: bool) -> tuple[float | None, list[str]]:
    """Local workers on the utilization basis: Equation 1 charges trainer hosts on what they have (CPU_a^T), so the
    local workers add nothing to the total; their share of the trainer's CPU (vCPUs busy x C_CPU of the trainer's
    machine) is what local preprocessing cost, shown apart and included in trainer_cpu."""
    if not usage.local_workers:
        return None, []
    said = (f"local preprocessing: {usage.local_workers} worker(s) inside each trainer process run on the trainer "
            "hosts, which Equation 1 charges on what they have: they add nothing to the total, and their cost is "
            "their share of the trainer CPU (included in trainer_cpu); the remote count alone is priced as workers.")
    if usage.local_cpu_cores is None:
        return None, [said, f"local preprocessing not priced: the local workers' CPU use is "
                            f"{usage.local_cpu_source or 'not known'}."]
    if whole_with_accelerators:
        return None, [said, f"local preprocessing not priced: the catalog prices {usage.trainer_machine} only whole, "
                            "so its host CPU has no price of its own."]
    cores = min(usage.local_cpu_cores, float(vcpus))
    cost = usage.job_time_s / 3600.0 * trainer_cpu_rate * usage.n_trainers * cores
    return cost, [f"{said} Their CPU use, {cores:.3g} vCPUs per trainer, is {usage.local_cpu_source or 'measured'}; "
                  "the price per vCPU-hour is the catalog's."]
