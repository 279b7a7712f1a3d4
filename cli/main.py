"""The `dsctl` command line: parse arguments, call one orchestrator function, render the result."""

from __future__ import annotations

import os
import shlex
import time
from pathlib import Path
from typing import cast

import typer
from rich.markup import escape

from dsctl.errors import EXIT_BAD_INPUT, stop_on_signals
from dsctl.orchestrator.preflight import load_job
from dsctl.specs.schema import MAX_WORKERS

from .check import check
from .cost import cost_app
from .errors import err_console, fail, run_app
from .experiments import experiments_app
from .live import LiveView
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
    autoscale: str | None = typer.Option(None, "--autoscale", help="scale workers while it runs: cachew | cpu"),
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
    from dsctl.specs.schema import MODES, Mode

    if mode not in MODES:
        fail(f"--mode must be one of {', '.join(MODES)}, got '{mode}'.", EXIT_BAD_INPUT)
    run_mode = cast(Mode, mode)
    if autoscale is not None and autoscale not in ("cachew", "cpu"):
        fail(f"--autoscale must be cachew or cpu, got '{autoscale}'.", EXIT_BAD_INPUT)
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
            print_json(result.latest)
            return
        rid = result.run_id
        assert result.max_duration_s is not None, "a handed-off run has a time limit"
        console.print(f"run {rid} is training on the cloud, supervised by one of its own machines; this machine is no "
                      f"longer needed. It tears itself down when the job ends or fails, or after "
                      f"{result.max_duration_s / 3600:g} h (gcp.max_duration_s). Follow it with `dsctl logs {rid} "
                      f"--follow`, see it with `dsctl runs show {rid}`, stop it with `dsctl down {rid}` (from any "
                      "machine: add --project P --zone Z).")
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
    from dsctl.orchestrator.deployments import rebuilt_from, status_rows

    view = status_rows()
    rows = view.rows + view.tensorboards
    if json_out:
        print_json(rows)
        return
    if not rows:
        console.print("nothing is up.")
        return
    for d in view.unreadable:
        err_console.print(f"{d.run_id}: its state file ({d.run_dir}/state.json) cannot be read; {rebuilt_from(d)}. "
                          "`dsctl down` stops what was rebuilt, and nothing else. If it ran "
                          f"on Google Cloud, `dsctl down {d.run_id} --project P --zone Z` finds its VMs by label.")
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
def down(
    run: str | None = typer.Argument(None, help="run id (or a unique prefix), a sweep's point, or a TensorBoard's id "
                                                "(`dsctl status`); default: the only thing up"),
    all_: bool = typer.Option(False, "--all", help="take down every deployment that is up, and stop every TensorBoard"),
    project: str | None = typer.Option(None, "--project", help="Google Cloud project to search when RUN has no local state"),
    zone: str | None = typer.Option(None, "--zone", help="Google Cloud zone to search when RUN has no local state"),
    bucket: str | None = typer.Option(None, "--bucket", help="its staging bucket, if not <project>-dsctl (no local state)"),
) -> None:
    """Stop and remove everything a run started, even if `dsctl up` was killed or its state is gone; record how it
    ended from what its trainers wrote."""
    from dsctl.orchestrator.deployments import Where
    from dsctl.orchestrator.deployments import down as take_down

    take_down(run, all_, Where(project, zone, bucket), say=lambda line: console.print(line, markup=False,
                                                                                       highlight=False))


@runs_app.callback()
def runs(ctx: typer.Context, limit: int = typer.Option(20, "--limit", "-n"),
         json_out: bool = typer.Option(False, "--json")) -> None:
    """List recorded runs, newest first."""
    if ctx.invoked_subcommand:
        return
    from dsctl.orchestrator.store import RunStore

    records = RunStore().list(limit=limit)
    if json_out:
        print_json([r.as_dict() for r in records])
    elif not records:
        console.print("no runs recorded yet; `dsctl up specs/examples/quickstart.yaml` makes one.")
    else:
        console.print(runs_table(records))


