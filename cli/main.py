"""The `dsctl` command line: parse arguments, call one orchestrator function, render the result."""

from __future__ import annotations

import os
import shlex
import time
from pathlib import Path
from typing import TypeVar

import typer
from rich.markup import escape

from dsctl.errors import stop_on_signals
from dsctl.orchestrator.locate import Where
from dsctl.orchestrator.policies import POLICIES
from dsctl.orchestrator.preflight import load_job
from dsctl.orchestrator.records import CloudProgress, RunEvent
from dsctl.specs import UsageError
from dsctl.specs.schema import MAX_WORKERS, MODES

from .check import check
from .cost import cost_app
from .errors import err_console, run_app
from .experiments import experiments_app
from .live import LiveView
from .locate import locating, said
from .render import (
    console,
    job_length,
    print_json,
    resume_line,
    runs_table,
    status_table,
    summary_table,
    sweep_table,
    write_line,
)
from .sweep import sweep
from .tensorboard import tensorboard

app = typer.Typer(
    name="dsctl",
    help="Run TensorFlow's tf.data service for training jobs from YAML specs: provision, measure, price, tear down.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
runs_app = typer.Typer(help="Recorded runs.", no_args_is_help=False, invoke_without_command=True)
app.add_typer(runs_app, name="runs")
app.add_typer(cost_app, name="cost")
app.add_typer(experiments_app, name="experiments")
app.command("sweep")(sweep)
app.command("check")(check)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        console.print(f"dsctl {version('dsctl')}")
        raise typer.Exit()


@app.callback()
def _main(version: bool = typer.Option(False, "--version", "-V", callback=_version, is_eager=True,
                                       help="print dsctl's version and exit")) -> None:
    """Run TensorFlow's tf.data service for training jobs from YAML specs: provision, measure, price, tear down."""


@app.command()
def validate(spec: Path = typer.Argument(..., metavar="JOB.yaml", help="job spec YAML")) -> None:
    """Check a job spec (schema, cross-field rules, and that user entrypoints import) without running anything."""
    loaded = load_job(spec)  # entrypoints are imported and checked in a child process
    s = loaded.spec
    trains = f"command `{shlex.join(s.trainer.command)}`" if s.trainer.command else f"model {s.trainer.model.kind}"
    warn(loaded.warnings)
    console.print(f"{spec}: ok — job '{s.name}', {s.service.workers} worker(s), {s.trainer.count} trainer(s) "
                  f"({trains}), pipeline {s.pipeline.builtin or s.pipeline.entrypoint}, provider {s.provider}; "
                  f"{job_length(loaded)}", markup=False, highlight=False)


C = TypeVar("C", bound=str)


def choice(value: str, allowed: tuple[C, ...], option: str) -> C:
    """`value` if it is one of `allowed`, else a usage error naming the option and the choices."""
    for known in allowed:
        if value == known:
            return known
    raise UsageError(f"{option} must be one of {', '.join(allowed)}, got '{value}'.")


def warn(warnings) -> None:
    """What a spec's run should be told (SpecErrors not raised: file, line, field), one 'warning:' each."""
    for w in warnings:
        err_console.print(f"[bold yellow]warning:[/] {escape(w.render())}")


class _Talk:
    """How `dsctl up` talks to the user (orchestrator/up.py Conversation): lines on stdout (stderr with --json),
    questions on the terminal, and a live view that starts with the run's first progress."""

    def __init__(self, json_out: bool):
        self.json_out = json_out
        self.out = err_console if json_out else console
        self.view: LiveView | None = None

    def resuming(self, resume, steps) -> None:
        self.out.print(resume_line(resume, steps), markup=False, highlight=False)

    def say(self, text: str) -> None:
        self.out.print(text, markup=False, highlight=False)

    def ask(self, question: str) -> bool:
        return typer.confirm(question)

    def progress(self, progress) -> None:
        if self.view is None:
            self.view = LiveView(enabled=not self.json_out).__enter__()
        self.view(progress)

    def close(self) -> None:
        if self.view is not None:
            self.view.__exit__(None, None, None)
            self.view = None


@app.command()
def up(
    spec: Path = typer.Argument(..., metavar="JOB.yaml", help="job spec YAML"),
    workers: int | None = typer.Option(None, "--workers", "-w", min=1, max=MAX_WORKERS, help="override service.workers"),
    mode: str = typer.Option("service", "--mode",
                             help="service | colocated (pipeline on the trainer) | ideal (input never stalls)"),
    detach: bool = typer.Option(False, "--detach", "-d",
                                help="leave the deployment running after the job (dsctl down removes it)"),
    json_out: bool = typer.Option(False, "--json", help="print the run record as JSON"),
    autoscale: str | None = typer.Option(None, "--autoscale", help=f"scale workers while it runs: {' | '.join(POLICIES)}"),
    dry_run: bool = typer.Option(False, "--dry-run", help="print the plan and its price; create nothing"),
    yes: bool = typer.Option(False, "--yes", "-y", help="create cloud machines without asking"),
    resume: str | None = typer.Option(None, "--resume", metavar="RUN",
                                         help="restore each trainer from RUN's latest checkpoint and train the steps left"),
    run_id: str | None = typer.Option(None, "--run-id", hidden=True),
    detached_child: bool = typer.Option(False, "--detached-child", hidden=True),
) -> None:
    """Provision the service, run the trainers, measure, record the run, tear everything down."""
    from dsctl.orchestrator.up import UpOptions
    from dsctl.orchestrator.up import up as run_up

    run_mode = choice(mode, MODES, "--mode")
    if autoscale is not None:
        choice(autoscale, tuple(POLICIES), "--autoscale")
    loaded = load_job(spec, autoscale=autoscale, workers=workers, mode=run_mode)
    warn(loaded.warnings)
    talk = _Talk(json_out)
    options = UpOptions(path=spec, workers=workers, mode=run_mode, detach=detach, autoscale=autoscale, dry_run=dry_run,
                        yes=yes, resume=resume, run_id=run_id, detached_child=detached_child)
    try:
        result = run_up(loaded, options, talk, on_sigterm=stop_on_signals)
    finally:
        talk.close()
    if result.outcome == "detached":
        console.print(f"started run {result.run_id} in the background; `dsctl status` shows it, `dsctl down "
                      f"{result.run_id}` removes it. Log: {result.log}")
    elif result.outcome == "handed-off":
        if json_out:
            print_json(result.latest.as_json() if result.latest is not None else {})
            return
        rid, limits = result.run_id, result.limits
        assert limits is not None, "a handed-off run has a time limit"
        elsewhere = f" (from any machine: add {said('down')})" if said("down") else ""
        console.print(f"run {rid} is training on the cloud, supervised by one of its own machines; this machine is no "
                      f"longer needed. It tears itself down when the job ends or fails, or after "
                      f"{limits.max_duration_s / 3600:g} h ({limits.max_duration_field}). Follow it with `dsctl logs "
                      f"{rid} --follow`, see it with `dsctl runs show {rid}`, stop it with `dsctl down {rid}`"
                      f"{elsewhere}.")
    elif result.outcome == "finished" and not detached_child:
        assert result.record is not None, "a finished run is recorded"
        if json_out:
            print_json(result.record.as_dict())
        else:
            console.print(summary_table(result.record))


@app.command(hidden=True)
def supervise(run_dir: Path = typer.Argument(..., help="the handed-over run's directory on this VM")) -> None:
    """Run a job handed over by `dsctl up --detach` to its end, on the cloud (orchestrator/supervise.py)."""
    from dsctl.orchestrator.supervise import supervise as run_supervised

    stop_on_signals()
    raise typer.Exit(run_supervised(run_dir))


@app.command()
def status(json_out: bool = typer.Option(False, "--json")) -> None:
    """Deployments that are up (or were left behind by a killed `dsctl up`), and TensorBoards serving."""
    from dsctl.orchestrator.deployments import rebuilt_from
    from dsctl.orchestrator.status import status_rows

    view = status_rows()
    rows = view.rows + view.tensorboards
    if json_out:
        print_json(rows)
        return
    if not rows:
        console.print("nothing is up.")
        return
    elsewhere = said("down")
    for d in view.unreadable:
        err_console.print(f"{d.run_id}: its state file ({d.run_dir}/state.json) cannot be read; {rebuilt_from(d)}. "
                          "`dsctl down` stops what was rebuilt, and nothing else."
                          + (f" If it ran elsewhere, `dsctl down {d.run_id} {elsewhere}` finds what it made there by "
                             "label." if elsewhere else ""))
    for m in view.unmonitored:
        err_console.print(f"{m['run']}: its monitor (the detached `dsctl up`, pid {m['pid']}) is gone, so nothing "
                          "supervises its service or records its run; its trainers' own metrics files say: "
                          f"{m['trainers_say']}. `dsctl down {m['run']}` stops what is left and records how it "
                          f"ended from those files. The monitor's log: {m['log']}", markup=False, highlight=False)
    for run, held in view.daemons:
        err_console.print(f"{run}: {len(held.others)} other process(es) in its cgroup ({held.container}), besides "
                          "dsctl's launcher, servers and trainers and what runs in their sessions (daemons they "
                          f"started): {'; '.join(held.others)}. `dsctl down {run}` ends them with the run.",
                          markup=False, highlight=False)
    for title, group in (("deployments", view.rows), ("tensorboard", view.tensorboards)):
        if group:
            console.print(status_table(title, group))


@app.command()
@locating("down")
def down(
    run: str | None = typer.Argument(None, help="run id (or a unique prefix), a sweep's point, or a TensorBoard's id "
                                                "(`dsctl status`); default: the only thing up"),
    all_: bool = typer.Option(False, "--all", help="take down every deployment that is up, and stop every TensorBoard"),
    where: Where = Where(),
) -> None:
    """Stop and remove everything a run started, even if `dsctl up` was killed or its state is gone; record how it
    ended from what its trainers wrote."""
    from dsctl.orchestrator.takedown import down as take_down

    take_down(run, all_, where, say=lambda line: console.print(line, markup=False, highlight=False))


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


@app.command()
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


app.command("tensorboard")(tensorboard)  # listed after the run commands


def main() -> None:
    """The `dsctl` entry point: Ctrl-C anywhere in here, the commands' own imports included, exits
    130 with one line and no traceback (cli.errors.interrupted)."""
    from .errors import interrupted

    try:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        run_app(app)
    except KeyboardInterrupt:
        interrupted()


if __name__ == "__main__":
    main()
