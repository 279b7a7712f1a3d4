"""`dsctl experiments`: reproduce the papers' figures (list, run, report).

Mounted in cli/main.py with `app.add_typer(experiments_app, name="experiments")`.
"""

from __future__ import annotations

import signal
from pathlib import Path

import typer

from dsctl.errors import signum_of, stop_on_signals
from dsctl.orchestrator.outcome import Interrupted

from .errors import err_console
from .render import console, print_json

experiments_app = typer.Typer(
    help="Reproduce the papers' figures here: measure, predict, compare with the paper, plot.",
    no_args_is_help=True,
)

OUT_HELP = "directory for the CSV, PNGs, markdown and JSON (default: $DSCTL_HOME/experiments)"


@experiments_app.command("list")
def list_(json_out: bool = typer.Option(False, "--json", help="print the list as JSON")) -> None:
    """The experiments, one per reproduced figure."""
    from dsctl.experiments import REGISTRY, get

    rows = [{"name": n, "figure": get(n).TITLE, "what": get(n).SUMMARY} for n in REGISTRY]
    if json_out:
        print_json(rows)
        return
    from rich.table import Table

    t = Table(title="experiments (`dsctl experiments run NAME --quick` takes a few minutes each)", title_justify="left")
    for col in ("name", "figure", "what"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["name"], r["figure"], r["what"])
    console.print(t)


@experiments_app.command("run")
def run(
    name: str = typer.Argument(..., metavar="NAME", help="an experiment from `dsctl experiments list` (fig8 ... fig11), or all"),
    quick: bool = typer.Option(False, "--quick", help="shorter measurements and fewer points: a few minutes each"),
    out: Path | None = typer.Option(None, "--out", help=OUT_HELP),
    json_out: bool = typer.Option(False, "--json", help="print the results as JSON"),
) -> None:
    """Run one experiment (or all): its jobs on this machine, its predictions, its comparison with the paper."""
    from dsctl.experiments import REGISTRY, default_out_dir, get, run_experiment

    names = list(REGISTRY) if name == "all" else [name]
    for n in names:
        get(n)  # an unknown name is refused before anything runs
    out_dir = out or default_out_dir()

    def log(message: str) -> None:  # progress on stderr: stdout stays clean for --json
        err_console.print(message, markup=False)

    results = []
    # SIGTERM and SIGHUP end it as Ctrl-C does: every deployment stopped, each run recorded, exit 128 + the signal.
    stop_on_signals()
    try:
        for n in names:
            results.append(run_experiment(n, out_dir, quick=quick, log=log))
    except KeyboardInterrupt as exc:
        raise Interrupted(f"interrupted ({signal.Signals(signum_of(exc)).name}): every deployment the experiment "
                          "started has been stopped; the sections already finished are kept.", signum_of(exc)) from None
    if json_out:
        print_json(results[0].to_dict() if len(results) == 1 else [r.to_dict() for r in results])
        return
    for r in results:
        console.print(r.markdown, markup=False)
        console.print("")
        console.print(f"{r.name}: {r.duration_s:.0f} s; wrote {r.csv_path}, {r.md_path}, "
                      f"{len(r.plots)} plot(s) in {r.out_dir}", markup=False)
    console.print(f"`dsctl experiments report --out {out_dir}` puts every section on one page.", markup=False)


@experiments_app.command("report")
def report(out: Path | None = typer.Option(None, "--out", help="the directory the experiments ran into "
                                           "(default: $DSCTL_HOME/experiments); report.md goes there")) -> None:
    """One markdown page with every experiment's table and plots, ours beside the paper's."""
    from dsctl.experiments import default_out_dir, write_report

    path = write_report(out or default_out_dir())
    console.print(f"wrote {path}", markup=False)


if __name__ == "__main__":
    import os

    from .errors import run_app

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    run_app(experiments_app)
