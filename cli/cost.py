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
    PriceSource,
    RunUsage,
    compare,
    created_from_spec,
    describe_provisioning,
    estimate,
    load_catalog,
    price_additions,
    provisioning_label,
    usage_from_spec,
)
from dsctl.costmodel.money import usd
from dsctl.orchestrator.preflight import load_job
from dsctl.orchestrator.pricing import AS_GCP, RunAdditions, stands_in
from dsctl.specs.errors import SpecError
from dsctl.specs.schema import MAX_DURATION_S, MAX_STEPS, MAX_WORKERS

from .render import cache_text, strict_json

FORMATS = ("table", "json", "csv", "markdown")
COST_FIELDS = ("workers", "dispatcher", "trainer_cpu", "trainer_memory", "accelerators", "service", "trainers", "total")
# Beside Equation 1's total, not in it: what the run's external IPv4 addresses and boot disks cost.
ADDITION_FIELDS = ("ipv4_cost", "boot_disk_cost", "additions_total", "total_with_additions", "additions_status")
FIELDS = (
    "label", "basis", "prices", "service_provisioning", "trainer_provisioning", "job_time_s", "batches", "n_workers",
    "worker_machine", "dispatcher_machine", "n_trainers", "trainer_machine", *COST_FIELDS, *ADDITION_FIELDS,
    "per_1000_batches", "speedup", "cost_saving", "cache_storage_kind", "cache_gb", "cache_per_month",
    "cache_during_job", "price_sources", "notes",
)
CACHE_NOTE = ("cache: the autocache cache a run wrote or read is billed by the month while it is kept, so it is shown "
              "apart from the total (Equation 1 prices the job's machines); cache_during_job is its cost over the "
              "job's own time.")
ADDITIONS_NOTE = ("additions (+ rows; ipv4_cost, boot_disk_cost, additions_total): what the job's external IPv4 "
                  "addresses and the VMs' boot disks cost over its time, which the paper's Equation 1 does not price; "
                  "shown beside its total, not in it (total_with_additions adds them).")

cost_app = typer.Typer(help="Price training jobs with the tf.data service paper's cost model (Equation 1).",
                       no_args_is_help=True)


@cost_app.callback()
def _cost() -> None:
    """Price training jobs with the tf.data service paper's cost model (Equation 1)."""


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


def _addition_columns(b: CostBreakdown, extra: RunAdditions | None) -> dict:
    """ipv4_cost, boot_disk_cost, additions_total, total_with_additions and additions_status: numbers None when not
    known, the status saying why ('not recorded: ...', 'not priced: ...')."""
    if extra is None:
        return {k: None for k in ADDITION_FIELDS} | {"additions": None}
    a = extra.additions
    if a is None:
        return {k: None for k in ADDITION_FIELDS} | {"additions_status": extra.status, "additions": None}
    unpriced = "; ".join(x.unpriced for x in a.items if x.unpriced)
    status = f"not priced: {unpriced}" if unpriced else extra.status
    return {"ipv4_cost": a.ipv4.cost, "boot_disk_cost": a.boot_disks.cost, "additions_total": a.cost,
            "total_with_additions": None if a.cost is None else b.total + a.cost, "additions_status": status,
            "additions": {**a.to_dict(), "status": status}}


def _addition_notes(extra: RunAdditions | None) -> list[str]:
    if extra is None:
        return []
    notes = [ADDITIONS_NOTE]
    if extra.additions is None:
        return notes + [f"additions {extra.status}"]
    if extra.status == AS_GCP:
        notes.append("additions of a spec run locally: the external addresses and boot disks a gcp run of the spec "
                     "would have (its gcp.public_ips, gcp.boot_disk_gb and gcp.boot_disk_type, or their defaults).")
    for x in extra.additions.items:
        notes += ([f"{x.name} not priced: {x.unpriced}"] if x.unpriced else []) + [f"{x.name}: {n}" for n in x.notes]
    return notes


