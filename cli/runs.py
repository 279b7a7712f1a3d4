"""`dsctl runs`, `runs show`, `runs import` and `dsctl logs`: recorded runs, one run whole, and what a run said."""

from __future__ import annotations

import time
from pathlib import Path

import typer

from dsctl.orchestrator.locate import Where
from dsctl.orchestrator.records import CloudProgress, RunEvent

from .locate import locating
from .profile import show_recorded_profile
from .render import console, print_json, runs_table, summary_table, sweep_table, write_line

runs_app = typer.Typer(help="Recorded runs.", no_args_is_help=False, invoke_without_command=True)


@runs_app.callback()
def runs(ctx: typer.Context, limit: int = typer.Option(20, "--limit", "-n"),
         json_out: bool = typer.Option(False, "--json")) -> None:
    """List recorded runs, newest first."""
    if ctx.invoked_subcommand:
        return
    from dsctl.orchestrator.runs import list_runs

    records = list_runs(limit)
    if json_out:
        print_json([r.as_dict() for r in records])
    elif not records:
        console.print("no runs recorded yet; `dsctl up specs/examples/quickstart.yaml` makes one.")
    else:
        console.print(runs_table(records))


@runs_app.command("show")
@locating("record")
def runs_show(
    run: str = typer.Argument(..., help="run id or unique prefix"),
    json_out: bool = typer.Option(False, "--json"),
    timeline: bool = typer.Option(False, "--timeline", help="plot workers and batch time over time (PNG)"),
    out: Path | None = typer.Option(None, "--out", help="where --timeline writes its PNG (default: the run dir)"),
    where: Where = Where(),
) -> None:
    """One run: its summary, events and per-window metrics; --timeline plots them."""
    from dsctl.orchestrator.runs import show_run

    view = show_run(run, where, timeline=timeline, out=out)
    if view.timeline is not None:
        console.print(f"timeline: {view.timeline.path} ({view.timeline.windows} windows, {view.timeline.changes} "
                      "change(s) of worker count)")
    if json_out:
        print_json(view.as_json())
        return
    record = view.record
    if record.kind == "profile":  # a profile is its own table (cli/profile.py)
        show_recorded_profile(record)
        return
    table = sweep_table(record) if record.kind == "sweep" else summary_table(record, view.resumed_by, view.notes)
    console.print(table)
    for e in view.events:
        console.print(f"  {time.strftime('%H:%M:%S', time.localtime(e.t))} {e.kind}: {e.message}")


@runs_app.command("import")
def runs_import(run_dir: Path = typer.Argument(..., metavar="RUN_DIR", help="a run's folder (DSCTL_HOME/runs/<run id>)")
                ) -> None:
    """Add a run's record to runs.db from its folder: the copy `dsctl up` kept there when runs.db could not be made
    again, else rebuilt from the run's own files."""
    from dsctl.orchestrator.imports import import_run
    from dsctl.orchestrator.store import RunStore

    record, how = import_run(RunStore(), run_dir)
    console.print(f"run {record.id} ({record.status}) imported: {how}", markup=False, highlight=False)


@locating("record")
def logs(
    run: str = typer.Argument(..., help="run id or unique prefix"),
    follow: bool = typer.Option(False, "--follow", "-f", help="keep printing until the run ends"),
    interval: float = typer.Option(2.0, "--interval", min=0.2, max=600, help="seconds between looks with --follow"),
    output: bool = typer.Option(True, "--output/--events-only", help="also print what the trainers printed (their "
                                                                     "stdout and stderr: your command's output)"),
    where: Where = Where(),
) -> None:
    """A run's events (workers restarted, VMs stopped, outages, scaling) and what its trainers printed; --follow until
    it ends."""
    from dsctl.orchestrator.logs import show_logs

    def event(e: RunEvent) -> None:
        console.print(f"{time.strftime('%H:%M:%S', time.localtime(e.t))} {e.kind}: {e.message}", markup=False,
                      highlight=False)

    def progress(p: CloudProgress) -> None:
        rate = f", {p.batches_per_s:.2f} batches/s" if p.batches_per_s else ""
        console.print(f"... {p.phase}: {p.batches} batches{rate}, {p.workers} worker(s)", markup=False, highlight=False)

    record = show_logs(run, where, follow=follow, output=output, interval=interval, on_event=event, on_line=write_line,
                       on_progress=progress)
    if follow:
        console.print(f"run {record.id} {record.status}" + (f": {record.error}" if record.error else ""),
                      markup=False, highlight=False)
