"""`dsctl cost ...`: price jobs with the paper's cost model and print the breakdown.

Only argument handling and rendering live here; the arithmetic is dsctl.costmodel.
Errors are SpecErrors, which the main CLI prints as one paragraph and exits 2.
`cost_row` and `render` are shared with `dsctl cost report`.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import typer

from dsctl.costmodel import (
    BASES,
    Catalog,
    Comparison,
    CostBreakdown,
    RunUsage,
    compare,
    describe_provisioning,
    estimate,
    load_catalog,
    provisioning_label,
    usage_from_spec,
)
from dsctl.orchestrator.preflight import load_job
from dsctl.orchestrator.pricing import stands_in
from dsctl.specs.errors import SpecError
from dsctl.specs.schema import MAX_DURATION_S, MAX_STEPS, MAX_WORKERS

from .render import cache_text

FORMATS = ("table", "json", "csv", "markdown")
COST_FIELDS = ("workers", "dispatcher", "trainer_cpu", "trainer_memory", "accelerators", "service", "trainers", "total")
FIELDS = (
    "label", "basis", "prices", "service_provisioning", "trainer_provisioning", "job_time_s", "batches", "n_workers",
    "worker_machine", "dispatcher_machine", "n_trainers", "trainer_machine", *COST_FIELDS, "per_1000_batches", "speedup",
    "cost_saving", "cache_storage_kind", "cache_gb", "cache_per_month", "cache_during_job", "notes",
)
CACHE_NOTE = ("cache: the autocache cache a run wrote or read is billed by the month while it is kept, so it is shown "
              "apart from the total (Equation 1 prices the job's machines); cache_during_job is its cost over the "
              "job's own time.")

cost_app = typer.Typer(help="Price training jobs with the tf.data service paper's cost model (Equation 1).",
                       no_args_is_help=True)


@cost_app.callback()
def _cost() -> None:
    """Price training jobs with the tf.data service paper's cost model (Equation 1)."""


def cost_row(label: str, usage: RunUsage, b: CostBreakdown, catalog: Catalog,
             comparison: Comparison | None = None, cache: dict | None = None) -> dict:
    """One configuration or run as a flat record of plain numbers (what json and csv print).

    service_provisioning / trainer_provisioning say which of the catalog's prices each part was
    charged at: 'standard' (on-demand) or 'spot'; the service's is None when there is no service.
    `cache` is a run's autocache cache (orchestrator.pricing.cache_storage), priced apart from the total.
    """
    d = b.to_dict()
    cache = cache or {}
    return {
        "label": label,
        "basis": b.basis,
        "prices": catalog.name,
        "service_provisioning": b.service_provisioning,
        "trainer_provisioning": b.trainer_provisioning,
        "job_time_s": b.job_time_s,
        "batches": b.batches,
        "n_workers": usage.n_workers,
        "worker_machine": usage.worker_machine,
        "dispatcher_machine": usage.dispatcher_machine,
        "n_trainers": usage.n_trainers,
        "trainer_machine": usage.trainer_machine,
        **{k: d[k] for k in COST_FIELDS},
        "per_1000_batches": d["per_1000_batches"],
        "speedup": comparison.speedup if comparison else None,
        "cost_saving": comparison.cost_saving if comparison else None,
        "cache_storage_kind": cache.get("kind"),
        "cache_gb": cache.get("gb"),
        "cache_per_month": cache.get("per_month"),
        "cache_during_job": cache.get("during_job"),
        "cache": cache or None,
        "notes": list(b.notes) + ([CACHE_NOTE] if cache else []),
    }


def _money(v: float | None, places: int = 2) -> str:
    """To the cent for real sums; tiny sums (short local runs) keep four significant digits."""
    if v is None:
        return "-"
    return f"${v:,.{places}f}" if v == 0 or abs(v) >= 1 else f"${v:.4g}"


def _display(row: dict) -> list[tuple[str, str]]:
    """Human-readable (name, value) pairs for table and markdown output."""
    svc, trn = provisioning_label(row["service_provisioning"]), provisioning_label(row["trainer_provisioning"])
    workers = f"{row['n_workers']} x {row['worker_machine']} ({svc})" if row["n_workers"] else "none (colocated)"
    dispatcher = f"1 x {row['dispatcher_machine']} ({svc})" if row["dispatcher_machine"] else "none"
    pairs = [
        ("basis", row["basis"]),
        ("prices", row["prices"]),
        ("priced as", describe_provisioning(row["service_provisioning"], row["trainer_provisioning"])),
        ("job time", f"{row['job_time_s'] / 3600:,.2f} h ({row['job_time_s']:,.0f} s)"),
        ("batches", "-" if row["batches"] is None else f"{row['batches']:,.0f}"),
        ("workers", workers),
        ("dispatcher", dispatcher),
        ("trainers", f"{row['n_trainers']} x {row['trainer_machine']} ({trn})"),
        ("workers cost", _money(row["workers"])),
        ("dispatcher cost", _money(row["dispatcher"])),
        ("trainer CPU", _money(row["trainer_cpu"])),
        ("trainer memory", _money(row["trainer_memory"])),
        ("accelerators", _money(row["accelerators"])),
        ("service", _money(row["service"])),
        ("total", _money(row["total"])),
        ("per 1,000 batches", _money(row["per_1000_batches"], 4)),
    ]
    if any(row[k] is not None for k in ("speedup", "cost_saving")):
        pairs += [("speedup", f"{row['speedup']:.2f}x"), ("cost saving", f"{row['cost_saving']:.2f}x")]
    if row.get("cache"):  # last: rows without a cache show "-" there
        pairs.append(("cache", cache_text(row["cache"], row["prices"])))
    return pairs


