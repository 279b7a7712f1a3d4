"""Compute Engine quota in the run's region, read before anything is created: the VMs' vCPUs and GPUs.

Compute Engine's regions.get returns the region's quotas, each a metric with its limit and usage
(https://cloud.google.com/compute/docs/reference/rest/v1/regions/get; the metrics are the Quota.metric
enum of https://cloud.google.com/compute/docs/reference/rest/v1/regions). What the run will hold at most
is added up by metric (the dispatcher, the workers at their largest count, autoscaling's maximum
included, and the trainers that are Compute Engine VMs) and compared with what is free, limit - usage:

- vCPUs count against their machine family's quota (N2_CPUS for n2-*, E2_CPUS for e2-*, CPUS for
  n1-*, ...: https://cloud.google.com/compute/resource-usage#cpu_quota, "Allocation quotas");
- GPUs against their type's (NVIDIA_A100_GPUS for an a2-highgpu-1g's A100, NVIDIA_L4_GPUS for a
  g2-standard-*'s L4, ...: https://cloud.google.com/compute/resource-usage#gpu_quota); the machine
  type's vCPUs and GPUs are read from machineTypes.get, as Compute Engine counts them;
- a Spot VM's vCPUs and GPUs count against the preemptible quota (PREEMPTIBLE_CPUS, one for every
  family; PREEMPTIBLE_NVIDIA_*_GPUS) where the project has it, i.e. its limit is above 0; else against
  the standard one ("To prevent Spot VMs from consuming your quotas for standard VMs' CPUs, GPUs, and
  disks, consider requesting preemptible quota": https://cloud.google.com/compute/docs/instances/create-use-spot,
  and https://cloud.google.com/compute/quotas, "Preemptible quotas").

- external IPv4 addresses (gcp.public_ips) count against IN_USE_ADDRESSES, one per VM;
- the project's global quotas, from Compute Engine's projects.get: CPUS_ALL_REGIONS (every vCPU in
  every region) and GPUS_ALL_REGIONS (every GPU), both 0 or small in new and free-trial projects
  (https://cloud.google.com/compute/quotas-limits#global_quotas);
- TPU quota is Cloud TPU's, per zone and TPU generation (TensorCores for v2 to v5p, chips for v5e
  and v6e; https://cloud.google.com/tpu/docs/quota), read from the Cloud Quotas API's quotaInfos
  (limits only: usage is not part of it, so what other TPU VMs hold is not subtracted, and the plan
  says so).

A shortage refuses the run (SpecError, exit 2) in one paragraph naming each metric, what is needed
and what is free, and how to ask for more. What this cannot tell is said in the plan instead of
guessed: a machine family or GPU type whose quota metric dsctl does not know, a metric the region
does not list, quotas the caller may not read (compute.regions.get, compute.projects.get,
cloudquotas.quotas.get) or an API that is off. A TPU shortage that passes this (another TPU VM took
the quota meanwhile) fails its queued resource, which dsctl reports naming the quota (errors.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dsctl.specs import SpecError
from dsctl.specs.schema import JobSpec

from ..contract import BillRole
from .billing import dispatcher_provisioning
from .clients import Clients
from .machinetypes import machine_kind
from .retry import call

# Machine family (the machine type's first word) -> its regional vCPU quota metric
# (https://cloud.google.com/compute/resource-usage#cpu_quota; names as regions.get's Quota.metric enum has them).
CPU_METRICS = {"n1": "CPUS", "e2": "E2_CPUS", "n2": "N2_CPUS", "n2d": "N2D_CPUS", "c2": "C2_CPUS",
               "c2d": "C2D_CPUS", "c3": "C3_CPUS", "a2": "A2_CPUS", "g2": "G2_CPUS", "m1": "M1_CPUS",
               "m2": "M2_CPUS", "m3": "M3_CPUS", "t2d": "T2D_CPUS", "t2a": "T2A_CPUS"}
# Compute Engine GPU type -> its regional quota metric (https://cloud.google.com/compute/resource-usage#gpu_quota).
GPU_METRICS = {"nvidia-tesla-t4": "NVIDIA_T4_GPUS", "nvidia-tesla-v100": "NVIDIA_V100_GPUS",
               "nvidia-tesla-p100": "NVIDIA_P100_GPUS", "nvidia-tesla-p4": "NVIDIA_P4_GPUS",
               "nvidia-tesla-a100": "NVIDIA_A100_GPUS", "nvidia-a100-80gb": "NVIDIA_A100_80GB_GPUS",
               "nvidia-l4": "NVIDIA_L4_GPUS", "nvidia-h100-80gb": "NVIDIA_H100_GPUS"}
PREEMPTIBLE_CPUS = "PREEMPTIBLE_CPUS"
GLOBAL = ("CPUS_ALL_REGIONS", "GPUS_ALL_REGIONS")
# TPU quota IDs by generation (on-demand, Spot/preemptible): https://cloud.google.com/tpu/docs/quota
TPU_QUOTA_IDS = {
    "v2": ("TPUV2sPerProjectPerZoneForTPUAPI", "TPUV2sPreemptiblePerProjectPerZoneForTPUAPI"),
    "v3": ("TPUV3sPerProjectPerZoneForTPUAPI", "TPUV3sPreemptiblePerProjectPerZoneForTPUAPI"),
    "v4": ("TPUV4PodPerProjectPerZoneForTPUAPI", "TPUV4PodPreemptiblePerProjectPerZoneForTPUAPI"),
    "v5litepod": ("TPUV5sLitepodPerProjectPerZoneForTPUAPI", "TPUV5sLitepodPreemptiblePerProjectPerZoneForTPUAPI"),
    "v5p": ("TPUV5PPerProjectPerZoneForTPUAPI", "TPUV5PPreemptiblePerProjectPerZoneForTPUAPI"),
    "v6e": ("TPUV6EPerProjectPerZoneForTPUAPI", "TPUV6EPreemptiblePerProjectPerZoneForTPUAPI"),
}
# The spec's field a group of VMs comes from: where a refusal points.
FIELDS = {"dispatcher": "service.dispatcher_machine", "workers": "service.workers", "trainers": "trainer.machine"}


@dataclass(frozen=True)
class Group:
    """VMs of one role the run creates on Compute Engine: `count` of `machine`, Spot or not."""

    role: BillRole
    machine: str
    count: int
    spot: bool


@dataclass
class Need:
    """What the run needs of one quota metric, and from which groups."""

    metric: str
    amount: float = 0.0
    parts: list[str] = field(default_factory=list)
    by_role: dict[str, float] = field(default_factory=dict)


def groups(spec: JobSpec, workers: int | None, *, hands_off: bool) -> list[Group]:
    """The Compute Engine VMs the run holds at its largest: `workers` workers (None: service.workers, or autoscale's
    max_workers if larger; 0: no service, as a baseline's trainers alone), their dispatcher (on-demand when it runs
    the handed-over run's supervisor, `hands_off`), and the trainers unless they are TPU VMs."""
    svc, tr = spec.service, spec.trainer
    if workers is None:
        workers = max(svc.workers, spec.autoscale.max_workers if spec.autoscale else 0)
    out = []
    if workers:
        dispatcher = dispatcher_provisioning(svc.provisioning, "vm" if hands_off else "here")
        out.append(Group("dispatcher", svc.dispatcher_machine, 1, dispatcher == "spot"))
        out.append(Group("workers", svc.worker_machine, workers, svc.provisioning == "spot"))
    if machine_kind(tr.machine).kind != "tpu" and tr.count:
        out.append(Group("trainers", tr.machine, tr.count, tr.provisioning == "spot"))
    return out


def _shape(clients: Clients, machine: str) -> tuple[int, list[tuple[str, int]]]:
    """(vCPUs, [(GPU type, count)]) of a machine type, as Compute Engine's machineTypes.get gives them; GPUs dsctl
    attaches itself (guestAccelerators) where the type carries none."""
    s = clients.settings
    mt = call(clients.machine_types.get, project=s.project, zone=s.zone, machine_type=machine,
              doing=f"reading machine type {machine}")
    gpus = [(a.guest_accelerator_type, int(a.guest_accelerator_count)) for a in mt.accelerators]
    kind = machine_kind(machine)
    if not gpus and kind.kind == "gpu" and kind.accelerator:
        gpus = [(kind.accelerator, kind.count)]
    return int(mt.guest_cpus), gpus


def _metric(standard: str, twin: str, spot: bool, quotas: dict[str, tuple[float, float]]) -> str:
    """A Spot VM counts against the preemptible twin where the project has that quota (limit above 0)."""
    return twin if spot and quotas.get(twin, (0.0, 0.0))[0] > 0 else standard


def needs(clients: Clients, wanted: list[Group], quotas: dict[str, tuple[float, float]],
          notes: list[str]) -> dict[str, Need]:
    """What `wanted` needs of each metric; what cannot be told goes to `notes`."""
    out: dict[str, Need] = {}

    def add(metric: str, amount: float, part: str, role: str) -> None:
        need = out.setdefault(metric, Need(metric))
        need.amount += amount
        need.parts.append(part)
        need.by_role[role] = need.by_role.get(role, 0.0) + amount

    shapes: dict[str, tuple[int, list[tuple[str, int]]]] = {}
    for g in wanted:
        if g.machine not in shapes:
            shapes[g.machine] = _shape(clients, g.machine)
        cpus, gpus = shapes[g.machine]
        family = g.machine.split("-", 1)[0]
        model = "Spot " if g.spot else ""
        vms = f"{g.count} {model}{g.machine} ({g.role})"
        cpu_metric = CPU_METRICS.get(family)
        if cpu_metric is None:
            notes.append(f"quota for the vCPUs of {g.machine} ({g.role}) was not checked: dsctl does not know which "
                         f"quota metric the {family} family counts against")
        else:
            add(_metric(cpu_metric, PREEMPTIBLE_CPUS, g.spot, quotas), float(cpus * g.count),
                f"{vms} x {cpus} vCPUs", g.role)
        add("CPUS_ALL_REGIONS", float(cpus * g.count), f"{vms} x {cpus} vCPUs", g.role)
        if clients.settings.public_ips:
            add("IN_USE_ADDRESSES", float(g.count), f"{vms}: an external address each", g.role)
        for gpu, n in gpus:
            add("GPUS_ALL_REGIONS", float(n * g.count), f"{vms} x {n} {gpu}", g.role)
            gpu_metric = GPU_METRICS.get(gpu)
            if gpu_metric is None:
                notes.append(f"quota for the {gpu} GPUs of {g.machine} ({g.role}) was not checked: dsctl does not "
                             "know its quota metric")
                continue
            add(_metric(gpu_metric, f"PREEMPTIBLE_{gpu_metric}", g.spot, quotas), float(n * g.count),
                f"{vms} x {n} {gpu}", g.role)
    return out


def read(clients: Clients) -> dict[str, tuple[float, float]] | None:
    """The region's quotas and the project's global ones, metric -> (limit, usage); None where the caller may not
    read them."""
    from google.api_core import exceptions as gx

    s = clients.settings
    try:
        region = call(clients.regions.get, project=s.project, region=s.region,
                      doing=f"reading the quotas of region {s.region}")
        project = call(clients.compute_projects.get, project=s.project,
                       doing=f"reading project {s.project}'s global quotas")
    except gx.Forbidden:
        return None
    out = {q.metric: (float(q.limit), float(q.usage)) for q in region.quotas}
    out.update({q.metric: (float(q.limit), float(q.usage)) for q in project.quotas if q.metric in GLOBAL})
    return out


def _n(x: float) -> str:
    return f"{x:,.0f}" if x == int(x) else f"{x:,g}"


def check(clients: Clients, spec: JobSpec, *, workers: int | None = None, hands_off: bool = False) -> list[str]:
    """Refuse (SpecError) a run whose VMs' vCPUs or GPUs exceed what is free of the region's quotas; returns notes
    for the plan (what was not checked, and why)."""
    s = clients.settings
    notes: list[str] = []
    if machine_kind(spec.trainer.machine).kind == "tpu":
        notes += check_tpu(clients, spec)
    wanted = groups(spec, workers, hands_off=hands_off)
    if not wanted:
        return notes
    quotas = read(clients)
    if quotas is None:
        notes.append(f"the quotas of region {s.region} could not be read (you lack compute.regions.get), so the VMs' "
                     "vCPU and GPU quota was not checked beforehand")
        return notes
    short = []
    for need in needs(clients, wanted, quotas, notes).values():
        if need.metric not in quotas:
            notes.append(f"region {s.region} lists no quota {need.metric}: the run's {_n(need.amount)} were not "
                         "checked against it")
            continue
        limit, usage = quotas[need.metric]
        free = max(limit - usage, 0.0)
        if need.amount > free:
            short.append((need, limit, usage, free))
    if not short:
        return notes
    parts, asks = [], []
    for need, limit, usage, free in short:
        parts.append(f"{need.metric}: {_n(need.amount)} needed ({'; '.join(need.parts)}), {_n(free)} available "
                     f"(limit {_n(limit)}, {_n(usage)} in use)")
        if need.metric in GLOBAL:
            asks.append(f"gcloud quotas preferences create --service=compute.googleapis.com --project={s.project} "
                        f"--quota-id={need.metric.replace('_', '-')}-per-project "
                        f"--preferred-value={_n(usage + need.amount)}")
            continue
        quota_id = need.metric.replace("_", "-") + "-per-project-region"
        asks.append(f"gcloud quotas preferences create --service=compute.googleapis.com --project={s.project} "
                    f"--quota-id={quota_id} --dimensions=region={s.region} "
                    f"--preferred-value={_n(usage + need.amount)}")
    first = short[0][0]
    role = max(first.by_role, key=lambda r: first.by_role[r])
    trial = (" A free-trial project cannot raise its quotas (8 vCPUs in all, no GPUs): upgrade it to a paid account "
             "first (console: Billing).") if any(n.metric in GLOBAL and lim <= 8 for n, lim, _, _ in short) else ""
    raise SpecError(
        f"the run needs more Compute Engine quota in region {s.region} than project {s.project} has free: "
        f"{'; '.join(parts)}. Nothing was created. Ask for more in the console (IAM & Admin > Quotas & System "
        f"Limits, filtered on the metric and region {s.region}) or with `{'`; `'.join(asks)}` (increases are reviewed "
        f"by Google); or ask for fewer or smaller machines, or another region (gcp.zone).{trial}", field=FIELDS[role])


def check_tpu(clients: Clients, spec: JobSpec) -> list[str]:
    """Refuse (SpecError) a TPU run whose TPU VMs need more than the zone's TPU quota limit; notes for the plan (the
    quota's usage is not read, and what could not be read)."""
    from google.api_core import exceptions as gx

    from .software import tpu_generation

    s = clients.settings
    generation, units = tpu_generation(spec.trainer.machine)
    ids = TPU_QUOTA_IDS.get(generation)
    if ids is None:
        return [f"quota for TPU {generation} was not checked: dsctl does not know its quota id"]
    quota_id = ids[1 if spec.trainer.provisioning == "spot" else 0]
    need = units * spec.trainer.count
    name = f"projects/{s.project}/locations/global/services/tpu.googleapis.com/quotaInfos/{quota_id}"
    try:
        infos = call(lambda **kw: list(clients.quotas.list_quota_infos(**kw)),
                     parent=f"projects/{s.project}/locations/global/services/tpu.googleapis.com",
                     doing=f"reading project {s.project}'s TPU quota")
    except (gx.Forbidden, gx.NotFound) as exc:
        return [f"the TPU quota ({quota_id}) could not be read ({getattr(exc, 'message', exc)}; the Cloud Quotas API, "
                "cloudquotas.quotas.get), so it is not checked beforehand: a TPU quota too small fails the TPU VM's "
                "queued resource, and dsctl names that quota and deletes what it made"]
    info = next((i for i in infos if i.quota_id == quota_id or i.name == name), None)
    if info is None:
        return [f"the TPU quota {quota_id} is not listed for project {s.project}; not checked beforehand"]
    limit = None
    for dim in info.dimensions_infos:
        zone = dict(dim.dimensions).get("zone")
        if zone == s.zone or (zone is None and limit is None):
            limit = int(dim.details.value)
            if zone == s.zone:
                break
    notes = [f"TPU quota {quota_id} in zone {s.zone}: what other TPU VMs use of it is not read (the Cloud Quotas API "
             "gives limits only)"]
    if limit is None or limit < 0 or need <= limit:
        return notes
    unit = "chips" if generation in ("v5litepod", "v6e") else "TensorCores"
    raise SpecError(
        f"the run's {spec.trainer.count} {spec.trainer.machine} TPU VM(s) need {need} {unit} of TPU quota {quota_id} "
        f"in zone {s.zone}, and project {s.project}'s limit there is {limit}. Nothing was created. Ask for more "
        f"(console: IAM & Admin > Quotas & System Limits, service Cloud TPU API, or `gcloud quotas preferences create "
        f"--service=tpu.googleapis.com --project={s.project} --quota-id={quota_id} --dimensions=zone={s.zone} "
        f"--preferred-value={need}`), or another zone (gcp.zone) or a smaller TPU (trainer.machine).",
        field="trainer.machine")
