"""`dsctl cost ...`: parse the options, ask the orchestrator for the priced rows (orchestrator/costs.py), render them.

Nothing is priced here: the arithmetic is dsctl.costmodel, what is priced and how is orchestrator/costs.py. Bad options
are usage errors (one paragraph, exit 2).
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import typer

from dsctl.costmodel import BASES, describe_provisioning, provisioning_label
from dsctl.costmodel.money import usd
from dsctl.orchestrator.costs import CostRow, CostTable, estimate_costs, report_costs
from dsctl.specs import UsageError
from dsctl.specs.schema import MAX_DURATION_S, MAX_STEPS, MAX_WORKERS

from .render import cache_text, strict_json

FORMATS = ("table", "json", "csv", "markdown")

cost_app = typer.Typer(help="Price training jobs with the tf.data service paper's cost model (Equation 1).",
                       no_args_is_help=True)


@cost_app.callback()
def _cost() -> None:
    """Price training jobs with the tf.data service paper's cost model (Equation 1)."""


def _money(v: float | None, places: int = 2) -> str:
    """To the cent (or `places`) for real sums; tiny sums (short local runs) in plain decimals, three significant
    digits."""
    return usd(v, places)


def _display(row: CostRow, addition_names: list[str]) -> list[tuple[str, str]]:
    """Human-readable (name, value) pairs for table and markdown output; `addition_names`: every extra of the rows
    shown, so a row whose additions are not known says why under each."""
    if row.not_priced is not None:
        return [("basis", "-"), ("prices", "-"), ("priced as", "-"), ("job time", "-"), ("batches", "-"),
                ("total", "not priced (below)")]
    assert row.job_time_s is not None, "a priced row has its job time"
    c = row.costs
    svc, trn = provisioning_label(row.service_provisioning), provisioning_label(row.trainer_provisioning)
    workers = f"{row.n_workers} x {row.worker_machine} ({svc})" if row.n_workers else "none (colocated)"
    dispatcher = f"1 x {row.dispatcher_machine} ({svc})" if row.dispatcher_machine else "none"
    pairs = [
        ("basis", row.basis or "-"),
        ("prices", row.prices or "-"),
        ("priced as", describe_provisioning(row.service_provisioning, row.trainer_provisioning)),
        ("job time", f"{row.job_time_s / 3600:,.2f} h ({row.job_time_s:,.0f} s)"),
        ("batches", "-" if row.batches is None else f"{row.batches:,.0f}"),
        ("workers", workers),
        ("dispatcher", dispatcher),
        ("trainers", f"{row.n_trainers} x {row.trainer_machine} ({trn})"),
        ("workers cost", _money(c.get("workers"))),
        ("dispatcher cost", _money(c.get("dispatcher"))),
        ("trainer CPU", _money(c.get("trainer_cpu"))),
        ("trainer memory", _money(c.get("trainer_memory"))),
        ("accelerators", _money(c.get("accelerators"))),
        ("service", _money(c.get("service"))),
        *_preprocessing_pairs(row),
        ("total", _money(row.total)),
        *_addition_pairs(row, addition_names),
        ("per 1,000 batches", _money(row.per_1000_batches, 4)),
    ]
    if row.speedup is not None and row.cost_saving is not None:
        pairs += [("speedup", f"{row.speedup:.2f}x"), ("cost saving", f"{row.cost_saving:.2f}x")]
    if row.cache is not None:  # last: rows without a cache show "-" there
        pairs.append(("cache", cache_text(row.cache, row.prices or "the catalog")))
    return pairs


def _preprocessing_pairs(row: CostRow) -> list[tuple[str, str]]:
    """Hybrid placement: the pipeline's cost by where it ran; local is inside the trainers' cost, not added."""
    if not row.local_workers:
        return []
    local = row.costs.get("local_preprocessing")
    return [("local workers", f"{row.local_workers} per trainer, on the trainer hosts"),
            ("remote preprocessing", _money(row.costs.get("remote_preprocessing"))),
            ("local preprocessing", ("not priced" if local is None else f"{_money(local)} (in trainer CPU, not added)")
             + f"; CPU {(row.local_cpu_source or 'not known').split(':')[0]}")]


def _addition_names(rows: list[CostRow]) -> list[str]:
    """The extras of the rows, by the names they are shown with, in the order first met."""
    return list(dict.fromkeys(x["name"] for r in rows if r.additions for x in _additions(r)))


def _additions(row: CostRow) -> list[dict[str, Any]]:
    """A row's extras as priced (Additions.to_dict's entries)."""
    return [v for v in (row.additions or {}).values() if isinstance(v, dict) and "quantity" in v]


def _addition_pairs(row: CostRow, names: list[str]) -> list[tuple[str, str]]:
    """The + rows beside Equation 1's total: each addition's cost (and what), or why it is not known."""
    if row.additions is None:
        status = row.additions_status
        shown = "-" if status is None else ("not recorded" if status.startswith("not recorded") else status)
        return [*((f"+ {name}", shown) for name in names or ["additions"]), ("total with additions", "-")]

    def one(x: dict[str, Any]) -> str:
        if x["cost"] is None:
            return "not priced"
        return f"{_money(x['cost'])} ({x['quantity']})"

    return [*((f"+ {x['name']}", one(x)) for x in _additions(row)),
            ("total with additions", _money(row.total_with_additions))]


def _csv_value(key: str, value: Any) -> Any:
    if key == "notes":
        return " | ".join(value)
    if key == "price_sources":
        return " | ".join(f"{x['price']}: {x['source']} ({x['date']})" for x in value)
    return "" if value is None else value