def _notes(rows: list[dict]) -> list[str]:
    seen: list[str] = []
    for row in rows:
        seen += [n for n in row["notes"] if n not in seen]
    return seen


def render(rows: list[dict], fmt: str, title: str = "") -> str | None:
    """json/csv/markdown as text (full precision for json and csv); table: None, print with print_table."""
    if fmt == "json":
        return json.dumps(rows, indent=2)
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=FIELDS, lineterminator="\n")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: (" | ".join(v) if k == "notes" else ("" if v is None else v)) for k, v in row.items()
                             if k in FIELDS})
        return out.getvalue().rstrip("\n")
    if fmt == "markdown":
        shown = [_display(r) for r in rows]
        lines = [f"**{title}**", ""] if title else []
        lines += ["| | " + " | ".join(r["label"] for r in rows) + " |", "|---|" + "---|" * len(rows)]
        longest = max(shown, key=len)  # the row with the most names (speedup and cache are not in every row)
        for i, (name, _) in enumerate(longest):
            lines.append(f"| {name} | " + " | ".join(s[i][1] if i < len(s) else "-" for s in shown) + " |")
        lines += [""] + [f"- {n}" for n in _notes(rows)]
        return "\n".join(lines).rstrip("\n")
    return None


def print_table(rows: list[dict], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    head, _, tail = title.partition(" (")
    table = Table(title=head, caption=("(" + tail) if tail else None)
    table.add_column("")
    for row in rows:
        table.add_column(row["label"], justify="right")
    shown = [_display(r) for r in rows]
    longest = max(shown, key=len)
    for i, (name, _) in enumerate(longest):
        emphasis = name in ("total", "cost saving")
        table.add_row(name, *(s[i][1] if i < len(s) else "-" for s in shown), style="bold" if emphasis else None)
    console = Console()
    console.print(table)
    for note in _notes(rows):
        console.print(f"note: {note}", highlight=False, soft_wrap=True)


def _choice(value: str, allowed: tuple[str, ...], option: str) -> str:
    if value not in allowed:
        raise SpecError(f"{option} must be one of {', '.join(allowed)}; got '{value}'.")
    return value


@cost_app.command("estimate")
def estimate_cmd(
    spec_path: Path = typer.Argument(..., metavar="JOB.yaml", help="The job spec to price."),
    batches_per_sec: float = typer.Option(..., "--batches-per-sec", metavar="R",
                                          help="Training throughput to price, in batches per second."),
    steps: int | None = typer.Option(None, "--steps", metavar="N", help="Training steps (one batch each)."),
    hours: float | None = typer.Option(None, "--hours", metavar="H", help="Training time in hours."),
    basis: str | None = typer.Option(None, "--basis", help="utilization | vm-hours (default: the spec's cost_basis)."),
    prices: str | None = typer.Option(None, "--prices", metavar="NAME|FILE",
                                         help="Price catalog: a shipped name or a YAML path (default: the spec's pricing)."),
    workers: int | None = typer.Option(None, "--workers", metavar="N", help="Override service.workers; 0 = colocated."),
    compare_colocated: float | None = typer.Option(
        None, "--compare-colocated", metavar="B0",
        help="Also price the same trainers without the service at B0 batches/s; print speedup and cost saving."),
    fmt: str = typer.Option("table", "--format", help="table | json | csv | markdown."),
) -> None:
    """What a configuration costs at a given throughput, without running anything (paper §4.1)."""
    _choice(fmt, FORMATS, "--format")
    if basis is not None:
        _choice(basis, BASES, "--basis")
    # The spec's own bounds (specs/schema.py), so an estimate is of a job dsctl would run.
    for option, value, most in (("--steps", steps, MAX_STEPS), ("--hours", hours, MAX_DURATION_S / 3600),
                                ("--workers", workers, MAX_WORKERS)):
        if value is not None and value > most:
            raise SpecError(f"must be at most {int(most):,} (the bound a job spec has), got {value:g}.", field=option)
    loaded = load_job(spec_path)
    spec = loaded.spec
    catalog = load_catalog(prices) if prices else load_catalog(spec.pricing, base_dir=loaded.base_dir)
    basis = basis or spec.cost_basis
    local = stands_in(spec.provider)
    run = estimate(spec, catalog, batches_per_sec=batches_per_sec, steps=steps, hours=hours, basis=basis, workers=workers,
                   stand_in=local)
    usage = usage_from_spec(spec, job_time_s=run.job_time_s, batches=run.batches, workers=workers)
    if compare_colocated is None:
        rows = [cost_row("with service" if usage.n_workers else "colocated", usage, run, catalog)]
    else:
        base = estimate(spec, catalog, batches_per_sec=compare_colocated, steps=run.batches, basis=basis, workers=0,
                        stand_in=local)
        base_usage = usage_from_spec(spec, job_time_s=base.job_time_s, batches=base.batches, workers=0)
        rows = [cost_row("colocated", base_usage, base, catalog),
                cost_row("with service", usage, run, catalog, compare(base, run))]
    priced_as = describe_provisioning(spec.service.provisioning if usage.n_workers else None, spec.trainer.provisioning)
    title = (f"Cost estimate: {spec.name} ({basis} basis, prices {catalog.name} of {catalog.date}, {catalog.currency}; "
             f"{priced_as})")
    text = render(rows, fmt, title)
    if text is None:
        print_table(rows, title)
    else:
        typer.echo(text)


def _select_runs(store, runs: list[str], last: bool, all_: bool, since: str | None):
    """The records `cost report` covers (a sweep stands for its points); unknown ids and bad dates are bad input."""
    records = _selected(store, runs, last, all_, since)
    out = []
    for record in records:
        if record.kind == "sweep":
            out += sorted(store.list(kinds=("point",), parent_id=record.id), key=lambda r: (r.mode, r.workers))
        else:
            out.append(record)
    if not out:
        raise SpecError("the selected sweep has no measured points to price (a simulated sweep runs nothing).")
    return out


def _selected(store, runs: list[str], last: bool, all_: bool, since: str | None):
    import datetime as dt

    if runs:
        records = []
        for run_id in runs:
            record = store.get(run_id)
            if record is None:
                raise SpecError(f"no run '{run_id}' is recorded; `dsctl runs` lists the recorded ones.")
            records.append(record)
        return records
    if since:
        try:
            start = dt.datetime.fromisoformat(since).timestamp()
        except ValueError:
            raise SpecError(f"--since must be a date like 2026-11-01 or 2026-11-01T12:00, got '{since}'.") from None
        return list(reversed(store.list(since=start, kinds=("job", "point"))))
    if all_:
        return list(reversed(store.list(kinds=("job", "point"))))
    latest = store.list(limit=1)
    if not latest:
        raise SpecError("no runs are recorded yet; `dsctl up JOB.yaml` makes one.")
    return latest


@cost_app.command("report")
def report_cmd(
    runs: list[str] = typer.Argument(None, metavar="[RUN]...", help="Run ids (or unique prefixes); default: the last run."),
    last: bool = typer.Option(False, "--last", help="The most recent run."),
    all_: bool = typer.Option(False, "--all", help="Every recorded run."),
    since: str | None = typer.Option(None, "--since", metavar="DATE", help="Runs started on or after DATE (ISO 8601)."),
    basis: str | None = typer.Option(None, "--basis", help="utilization | vm-hours (default: each run's spec)."),
    prices: str | None = typer.Option(None, "--prices", metavar="NAME|FILE", help="Price catalog (default: each run's spec)."),
    baseline: str | None = typer.Option(None, "--baseline", metavar="RUN",
                                           help="Compare each run with this one: speedup and cost saving (paper Figure 8)."),
    fmt: str = typer.Option("table", "--format", help="table | json | csv | markdown."),
) -> None:
    """Price recorded runs with Equation 1: each part's cost, the total and the cost per 1,000 batches."""
    from dsctl.orchestrator.pricing import cache_storage, price_record
    from dsctl.orchestrator.store import RunStore

    _choice(fmt, FORMATS, "--format")
    if basis is not None:
        _choice(basis, BASES, "--basis")
    store = RunStore()
    records = _select_runs(store, runs or [], last, all_, since)
    catalog = load_catalog(prices) if prices else None
    base = None
    if baseline:
        base_record = _select_runs(store, [baseline], False, False, None)[0]
        base = price_record(base_record, catalog, basis)[1]
    rows = []
    for record in records:
        usage, breakdown, used_catalog = price_record(record, catalog, basis)
        comparison = compare(base, breakdown) if base is not None else None
        row = cost_row(record.id, usage, breakdown, used_catalog, comparison, cache_storage(record, used_catalog))
        rows.append(row)
    title = f"Cost report: {len(rows)} run(s)" + (f" against baseline {baseline}" if baseline else "")
    text = render(rows, fmt, title)
    if text is None:
        print_table(rows, title + " (Equation 1 of the tf.data service paper)")
    else:
        typer.echo(text)
