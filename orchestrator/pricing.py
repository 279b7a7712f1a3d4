"""Price recorded runs with the cost model: what each process stood for, and what it used; and, beside
Equation 1, what the run created that the paper's model leaves out (external IPv4 addresses, boot disks).

What a run created is recorded when it ends (`cost_summary` keeps it in the record's summary, under
cost.created): gcp.public_ips, gcp.boot_disk_gb, gcp.boot_disk_type (the spec's, or the defaults of the dsctl
that ran it) and its VMs by role. An older record without it is read from its spec when the spec says all
three; when it left them to defaults, which have changed (public_ips was false once), the report says "not
recorded" rather than guess. A local run stands in for the machine types its spec names, so it gets the
additions a gcp run of that spec would have, said as such.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from dsctl.costmodel import (
    Additions,
    Catalog,
    CostBreakdown,
    Created,
    RunUsage,
    created_from_spec,
    describe_provisioning,
    load_catalog,
    price,
    price_additions,
)
from dsctl.costmodel.estimate import usage_from_spec
from dsctl.costmodel.storage import GB, storage_cost, storage_month_cost
from dsctl.providers.registry import provider_class
from dsctl.specs import JobSpec, SpecError

from .store import RunRecord


def usage_from_record(record: RunRecord) -> RunUsage:
    """A run's usage: the spec's machine types and how they are bought, the measured job time and
    per-process utilization.

    Local processes are priced as the machines they stand for (the spec's machine types).
    """
    spec = JobSpec.model_validate_json(record.spec_json)
    s = record.summary
    workers = record.workers if record.mode == "service" else 0
    job_time = s.get("duration_s") or ((record.ended_at or record.created_at) - record.created_at)
    return usage_from_spec(spec, job_time_s=max(job_time, 1e-6), batches=s.get("batches"), workers=workers,
                           trainers=record.trainers, measured=s)


def stands_in(provider: str) -> bool:
    """Whether a provider's machines stand in for the spec's machine types (processes on this machine)."""
    cls = provider_class(provider)
    return bool(cls is not None and cls.stands_in)


def price_record(record: RunRecord, catalog: Catalog | None = None,
                 basis: str | None = None) -> tuple[RunUsage, CostBreakdown, Catalog]:
    spec = JobSpec.model_validate_json(record.spec_json)
    # A relative catalog path is relative to the spec's folder, as `dsctl validate` resolved it.
    base_dir = Path(record.spec_path).parent if record.spec_path else None
    catalog = catalog or load_catalog(spec.pricing, base_dir=base_dir)
    usage = usage_from_record(record)
    breakdown = price(usage, catalog, basis or spec.cost_basis)
    if stands_in(record.provider):
        breakdown = replace(breakdown, notes=(
            *breakdown.notes, "a local run: each process is priced as the machine type the spec names for it."))
    return usage, breakdown, catalog


RECORDED = "recorded"
FROM_SPEC = "from the run's spec"
AS_GCP = "as for a gcp run of this spec"
GCP_KEYS = ("public_ips", "boot_disk_gb", "boot_disk_type")


@dataclass(frozen=True)
class RunAdditions:
    """A run's additions to Equation 1 and how what they price is known: RECORDED (kept when the run ended),
    FROM_SPEC (an older record whose spec names all three gcp settings), AS_GCP (a local run, priced as the
    spec on Google Cloud), or "not recorded: <why>" with no additions."""

    status: str
    additions: Additions | None = None
    created: Created | None = None

    @property
    def known(self) -> bool:
        return self.additions is not None


def _workers(record: RunRecord) -> int:
    return record.workers if record.mode == "service" else 0


def _spec_of(record: RunRecord) -> JobSpec:
    return JobSpec.model_validate_json(record.spec_json)


def created_now(record: RunRecord) -> Created:
    """What the run created, read by the dsctl that ran it: its spec's gcp settings or this dsctl's defaults."""
    return created_from_spec(_spec_of(record), workers=_workers(record), trainers=record.trainers)


def created_of(record: RunRecord) -> tuple[Created | None, str]:
    """What a recorded run created that Equation 1 leaves out, and how that is known (RunAdditions.status)."""
    kept = (record.summary.get("cost") or {}).get("created")
    local = stands_in(record.provider)
    if kept:
        return Created.from_dict(kept), AS_GCP if local else RECORDED
    if local:
        return created_now(record), AS_GCP
    raw = json.loads(record.spec_json).get("gcp")
    if isinstance(raw, dict) and all(k in raw for k in GCP_KEYS):
        return created_now(record), FROM_SPEC
    return None, ("not recorded: the run's record predates dsctl keeping what a run created, and its spec left "
                  "gcp.public_ips, gcp.boot_disk_gb or gcp.boot_disk_type to defaults that have changed since")


def run_additions(record: RunRecord, usage: RunUsage, catalog: Catalog, created: Created | None = None,
                  status: str | None = None) -> RunAdditions:
    """The run's external IPv4 and boot-disk costs over its job time (usage.job_time_s, Equation 1's t), the
    workers' and dispatcher's stopped VM-seconds holding no address."""
    if created is None:
        created, status = created_of(record)
    if created is None:
        return RunAdditions(status or "not recorded")
    stopped = {"workers": usage.worker_stopped_s, "dispatcher": usage.dispatcher_stopped_s}
    return RunAdditions(status or RECORDED, price_additions(created, catalog, usage.job_time_s, stopped), created)


def cache_storage(record: RunRecord, catalog: Catalog) -> dict | None:
    """The autocache cache a run wrote (and sealed) or read, priced by the month it is kept and for the
    job's own time; None without one. Storage is billed while the cache exists, whoever reads it, so it
    is shown beside Equation 1's total, not in it. No price for its kind in the catalog: `per_month` None."""
    cache = (record.summary.get("autocache") or {}).get("cache") or {}
    if not cache.get("sealed") or cache.get("bytes") is None:
        return None
    kind, nbytes = cache["storage_kind"], float(cache["bytes"])
    gb_month = catalog.data.storage.get(kind)
    job_s = record.summary.get("duration_s") or 0.0
    return {"kind": kind, "gb": nbytes / GB, "state": cache["state"], "path": cache.get("path"), "gb_month": gb_month,
            "per_month": storage_month_cost(nbytes, gb_month) if gb_month is not None else None,
            "during_job": storage_cost(nbytes, gb_month, job_s) if gb_month is not None else None}