def cost_row(label: str, usage: RunUsage, b: CostBreakdown, catalog: Catalog,
             comparison: Comparison | None = None, cache: dict | None = None,
             additions: RunAdditions | None = None) -> dict:
    """One configuration or run as a flat record of plain numbers (what json and csv print).

    service_provisioning / trainer_provisioning say which of the catalog's prices each part was
    charged at: 'standard' (on-demand) or 'spot'; the service's is None when there is no service.
    `cache` is a run's autocache cache (orchestrator.pricing.cache_storage), priced apart from the total.
    `additions` are what the run's external IPv4 addresses and boot disks cost (orchestrator.pricing.run_additions):
    additions to Equation 1, in their own columns beside its total, never in it. price_sources says where each
    price used comes from (its catalog entry's source and date).
    """
    d = b.to_dict()
    cache = cache or {}
    sources = _price_sources(usage, b, catalog, additions)
    own = [f"price source, {s.text()}" for s in sources if s.own]
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
        **_addition_columns(b, additions),
        "per_1000_batches": d["per_1000_batches"],
        "speedup": comparison.speedup if comparison else None,
        "cost_saving": comparison.cost_saving if comparison else None,
        "cache_storage_kind": cache.get("kind"),
        "cache_gb": cache.get("gb"),
        "cache_per_month": cache.get("per_month"),
        "cache_during_job": cache.get("during_job"),
        "cache": cache or None,
        "price_sources": [x.to_dict() for x in sources],
        "notes": list(b.notes) + ([CACHE_NOTE] if cache else []) + _addition_notes(additions) + own,
    }


def _money(v: float | None, places: int = 2) -> str:
    """To the cent (or `places`) for real sums; tiny sums (short local runs) in plain decimals, three significant
    digits."""
    return usd(v, places)


def unpriced_row(label: str, reason: str) -> dict:
    """A run that cannot be priced (a machine type no catalog knows, a record this dsctl cannot read): its row says
    so, and the others are priced as usual."""
    row: dict = {k: None for k in FIELDS}
    return {**row, "label": label, "not_priced": reason, "price_sources": [], "notes": [], "cache": None,
            "additions": None}


def _display(row: dict) -> list[tuple[str, str]]:
    """Human-readable (name, value) pairs for table and markdown output."""
    if row.get("not_priced"):
        return [("basis", "-"), ("prices", "-"), ("priced as", "-"), ("job time", "-"), ("batches", "-"),
                ("total", "not priced (below)")]
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
        *_addition_pairs(row),
        ("per 1,000 batches", _money(row["per_1000_batches"], 4)),
    ]
    if any(row[k] is not None for k in ("speedup", "cost_saving")):
        pairs += [("speedup", f"{row['speedup']:.2f}x"), ("cost saving", f"{row['cost_saving']:.2f}x")]
    if row.get("cache"):  # last: rows without a cache show "-" there
        pairs.append(("cache", cache_text(row["cache"], row["prices"])))
    return pairs


def _addition_pairs(row: dict) -> list[tuple[str, str]]:
    """The + rows beside Equation 1's total: each addition's cost (and what), or why it is not known."""
    a, status = row.get("additions"), row.get("additions_status")
    if a is None:
        shown = "-" if status is None else ("not recorded" if status.startswith("not recorded") else status)
        return [("+ external IPv4", shown), ("+ boot disks", shown), ("total with additions", "-")]

    def one(x: dict) -> str:
        if x["cost"] is None:
            return "not priced"
        return f"{_money(x['cost'])} ({x['quantity']})"

    return [("+ external IPv4", one(a["external_ipv4"])), ("+ boot disks", one(a["boot_disks"])),
            ("total with additions", _money(row["total_with_additions"]))]


def _notes(rows: list[dict]) -> list[str]:
    seen: list[str] = []
    for row in rows:
        seen += [n for n in row["notes"] if n not in seen]
    return seen