@runs_app.command("show")
def runs_show(
    run: str = typer.Argument(..., help="run id or unique prefix"),
    json_out: bool = typer.Option(False, "--json"),
    timeline: bool = typer.Option(False, "--timeline", help="plot workers and batch time over time (PNG)"),
    out: Path | None = typer.Option(None, "--out", help="where --timeline writes its PNG (default: the run dir)"),
    project: str | None = typer.Option(None, "--project", help="read a cloud-supervised run's record from this project"),
    bucket: str | None = typer.Option(None, "--bucket", help="... and bucket, if not <project>-dsctl"),
) -> None:
    """One run: its summary, events and per-window metrics; --timeline plots them."""
    from dsctl.orchestrator.deployments import Where, sync_record
    from dsctl.orchestrator.store import RunStore

    store = RunStore()
    sync_record(store, run, Where(project=project, bucket=bucket))
    record = store.find(run)
    if record is None:
        from dsctl.specs import SpecError

        raise SpecError(f"no run '{run}' is recorded; `dsctl runs` lists the recorded ones.")
    if timeline:
        _timeline(store, record, out)
    resumed_by = store.resumed_by(record.id)
    if json_out:
        print_json({**record.as_dict(), "resumed_by": resumed_by, "windows": store.windows(record.id),
                    "events": store.events(record.id)})
        return
    table = sweep_table(record) if record.kind == "sweep" else summary_table(record, resumed_by)
    if record.summary.get("summary_source") == "windows":
        rebuilt = record.summary.get("rebuilt_trainers")
        if rebuilt and len(rebuilt) < record.trainers:
            names = ", ".join(map(str, rebuilt))
            table.add_row("summary", f"rebuilt from the run's stored metrics windows for trainer(s) {names}: their own "
                                     "end records are missing (the others' are their own)")
        else:
            table.add_row("summary", "rebuilt from the run's stored metrics windows: its trainers' own end records "
                                     "are missing (the run ended abnormally)")
    if record.summary.get("recorded_by") and record.kind != "sweep":
        table.add_row("recorded", record.summary["recorded_by"])
    console.print(table)
    for e in store.events(record.id):
        console.print(f"  {time.strftime('%H:%M:%S', time.localtime(e['t']))} {e['kind']}: {e['message']}")


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
def logs(
    run: str = typer.Argument(..., help="run id or unique prefix"),
    follow: bool = typer.Option(False, "--follow", "-f", help="keep printing until the run ends"),
    project: str | None = typer.Option(None, "--project", help="read a cloud-supervised run's record from this project"),
    bucket: str | None = typer.Option(None, "--bucket", help="... and bucket, if not <project>-dsctl"),
    interval: float = typer.Option(2.0, "--interval", min=0.2, max=600, help="seconds between looks with --follow"),
    output: bool = typer.Option(True, "--output/--events-only", help="also print what the trainers printed (their "
                                                                     "stdout and stderr: your command's output)"),
) -> None:
    """A run's events (workers restarted, VMs stopped, outages, scaling) and what its trainers printed; --follow until
    it ends."""
    from dsctl.orchestrator.deployments import Where, record_objects, sync_record
    from dsctl.orchestrator.store import RunRecord, RunStore
    from dsctl.orchestrator.tail import OutputTail, trainer_outputs
    from dsctl.specs import SpecError

    store = RunStore()
    where = Where(project=project, bucket=bucket)
    shown: set[tuple] = set()
    outputs: dict[Path, OutputTail] = {}

    def show() -> RunRecord:
        sync_record(store, run, where)
        record = store.find(run)
        if record is None:
            raise SpecError(f"no run '{run}' is recorded; `dsctl runs` lists the recorded ones (a run supervised on "
                            "Google Cloud from another machine: add --project P).")
        for e in store.events(record.id):
            key = (e["t"], e["kind"], e["message"])
            if key not in shown:
                shown.add(key)
                console.print(f"{time.strftime('%H:%M:%S', time.localtime(e['t']))} {e['kind']}: {e['message']}",
                              markup=False, highlight=False)
        if output and record.run_dir:
            # Streamed as read, written as is; a last line with no newline waits only while the run may add to it.
            complete = not follow or record.status != "running"
            for path in trainer_outputs(record.run_dir):
                tail = outputs.setdefault(path, OutputTail(path))
                for line in tail.read(final=complete):
                    write_line(f"{tail.label} | {line}")
        return record

    record = show()
    objects, _ = record_objects(record.id, where) if follow else (None, None)
    if objects is not None:
        _follow_cloud(objects, record, shown, interval)
        record = show()  # the whole record, once it has ended
    while follow and objects is None and record.status == "running":
        time.sleep(interval)
        record = show()
    if follow:
        console.print(f"run {record.id} {record.status}" + (f": {record.error}" if record.error else ""),
                      markup=False, highlight=False)


def _follow_cloud(objects, record, shown: set, interval: float) -> None:
    """Follow a supervised run by its latest.json alone: the same few kilobytes a look, whatever its size."""
    from dsctl.orchestrator import cloudrecord, cloudruns

    progress = None
    while True:
        latest = cloudrecord.read_latest(objects) or {}
        for e in latest.get("events", []):
            key = (e["t"], e["kind"], e["message"])
            if key not in shown:
                shown.add(key)
                console.print(f"{time.strftime('%H:%M:%S', time.localtime(e['t']))} {e['kind']}: {e['message']}",
                              markup=False, highlight=False)
        p = latest.get("progress") or {}
        if p.get("batches") and (p.get("batches"), p.get("phase")) != progress:
            progress = (p.get("batches"), p.get("phase"))
            rate = f", {p['batches_per_s']:.2f} batches/s" if p.get("batches_per_s") else ""
            console.print(f"... {p.get('phase')}: {p['batches']} batches{rate}, {p.get('workers')} worker(s)",
                          markup=False, highlight=False)
        if cloudruns.ended(latest):
            return
        time.sleep(interval)


def _timeline(store, record, out: Path | None) -> None:
    from dsctl.orchestrator.timeline import plot_timeline, scaling_changes

    windows = store.windows(record.id)
    if not windows:
        from dsctl.specs import SpecError

        raise SpecError(f"run {record.id} has no metrics windows to plot.")
    path = plot_timeline(windows, out or Path(record.run_dir or ".") / "timeline.png",
                         f"run {record.id}: workers and batch time")
    console.print(f"timeline: {path} ({len(windows)} windows, {len(scaling_changes(windows))} change(s) of worker count)")


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
