"""`dsctl check PROVIDER [JOB.yaml]`: is a place ready for a run? The provider's checks, rendered."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from dsctl.errors import EXIT_BAD_INPUT
from dsctl.orchestrator.locate import Where
from dsctl.orchestrator.placecheck import check_place

from .locate import locating
from .render import console, print_json

MARKS = {"ok": "[green]ok[/]", "warn": "[yellow]warning[/]", "fail": "[bold red]FAIL[/]", "skip": "[dim]skipped[/]"}


@locating("check")
def check(
    provider: str = typer.Argument(..., metavar="PROVIDER", help="where runs would go: gcp"),
    spec: Path | None = typer.Argument(None, metavar="[JOB.yaml]",
                                       help="the job to check for (default: the provider's smallest example run)"),
    json_out: bool = typer.Option(False, "--json", help="the checks as JSON, for scripts"),
    where: Where = Where(),
) -> None:
    """Check a place before any run there: credentials, APIs, permissions, policies, network and quota, as `dsctl up`
    checks them before it creates anything (the same verdict); creates nothing. Exit 2 if a check failed."""
    loaded, results = check_place(provider, spec, where)
    failed = [r for r in results if r.status == "fail"]
    if json_out:
        print_json({"spec": str(loaded.source.path), "ok": not failed, "checks": [asdict(r) for r in results]})
    else:
        table = Table(show_header=True, header_style="bold", show_lines=True, expand=True)
        table.add_column("check", no_wrap=True)
        table.add_column("result", no_wrap=True)
        table.add_column("what was found, and the fix", ratio=1)
        for r in results:
            found = escape(r.detail) + (f"\n[dim]fix:[/] {escape(r.fix)}" if r.fix else "")
            table.add_row(r.name, MARKS[r.status], found)
        console.print(table)
        verdict = (f"[bold red]{len(failed)} check(s) failed[/]: `dsctl up` would refuse this run, at the first."
                   if failed else "[green]ready[/]: `dsctl up` would go ahead (warnings are said in its plan).")
        console.print(verdict)
    if failed:
        raise typer.Exit(EXIT_BAD_INPUT)
