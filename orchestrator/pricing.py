"""Price recorded runs with the cost model: what each process stood for, and what it used; and, beside Equation 1,
what the run created that the paper's model leaves out (its provider's extras: addresses, disks, ...).

What a run created is its provider's to say (provisioners/contract.py Bill): it is recorded when the run ends
(`cost_summary` keeps the provider's own record of it in the summary, under cost.created) and read back by the
provider (`billed`), which also says how an older record without it is known, if at all. Nothing here knows what a
place bills for: the provider declares it, the cost model prices it from the run's catalog.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dsctl.costmodel import (
    Additions,
    Catalog,
    CostBreakdown,
    RunUsage,
    describe_provisioning,
    load_catalog,
    price,
    price_extras,
)
from dsctl.costmodel.estimate import usage_from_spec
from dsctl.costmodel.storage import GB, storage_cost, storage_month_cost
from dsctl.provisioners import Bill, Billed
from dsctl.provisioners.registry import provider_class
from dsctl.specs import JobSpec, SpecError

from .records import CacheStorage, CostSummary, RunRecord

RECORDED = "recorded"


def usage_from_record(record: RunRecord) -> RunUsage:
    """A run's usage: the spec's machine types and how they are bought, the measured job time and
    per-process utilization.

    Processes that stand in for machines (a local run's) are priced as the machines they stand for (the spec's
    machine types).
    """
    spec = JobSpec.model_validate_json(record.spec_json)
    s = record.job
    job_time = s.duration_s or ((record.ended_at or record.created_at) - record.created_at)
    return usage_from_spec(spec, job_time_s=max(job_time, 1e-6), batches=s.batches, workers=_workers(record),
                           trainers=record.trainers, measured=s.as_json())


def stands_in_for(provider: str) -> str | None:
    """The place whose machines a provider's processes stand for (a local run's: priced as a run there), or None
    when its machines are its own."""
    cls = provider_class(provider)
    return cls.stands_in_for if cls is not None else None


def catalog_of(spec: JobSpec, base_dir: str | Path | None = None) -> Catalog:
    """The catalog a spec is priced from: the one its `pricing` names (by default its provider's own), a path
    relative to the spec's folder."""
    return load_catalog(spec.pricing, base_dir=base_dir)


def price_record(record: RunRecord, catalog: Catalog | None = None,
                 basis: str | None = None) -> tuple[RunUsage, CostBreakdown, Catalog]:
    spec = JobSpec.model_validate_json(record.spec_json)
    # A relative catalog path is relative to the spec's folder, as `dsctl validate` resolved it.
    catalog = catalog or catalog_of(spec, Path(record.spec_path).parent if record.spec_path else None)
    usage = usage_from_record(record)
    breakdown = price(usage, catalog, basis or spec.cost_basis)
    if stands_in_for(record.provider):
        breakdown = replace(breakdown, notes=(
            *breakdown.notes, f"a {record.provider} run: each process is priced as the machine type the spec names "
                              "for it."))
    return usage, breakdown, catalog


@dataclass(frozen=True)
class RunAdditions:
    """A run's additions to Equation 1 (its extras, priced) and how what they price is known (`status`, its
    provider's words: "recorded", "from the run's spec", "as for a gcp run of this spec", or "not recorded: <why>"
    with no additions), with the provider's notes on it."""

    status: str
    additions: Additions | None = None
    bill: Bill | None = None
    notes: tuple[str, ...] = ()

    @property
    def known(self) -> bool:
        return self.additions is not None


def _workers(record: RunRecord) -> int:
    return record.workers if record.mode == "service" else 0


def billed_of(record: RunRecord) -> Billed:
    """What a recorded run created, as its provider reads it back (from what the run kept, else its spec)."""
    cls = provider_class(record.provider)
    if cls is None:
        return Billed(None, f"not known: provider {record.provider} is not available in this dsctl")
    cost = record.job.cost
    return cls().billed(cost.created if cost is not None else None, record.spec_json, _workers(record),
                        record.trainers)


def run_additions(record: RunRecord, usage: RunUsage, catalog: Catalog, billed: Billed | None = None) -> RunAdditions:
    """The run's extras priced over its job time (usage.job_time_s, Equation 1's t), the workers' and dispatcher's
    stopped seconds holding nothing that is billed only while they run."""
    billed = billed or billed_of(record)
    if billed.bill is None:
        return RunAdditions(billed.how)
    stopped = {"workers": usage.worker_stopped_s, "dispatcher": usage.dispatcher_stopped_s}
    return RunAdditions(billed.how, price_extras(billed.bill.extras, catalog, usage.job_time_s, stopped), billed.bill,
                        stand_in_notes(record.provider, billed.bill))


def spec_additions(spec: JobSpec, usage: RunUsage, catalog: Catalog) -> RunAdditions:
    """What a run of `spec` as `usage` says (its workers, its length) would create besides its machines, priced: for
    an estimate, before any run."""
    cls = provider_class(spec.provider)
    if cls is None:
        return RunAdditions(f"not known: provider {spec.provider} is not available in this dsctl")
    bill = cls().bill(spec, usage.n_workers, usage.n_trainers)
    there = cls.stands_in_for
    how = f"as for a {there} run of this spec" if there else "from the spec"
    return RunAdditions(how, price_extras(bill.extras, catalog, usage.job_time_s), bill,
                        stand_in_notes(spec.provider, bill))


def stand_in_notes(provider: str, bill: Bill) -> tuple[str, ...]:
    """What a run whose processes stand in for another place's machines is told of its additions."""
    there = stands_in_for(provider)
    if not there or not bill.extras:
        return ()
    return (f"additions of a spec run on this machine (provider: {provider}): the "
            f"{' and '.join(e.name for e in bill.extras)} a {there} run of the spec would have.",)


def cache_storage(record: RunRecord, catalog: Catalog) -> CacheStorage | None:
    """The autocache cache a run wrote (and sealed) or read, priced by the month it is kept and for the
    job's own time; None without one. Storage is billed while the cache exists, whoever reads it, so it
    is shown beside Equation 1's total, not in it. No price for its kind in the catalog: `per_month` None."""
    autocache = record.job.autocache
    cache = autocache.cache if autocache is not None else None
    if cache is None or not cache.sealed or cache.bytes is None or cache.storage_kind is None or cache.state is None:
        return None
    kind, nbytes = cache.storage_kind, float(cache.bytes)
    gb_month = catalog.storage_price(kind)
    job_s = record.job.duration_s or 0.0
    return CacheStorage(kind=kind, gb=nbytes / GB, state=cache.state, path=cache.path, gb_month=gb_month,
                        per_month=storage_month_cost(nbytes, gb_month) if gb_month is not None else None,
                        during_job=storage_cost(nbytes, gb_month, job_s) if gb_month is not None else None)


def cost_summary(record: RunRecord) -> CostSummary:
    """The cost line shown at the end of `dsctl up`; with `error` (and no total) if it cannot be priced.

    It also keeps what the run created that Equation 1 leaves out (`created`: its provider's own record of it), read
    now, by the dsctl that ran it, so a later `dsctl cost report` prices the additions from the record, not from
    defaults that may change."""
    cls = provider_class(record.provider)
    bill: Bill | None
    try:
        bill = cls().bill(JobSpec.model_validate_json(record.spec_json), _workers(record), record.trainers) \
            if cls is not None else None
    except Exception:  # noqa: BLE001 - a spec this dsctl cannot read: the pricing below says why
        bill = None
    created: dict[str, Any] | None = bill.kept if bill is not None else None
    try:
        usage, b, catalog = price_record(record)
    except Exception as exc:  # noqa: BLE001 - a price missing (a machine type no catalog knows) never stops the record
        return CostSummary(error=exc.message if isinstance(exc, SpecError) else " ".join(str(exc).split()),
                           created=created)
    note = "priced as the spec's machine types" if stands_in_for(record.provider) else "list prices"
    extra = run_additions(record, usage, catalog, Billed(bill, RECORDED)) if bill is not None else None
    local = {"remote_preprocessing": b.remote_preprocessing, "local_preprocessing": b.local_preprocessing,
             "local_cpu_source": b.local_cpu_source} if usage.local_workers else {}
    return CostSummary(total=b.total, service=b.service, trainers=b.trainers, per_1000_batches=b.per_1000_batches,
                       basis=b.basis, catalog=catalog.name, note=note, service_provisioning=b.service_provisioning,
                       trainer_provisioning=b.trainer_provisioning,
                       provisioning=describe_provisioning(b.service_provisioning, b.trainer_provisioning),
                       cache_storage=cache_storage(record, catalog), created=created,
                       additions=extra.additions.to_dict() if extra and extra.additions else None, **local)