def _csv_value(key: str, value):
    if key == "notes":
        return " | ".join(value)
    if key == "price_sources":
        return " | ".join(f"{x['price']}: {x['source']} ({x['date']})" for x in value)
    return "" if value is None else value


def render(rows: list[dict], fmt: str, title: str = "", verbose: bool = True) -> str | None:
    """json/csv/markdown as text (full precision for json and csv, every note); table: None, print with print_table.
    Markdown lists its notes when `verbose`, else says how many there are."""
    if fmt == "json":
        return json.dumps(strict_json(rows), indent=2, allow_nan=False)
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=FIELDS, lineterminator="\n")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _csv_value(k, v) for k, v in row.items() if k in FIELDS})
        return out.getvalue().rstrip("\n")
    if fmt == "markdown":
        shown = [_display(r) for r in rows]
        lines = [f"**{title}**", ""] if title else []
        lines += ["| | " + " | ".join(r["label"] for r in rows) + " |", "|---|" + "---|" * len(rows)]
        longest = max(shown, key=len)  # the row with the most names (speedup and cache are not in every row)
        for name, _ in longest:
            lines.append(f"| {name} | " + " | ".join(dict(s).get(name, "-") for s in shown) + " |")
        lines += [""] + [f"- {r['label']}: not priced: {r['not_priced']}" for r in rows if r.get("not_priced")]
        lines += [f"- {n}" for n in _notes(rows)] if verbose else [f"- {_notes_hidden(rows)}"] if _notes(rows) else []
        return "\n".join(lines).rstrip("\n")
    return None


def _notes_hidden(rows: list[dict]) -> str:
    n = len(_notes(rows))
    return f"{n} note{'' if n == 1 else 's'} on how this was priced (price sources, additions): --verbose shows them."


def print_table(rows: list[dict], title: str, verbose: bool = False, width: int | None = None) -> None:
    """One column per run, each run's id whole: runs that do not fit the terminal's width go on to a table of their
    own. Runs that could not be priced are said below, then the notes (or how many there are, without --verbose)."""
    from rich.console import Console
    from rich.markup import escape

    console = Console(width=width) if width else Console()
    shown = [_display(r) for r in rows]
    names = max(shown, key=len)
    name_width = max(len(n) for n, _ in names) + 3
    need = [max([len(r["label"]), *(len(v) for _, v in s)]) + 3 for r, s in zip(rows, shown)]
    groups: list[list[int]] = [[]]
    used = name_width + 1
    for i, w in enumerate(need):
        if groups[-1] and used + w > console.width:
            groups.append([])
            used = name_width + 1
        groups[-1].append(i)
        used += w
    for n, group in enumerate(groups, 1):
        part = f" [{n} of {len(groups)}]" if len(groups) > 1 else ""
        if len(group) == 1 and name_width + need[group[0]] + 1 > console.width:  # even alone it is too wide
            console.print(_run_table(rows[group[0]], shown[group[0]], names, title, part))
        else:
            console.print(_table([rows[i] for i in group], [shown[i] for i in group], names, title, part))
    for row in rows:
        if row.get("not_priced"):
            console.print(f"{row['label']}: not priced: {escape(row['not_priced'])}", highlight=False, soft_wrap=True)
    if not verbose and _notes(rows):
        console.print(_notes_hidden(rows), highlight=False)
        return
    for note in _notes(rows):  # catalog sources are the user's text: [brackets] in them are not markup
        console.print(f"note: {escape(note)}", highlight=False, soft_wrap=True)


