"""`dsctl cost estimate` and `dsctl cost report`: what they price and how, as typed rows the CLI renders.

An estimate prices a spec's configuration at a throughput it is given, without running anything (paper §4.1); a
report prices recorded runs (a sweep stands for its points), each with the catalog and basis its spec names unless
told otherwise, the runs that cannot be priced marked and the others priced. Every row has Equation 1's parts and
total, and beside it (never in it) what the run's extras cost, as its provider declares them (pricing.py): one
column per extra, named by the provider (e.g. ipv4_cost, boot_disk_cost), their total and the total with them.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsctl.costmodel import (
    Catalog,
    Comparison,
    CostBreakdown,
    PriceSource,
    RunUsage,
    compare,
    describe_provisioning,
    estimate,
    load_catalog,
    usage_from_spec,
)
from dsctl.specs import SpecError, UsageError

from .preflight import load_job
from .pricing import RunAdditions, cache_storage, price_record, run_additions, spec_additions, stands_in_for
from .records import CacheStorage, RunRecord
from .store import RunStore

COST_FIELDS = ("workers", "dispatcher", "trainer_cpu", "trainer_memory", "accelerators", "service", "trainers", "total",
               "remote_preprocessing", "local_preprocessing")  # the last two split the pipeline's cost by where it ran
# Beside Equation 1's total, not in it: the extras' own columns (each provider names its own) come first.
ADDITION_FIELDS = ("additions_total", "total_with_additions", "additions_status")
FIELDS = (
    "label", "basis", "prices", "service_provisioning", "trainer_provisioning", "job_time_s", "batches", "n_workers",
    "worker_machine", "dispatcher_machine", "n_trainers", "trainer_machine", "local_workers", "local_cpu_source",
    *COST_FIELDS, *ADDITION_FIELDS,
    "per_1000_batches", "speedup", "cost_saving", "cache_storage_kind", "cache_gb", "cache_per_month",
    "cache_during_job", "price_sources", "notes",
)
CACHE_NOTE = ("cache: the autocache cache a run wrote or read is billed by the month while it is kept, so it is shown "
              "apart from the total (Equation 1 prices the job's machines); cache_during_job is its cost over the "
              "job's own time.")
ADDITIONS_NOTE = ("additions (+ rows; a column of its own each, additions_total): what the job creates besides its "
                  "machines (its provider's extras: addresses, disks, ...) costs over its time, which the paper's "
                  "Equation 1 does not price; shown beside its total, not in it (total_with_additions adds them).")


@dataclass
class CostRow:
    """One configuration or run priced: plain numbers (what json and csv print), and what its extras cost.

    service_provisioning / trainer_provisioning say which of the catalog's prices each part was charged at:
    'standard' (on-demand) or 'spot'; the service's is None when there is no service. `extras`: each extra's cost by
    its column (None when not priced or not known), `additions` their detail (costmodel Additions.to_dict, with
    their status). price_sources says where each price used comes from (its catalog entry's source and date).
    `not_priced`: why a run could not be priced (its numbers are then None)."""

    label: str
    basis: str | None = None
    prices: str | None = None
    service_provisioning: str | None = None
    trainer_provisioning: str | None = None
    job_time_s: float | None = None
    batches: float | None = None
    n_workers: int | None = None
    worker_machine: str | None = None
    dispatcher_machine: str | None = None
    n_trainers: int | None = None
    trainer_machine: str | None = None
    local_workers: int | None = None  # per trainer (hybrid placement), beside the remote n_workers
    local_cpu_source: str | None = None  # how the local workers' CPU was known: estimated, measured here, not known
    costs: dict[str, float | None] = field(default_factory=dict)  # COST_FIELDS
    extras: dict[str, float | None] = field(default_factory=dict)  # column -> cost
    additions_total: float | None = None
    total_with_additions: float | None = None
    additions_status: str | None = None
    additions: dict[str, Any] | None = None
    per_1000_batches: float | None = None
    speedup: float | None = None
    cost_saving: float | None = None
    cache: CacheStorage | None = None
    price_sources: list[PriceSource] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    not_priced: str | None = None

    @property
    def total(self) -> float | None:
        return self.costs.get("total")

    def as_json(self, extra_columns: list[str]) -> dict[str, Any]:
        """The row as `--format json` prints it: every field, each extra column of the table (None where this row
        has none), the cache's parts and the extras' detail."""
        cache = self.cache
        out: dict[str, Any] = {
            "label": self.label, "basis": self.basis, "prices": self.prices,
            "service_provisioning": self.service_provisioning, "trainer_provisioning": self.trainer_provisioning,
            "job_time_s": self.job_time_s, "batches": self.batches, "n_workers": self.n_workers,
            "worker_machine": self.worker_machine, "dispatcher_machine": self.dispatcher_machine,
            "n_trainers": self.n_trainers, "trainer_machine": self.trainer_machine,
            "local_workers": self.local_workers, "local_cpu_source": self.local_cpu_source,
            **{k: self.costs.get(k) for k in COST_FIELDS},
            **{c: self.extras.get(c) for c in extra_columns},
            "additions_total": self.additions_total, "total_with_additions": self.total_with_additions,
            "additions_status": self.additions_status, "additions": self.additions,
            "per_1000_batches": self.per_1000_batches, "speedup": self.speedup, "cost_saving": self.cost_saving,
            "cache_storage_kind": cache.kind if cache else None, "cache_gb": cache.gb if cache else None,
            "cache_per_month": cache.per_month if cache else None,
            "cache_during_job": cache.during_job if cache else None,
            "cache": cache.as_json() if cache else None,
            "price_sources": [s.to_dict() for s in self.price_sources], "notes": list(self.notes),
        }
        if self.not_priced is not None:
            out["not_priced"] = self.not_priced
        return out


@dataclass
class CostTable:
    """What `dsctl cost` prints: a title and its rows, one per configuration or run."""

    title: str
    rows: list[CostRow]

    @property
    def extra_columns(self) -> list[str]:
        """The extras' columns of every row, in the order first met."""
        return list(dict.fromkeys(c for r in self.rows for c in r.extras))

    @property
    def columns(self) -> list[str]:
        """The flat columns (csv): the fields, with the extras' own columns where the additions begin."""
        at = FIELDS.index(ADDITION_FIELDS[0])
        return [*FIELDS[:at], *self.extra_columns, *FIELDS[at:]]

    def as_json(self) -> list[dict[str, Any]]:
        columns = self.extra_columns
        return [r.as_json(columns) for r in self.rows]

    @property
    def notes(self) -> list[str]:
        """Every row's notes, each once."""
        seen: list[str] = []
        for row in self.rows:
            seen += [n for n in row.notes if n not in seen]
        return seen


def _price_sources(usage: RunUsage, b: CostBreakdown, catalog: Catalog, extra: RunAdditions | None) -> list[PriceSource]:
    """Where each price the row used comes from: the machines' (for how each part was bought) and the additions'."""
    parts = [(usage.worker_machine, b.service_provisioning), (usage.dispatcher_machine, b.service_provisioning),
             (usage.trainer_machine, b.trainer_provisioning)]
    out: list[PriceSource] = []
    for machine, provisioning in parts:
        if not machine or not provisioning:
            continue
        try:
            source = catalog.source_of(machine, provisioning)
        except SpecError:
            continue
        if source not in out:
            out.append(source)
    if extra is not None and extra.additions is not None:
        out += [s for s in extra.additions.sources if s not in out]
    return out


def _addition_notes(extra: RunAdditions | None) -> list[str]:
    if extra is None:
        return []
    notes = [ADDITIONS_NOTE]
    if extra.additions is None:
        return notes + [f"additions {extra.status}"]
    notes += list(extra.notes)
    for x in extra.additions.items:
        notes += ([f"{x.name} not priced: {x.unpriced}"] if x.unpriced else []) + [f"{x.name}: {n}" for n in x.notes]
    return notes


def cost_row(label: str, usage: RunUsage, b: CostBreakdown, catalog: Catalog, comparison: Comparison | None = None,
             cache: CacheStorage | None = None, additions: RunAdditions | None = None) -> CostRow:
    """One configuration or run as a row: Equation 1's parts, and beside them its additions (their status says why
    they are not known: 'not recorded: ...', 'not priced: ...')."""
    d = b.to_dict()
    sources = _price_sources(usage, b, catalog, additions)
    own = [f"price source, {s.text()}" for s in sources if s.own]
    row = CostRow(label=label, basis=b.basis, prices=catalog.name, service_provisioning=b.service_provisioning,
                  trainer_provisioning=b.trainer_provisioning, job_time_s=b.job_time_s, batches=b.batches,
                  n_workers=usage.n_workers, worker_machine=usage.worker_machine,
                  dispatcher_machine=usage.dispatcher_machine, n_trainers=usage.n_trainers,
                  trainer_machine=usage.trainer_machine, local_workers=usage.local_workers,
                  local_cpu_source=b.local_cpu_source, costs={k: d[k] for k in COST_FIELDS},
                  per_1000_batches=d["per_1000_batches"], speedup=comparison.speedup if comparison else None,
                  cost_saving=comparison.cost_saving if comparison else None, cache=cache, price_sources=sources,
                  notes=list(b.notes) + ([CACHE_NOTE] if cache else []) + _addition_notes(additions) + own)
    if additions is not None:
        row.additions_status = additions.status
        a = additions.additions
        if a is not None:
            unpriced = "; ".join(x.unpriced for x in a.items if x.unpriced)
            row.additions_status = f"not priced: {unpriced}" if unpriced else additions.status
            row.extras = {x.column: x.cost for x in a.items}
            row.additions_total = a.cost
            row.total_with_additions = None if a.cost is None else b.total + a.cost
            row.additions = {**a.to_dict(), "status": row.additions_status}
    return row


def unpriced_row(label: str, reason: str) -> CostRow:
    """A run that cannot be priced (a machine type no catalog knows, a record this dsctl cannot read): its row says
    so, and the others are priced as usual."""
    return CostRow(label=label, not_priced=reason)


def estimate_costs(spec_path: Path, *, batches_per_sec: float, steps: int | None = None, hours: float | None = None,
                   basis: str | None = None, prices: str | None = None, workers: int | None = None,
                   compare_colocated: float | None = None) -> CostTable:
    """What `spec_path`'s configuration costs at `batches_per_sec`, without running anything; with
    `compare_colocated` (its colocated throughput), the same trainers without the service beside it, with the
    speedup and cost saving (paper Figure 8)."""
    loaded = load_job(spec_path)
    spec = loaded.spec
    catalog = load_catalog(prices) if prices else load_catalog(spec.pricing, base_dir=loaded.base_dir)
    basis = basis or spec.cost_basis
    there = stands_in_for(spec.provider)
    note = (f"this spec runs on this machine (provider: {spec.provider}); it is priced as the machine types it "
            "names.",) if there else ()
    run = estimate(spec, catalog, batches_per_sec=batches_per_sec, steps=steps, hours=hours, basis=basis,
                   workers=workers, notes=note)
    usage = usage_from_spec(spec, job_time_s=run.job_time_s, batches=run.batches, workers=workers)
    if compare_colocated is None:
        rows = [cost_row("with service" if usage.n_workers else "colocated", usage, run, catalog,
                         additions=spec_additions(spec, usage, catalog))]
    else:
        base = estimate(spec, catalog, batches_per_sec=compare_colocated, steps=run.batches, basis=basis, workers=0,
                        notes=note)
        base_usage = usage_from_spec(spec, job_time_s=base.job_time_s, batches=base.batches, workers=0)
        rows = [cost_row("colocated", base_usage, base, catalog, additions=spec_additions(spec, base_usage, catalog)),
                cost_row("with service", usage, run, catalog, compare(base, run),
                         additions=spec_additions(spec, usage, catalog))]
    priced_as = describe_provisioning(spec.service.provisioning if usage.n_workers else None, spec.trainer.provisioning)
    title = (f"Cost estimate: {spec.name} ({basis} basis, prices {catalog.name} of {catalog.date}, {catalog.currency}; "
             f"{priced_as})")
    return CostTable(title, rows)


def select_runs(store: RunStore, runs: list[str], *, last: bool = False, all_: bool = False,
                since: str | None = None) -> list[RunRecord]:
    """The records `cost report` covers (a sweep stands for its points); unknown runs and bad dates are usage errors."""
    out = []
    for record in _selected(store, runs, all_, since):
        if record.kind == "sweep":
            out += sorted(store.list(kinds=("point",), parent_id=record.id), key=lambda r: (r.mode, r.workers))
        else:
            out.append(record)
    if not out:
        raise SpecError("the selected sweep has no measured points to price (a simulated sweep runs nothing).")
    return out


def _selected(store: RunStore, runs: list[str], all_: bool, since: str | None) -> list[RunRecord]:
    if runs:
        records = []
        for run_id in runs:
            record = store.find(run_id)
            if record is None:
                raise UsageError(f"no run '{run_id}' is recorded; `dsctl runs` lists the recorded ones.")
            records.append(record)
        return records
    if since:
        try:
            start = dt.datetime.fromisoformat(since).timestamp()
        except ValueError:
            raise UsageError(f"--since must be a date like 2026-11-01 or 2026-11-01T12:00, got '{since}'.") from None
        return list(reversed(store.list(since=start, kinds=("job", "point"))))
    if all_:
        return list(reversed(store.list(kinds=("job", "point"))))
    latest = store.list(limit=1)  # --last, and the default
    if not latest:
        raise UsageError("no runs are recorded yet; `dsctl up JOB.yaml` makes one.")
    return latest


def report_costs(runs: list[str], *, last: bool = False, all_: bool = False, since: str | None = None,
                 basis: str | None = None, prices: str | None = None, baseline: str | None = None) -> CostTable:
    """Recorded runs priced with Equation 1, each run that cannot be priced marked; with a baseline, each one's
    speedup and cost saving against it (paper Figure 8)."""
    store = RunStore()
    records = select_runs(store, runs, last=last, all_=all_, since=since)
    catalog = load_catalog(prices) if prices else None
    base = price_record(select_runs(store, [baseline])[0], catalog, basis)[1] if baseline else None
    rows = []
    for record in records:
        try:
            usage, breakdown, used_catalog = price_record(record, catalog, basis)
        except SpecError as exc:  # this run only: the others are priced, and this one says why not
            rows.append(unpriced_row(record.id, exc.message))
            continue
        except ValueError as exc:  # a record this dsctl cannot read (its spec, written by another version)
            rows.append(unpriced_row(record.id, f"its record cannot be read by this dsctl: {' '.join(str(exc).split())}"))
            continue
        comparison = compare(base, breakdown) if base is not None else None
        rows.append(cost_row(record.id, usage, breakdown, used_catalog, comparison, cache_storage(record, used_catalog),
                             run_additions(record, usage, used_catalog)))
    title = f"Cost report: {len(rows)} run(s)" + (f" against baseline {baseline}" if baseline else "")
    return CostTable(title, rows)