def cost_summary(record: RunRecord) -> dict | None:
    """The cost line shown at the end of `dsctl up`; None (with the reason) if it cannot be priced.

    It also keeps what the run created that Equation 1 leaves out (`created`), read now, by the dsctl that ran
    it, so a later `dsctl cost report` prices the additions from the record, not from defaults that may change."""
    try:
        created = created_now(record).to_dict()
    except Exception:  # noqa: BLE001 - a spec this dsctl cannot read: the pricing below says why
        created = None
    try:
        usage, b, catalog = price_record(record)
    except Exception as exc:  # noqa: BLE001 - a price missing (a machine type no catalog knows) never stops the record
        return {"error": exc.message if isinstance(exc, SpecError) else " ".join(str(exc).split()), "created": created}
    note = "priced as the spec's machine types" if stands_in(record.provider) else "list prices"
    extra = run_additions(record, usage, catalog, Created.from_dict(created), RECORDED) if created else None
    return {"total": b.total, "service": b.service, "trainers": b.trainers, "per_1000_batches": b.per_1000_batches,
            "basis": b.basis, "catalog": catalog.name, "note": note,
            "service_provisioning": b.service_provisioning, "trainer_provisioning": b.trainer_provisioning,
            "provisioning": describe_provisioning(b.service_provisioning, b.trainer_provisioning),
            "cache_storage": cache_storage(record, catalog), "created": created,
            "additions": extra.additions.to_dict() if extra and extra.additions else None}