def _run_table(row: dict, shown: list[tuple[str, str]], names: list[tuple[str, str]], title: str, part: str):
    """One run too wide to stand beside the names (a long run id, a narrow terminal): its id above, its values
    below the names."""
    from rich.markup import escape
    from rich.table import Table

    head, _, _ = title.partition(" (")
    table = Table(title=f"{head}{part}: {row['label']}", title_justify="left", show_header=False)
    table.add_column("", no_wrap=True)
    table.add_column("", justify="right")
    values = dict(shown)
    for name, _ in names:
        table.add_row(name, escape(values.get(name, "-")), style="bold" if name in ("total", "cost saving") else None)
    return table


def _table(rows: list[dict], shown: list[list[tuple[str, str]]], names: list[tuple[str, str]], title: str, part: str):
    from rich.markup import escape
    from rich.table import Table

    head, _, tail = title.partition(" (")
    table = Table(title=head + part, caption=("(" + tail) if tail else None)
    table.add_column("", no_wrap=True)
    for row in rows:
        table.add_column(row["label"], justify="right", no_wrap=True, min_width=len(row["label"]))
    for name, _ in names:
        emphasis = name in ("total", "cost saving")
        table.add_row(name, *(escape(dict(s).get(name, "-")) for s in shown), style="bold" if emphasis else None)
    return table


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
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Also print the notes on how it was priced (price "
                                                                "sources, additions); json and csv always have them."),
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

    def extra(u: RunUsage) -> RunAdditions:  # what the spec creates besides its machines, over the job's time
        created = created_from_spec(spec, workers=u.n_workers)
        return RunAdditions(AS_GCP if local else "from the spec",
                            price_additions(created, catalog, u.job_time_s), created)

    if compare_colocated is None:
        rows = [cost_row("with service" if usage.n_workers else "colocated", usage, run, catalog,
                         additions=extra(usage))]
    else:
        base = estimate(spec, catalog, batches_per_sec=compare_colocated, steps=run.batches, basis=basis, workers=0,
                        stand_in=local)
        base_usage = usage_from_spec(spec, job_time_s=base.job_time_s, batches=base.batches, workers=0)
        rows = [cost_row("colocated", base_usage, base, catalog, additions=extra(base_usage)),
                cost_row("with service", usage, run, catalog, compare(base, run), additions=extra(usage))]
    priced_as = describe_provisioning(spec.service.provisioning if usage.n_workers else None, spec.trainer.provisioning)
    title = (f"Cost estimate: {spec.name} ({basis} basis, prices {catalog.name} of {catalog.date}, {catalog.currency}; "
             f"{priced_as})")
    text = render(rows, fmt, title, verbose)
    if text is None:
        print_table(rows, title, verbose)
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
            record = store.find(run_id)
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
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Also print the notes on how each run was priced "
                                                                "(price sources, additions); json and csv always "
                                                                "have them."),
) -> None:
    """Price recorded runs with Equation 1: each part's cost, the total and the cost per 1,000 batches; beside the
    total, what the run's external IPv4 addresses and boot disks cost (additions, not in Equation 1)."""
    from dsctl.orchestrator.pricing import cache_storage, price_record, run_additions
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
        try:
            usage, breakdown, used_catalog = price_record(record, catalog, basis)
        except SpecError as exc:  # this run only: the others are priced, and this one says why not
            rows.append(unpriced_row(record.id, exc.message))
            continue
        except ValueError as exc:  # a record this dsctl cannot read (its spec, written by another version)
            rows.append(unpriced_row(record.id, f"its record cannot be read by this dsctl: {' '.join(str(exc).split())}"))
            continue
        comparison = compare(base, breakdown) if base is not None else None
        row = cost_row(record.id, usage, breakdown, used_catalog, comparison, cache_storage(record, used_catalog),
                       run_additions(record, usage, used_catalog))
        rows.append(row)
    title = f"Cost report: {len(rows)} run(s)" + (f" against baseline {baseline}" if baseline else "")
    text = render(rows, fmt, title, verbose)
    if text is None:
        print_table(rows, title + " (Equation 1 of the tf.data service paper)", verbose)
    else:
        typer.echo(text)