def render(table: CostTable, fmt: str, verbose: bool = True) -> str | None:
    """json/csv/markdown as text (full precision for json and csv, every note); table: None, print with print_table.
    Markdown lists its notes when `verbose`, else says how many there are."""
    rows = table.rows
    if fmt == "json":
        return json.dumps(strict_json(table.as_json()), indent=2, allow_nan=False)
    if fmt == "csv":
        out = io.StringIO()
        columns = table.columns
        writer = csv.DictWriter(out, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        for row in table.as_json():
            writer.writerow({k: _csv_value(k, v) for k, v in row.items() if k in columns})
        return out.getvalue().rstrip("\n")
    if fmt == "markdown":
        names = _addition_names(rows)
        shown = [_display(r, names) for r in rows]
        lines = [f"**{table.title}**", ""] if table.title else []
        lines += ["| | " + " | ".join(r.label for r in rows) + " |", "|---|" + "---|" * len(rows)]
        longest = max(shown, key=len)  # the row with the most names (speedup and cache are not in every row)
        for name, _ in longest:
            lines.append(f"| {name} | " + " | ".join(dict(s).get(name, "-") for s in shown) + " |")
        lines += [""] + [f"- {r.label}: not priced: {r.not_priced}" for r in rows if r.not_priced is not None]
        notes = table.notes
        lines += [f"- {n}" for n in notes] if verbose else [f"- {_notes_hidden(notes)}"] if notes else []
        return "\n".join(lines).rstrip("\n")
    return None


def _notes_hidden(notes: list[str]) -> str:
    n = len(notes)
    return f"{n} note{'' if n == 1 else 's'} on how this was priced (price sources, additions): --verbose shows them."


def print_table(table: CostTable, title: str, verbose: bool = False, width: int | None = None) -> None:
    """One column per run, each run's id whole: runs that do not fit the terminal's width go on to a table of their
    own. Runs that could not be priced are said below, then the notes (or how many there are, without --verbose)."""
    from rich.console import Console
    from rich.markup import escape

    rows = table.rows
    console = Console(width=width) if width else Console()
    addition_names = _addition_names(rows)
    shown = [_display(r, addition_names) for r in rows]
    names = max(shown, key=len)
    name_width = max(len(n) for n, _ in names) + 3
    need = [max([len(r.label), *(len(v) for _, v in s)]) + 3 for r, s in zip(rows, shown)]
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
        if row.not_priced is not None:
            console.print(f"{row.label}: not priced: {escape(row.not_priced)}", highlight=False, soft_wrap=True)
    notes = table.notes
    if not verbose and notes:
        console.print(_notes_hidden(notes), highlight=False)
        return
    for note in notes:  # catalog sources are the user's text: [brackets] in them are not markup
        console.print(f"note: {escape(note)}", highlight=False, soft_wrap=True)


def _run_table(row: CostRow, shown: list[tuple[str, str]], names: list[tuple[str, str]], title: str, part: str):
    """One run too wide to stand beside the names (a long run id, a narrow terminal): its id above, its values
    below the names."""
    from rich.markup import escape
    from rich.table import Table

    head, _, _ = title.partition(" (")
    table = Table(title=f"{head}{part}: {row.label}", title_justify="left", show_header=False)
    table.add_column("", no_wrap=True)
    table.add_column("", justify="right")
    values = dict(shown)
    for name, _ in names:
        table.add_row(name, escape(values.get(name, "-")), style="bold" if name in ("total", "cost saving") else None)
    return table


def _table(rows: list[CostRow], shown: list[list[tuple[str, str]]], names: list[tuple[str, str]], title: str, part: str):
    from rich.markup import escape
    from rich.table import Table

    head, _, tail = title.partition(" (")
    table = Table(title=head + part, caption=("(" + tail) if tail else None)
    table.add_column("", no_wrap=True)
    for row in rows:
        table.add_column(row.label, justify="right", no_wrap=True, min_width=len(row.label))
    for name, _ in names:
        emphasis = name in ("total", "cost saving")
        table.add_row(name, *(escape(dict(s).get(name, "-")) for s in shown), style="bold" if emphasis else None)
    return table


def _choice(value: str, allowed: tuple[str, ...], option: str) -> str:
    if value not in allowed:
        raise UsageError(f"{option} must be one of {', '.join(allowed)}; got '{value}'.")
    return value


def _show(table: CostTable, fmt: str, verbose: bool, title: str | None = None) -> None:
    text = render(table, fmt, verbose)
    if text is None:
        print_table(table, title or table.title, verbose)
    else:
        typer.echo(text)


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
            raise UsageError(f"must be at most {int(most):,} (the bound a job spec has), got {value:g}.", field=option)
    table = estimate_costs(spec_path, batches_per_sec=batches_per_sec, steps=steps, hours=hours, basis=basis,
                           prices=prices, workers=workers, compare_colocated=compare_colocated)
    _show(table, fmt, verbose)


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
    total, what the run's extras (external IPv4 addresses and boot disks on Google Cloud) cost (additions, not in
    Equation 1)."""
    _choice(fmt, FORMATS, "--format")
    if basis is not None:
        _choice(basis, BASES, "--basis")
    table = report_costs(runs or [], last=last, all_=all_, since=since, basis=basis, prices=prices, baseline=baseline)
    _show(table, fmt, verbose, table.title + " (Equation 1 of the tf.data service paper)")
