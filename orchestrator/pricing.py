"""Price recorded runs with the cost model: what each process stood for, and what it used."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from dsctl.costmodel import Catalog, CostBreakdown, RunUsage, describe_provisioning, load_catalog, price
from dsctl.costmodel.estimate import usage_from_spec
from dsctl.costmodel.storage import GB, storage_cost, storage_month_cost
from dsctl.provisioners.registry import provider_class
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
    """The cost line shown at the end of `dsctl up`; None (with the reason) if it cannot be priced."""
    try:
        _, b, catalog = price_record(record)
    except SpecError as exc:
        return {"error": str(exc)}
    note = "priced as the spec's machine types" if stands_in(record.provider) else "list prices"
    return {"total": b.total, "service": b.service, "trainers": b.trainers, "per_1000_batches": b.per_1000_batches,
            "basis": b.basis, "catalog": catalog.name, "note": note,
            "service_provisioning": b.service_provisioning, "trainer_provisioning": b.trainer_provisioning,
            "provisioning": describe_provisioning(b.service_provisioning, b.trainer_provisioning),
            "cache_storage": cache_storage(record, catalog)}
