"""The `dsctl` command line: parse arguments, call one orchestrator function, render the result."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import typer

from dsctl.specs import load_spec
from dsctl.specs.schema import MAX_WORKERS

from .cost import cost_app
from .experiments import experiments_app
from .sweep import sweep
from .tensorboard import tensorboard
from .errors import EXIT_BAD_INPUT, EXIT_INTERRUPTED, err_console, fail, run_app
from .live import LiveView
from .render import console, print_json, runs_table, summary_table, sweep_table

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

MODES = ("service", "colocated", "ideal")


def _sigterm_as_interrupt() -> None:
    """SIGTERM (e.g. from a job scheduler) tears down like Ctrl-C does."""
    def handler(signum, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, handler)


@app.command()
def validate(spec: Path = typer.Argument(..., metavar="JOB.yaml", help="job spec YAML")) -> None:
    """Check a job spec (schema, cross-field rules, and that user entrypoints import) without running anything."""
    from dsctl.orchestrator.preflight import check_autoscale

    loaded = load_spec(spec)  # entrypoints are imported and checked in a child process
    check_autoscale(loaded)
    s = loaded.spec
    trains = f"command `{shlex.join(s.trainer.command)}`" if s.trainer.command else f"model {s.trainer.model.kind}"
    console.print(f"{spec}: ok — job '{s.name}', {s.service.workers} worker(s), {s.trainer.count} trainer(s) "
                  f"({trains}), pipeline {s.pipeline.builtin or s.pipeline.entrypoint}, provider {s.provider}",
                  markup=False, highlight=False)


@app.command()
def up(
    spec: Path = typer.Argument(..., metavar="JOB.yaml", help="job spec YAML"),
    workers: Optional[int] = typer.Option(None, "--workers", "-w", min=1, max=MAX_WORKERS, help="override service.workers"),
    mode: str = typer.Option("service", "--mode", help="service | colocated (pipeline on the trainer) | ideal (input never stalls)"),
    detach: bool = typer.Option(False, "--detach", "-d", help="leave the deployment running after the job (dsctl down removes it)"),
    json_out: bool = typer.Option(False, "--json", help="print the run record as JSON"),
    autoscale: Optional[str] = typer.Option(None, "--autoscale", help="scale workers while it runs: cachew | cpu"),
    dry_run: bool = typer.Option(False, "--dry-run", help="print the plan and its price; create nothing"),
    yes: bool = typer.Option(False, "--yes", "-y", help="create cloud machines without asking"),
    resume: Optional[str] = typer.Option(None, "--resume", metavar="RUN",
                                         help="restore each trainer from RUN's latest checkpoint and train the steps left"),
    run_id: Optional[str] = typer.Option(None, "--run-id", hidden=True),
    detached_child: bool = typer.Option(False, "--detached-child", hidden=True),
) -> None:
    """Provision the service, run the trainers, measure, record the run, tear everything down."""
    from dsctl.orchestrator.preflight import check_autoscale
    from dsctl.orchestrator.run import JobRunner

    if mode not in MODES:
        fail(f"--mode must be one of {', '.join(MODES)}, got '{mode}'.", EXIT_BAD_INPUT)
    if autoscale is not None and autoscale not in ("cachew", "cpu"):
        fail(f"--autoscale must be cachew or cpu, got '{autoscale}'.", EXIT_BAD_INPUT)
    loaded = load_spec(spec)
    check_autoscale(loaded, autoscale)
    resumed = _resume_plan(loaded, resume, to_stderr=json_out) if resume else None
    if not _plan_approved(loaded, workers, dry_run=dry_run, yes=yes or detached_child):
        return
    if detach and not detached_child and loaded.spec.provider == "gcp":
        _hand_off(loaded, workers, mode, autoscale, json_out, resumed)
        return
    if detach and not detached_child:
        _detach(spec, workers, mode, autoscale, resume)
        return
    _sigterm_as_interrupt()
    runner = JobRunner(loaded, mode=mode, workers=workers, run_id=run_id, detached=detached_child, autoscale=autoscale,
                       resume=resumed)
    # On Google Cloud the job runs under a supervisor on its dispatcher VM, this process following it: a
    # lost connection or a closed laptop does not end it, and watching 640 workers costs this machine
    # what watching 8 does (orchestrator/supervise.py).
    supervised = loaded.spec.provider == "gcp" and mode == "service" and (
        loaded.spec.gcp is None or loaded.spec.gcp.supervisor == "vm")
    try:
        with LiveView(enabled=not json_out) as view:
            runner.listener = view
            if supervised:
                runner.hand_off(attached=True)
                runner.follow_hand_off()
            else:
                runner.run(keep_up=detached_child)
    except KeyboardInterrupt:
        err_console.print(f"interrupted: everything run {runner.run_id} started has been stopped; "
                          "what it measured is recorded (`dsctl runs show` has it).")
        raise typer.Exit(EXIT_INTERRUPTED)
    record = runner.store.get(runner.run_id)
    if detached_child:
        runner.supervise_until_stopped()
        return
    if json_out:
        print_json(record.as_dict())
    else:
        console.print(summary_table(record))


def _resume_plan(loaded, ref: str, *, to_stderr: bool):
    """--resume RUN: the checkpoints restored, said before the plan; one paragraph (exit 2) if it cannot be resumed."""
    from dsctl.orchestrator.resume import plan_resume
    from dsctl.orchestrator.store import RunStore

    from .render import resume_line

    resumed = plan_resume(RunStore(), ref, loaded)
    (err_console if to_stderr else console).print(resume_line(resumed, loaded.spec.trainer.steps), markup=False,
                                                  highlight=False)
    return resumed


def _plan_approved(loaded, workers: Optional[int], *, dry_run: bool, yes: bool) -> bool:
    """Show what a run would create and cost; on the cloud, ask before anything bills."""
    from dsctl.specs import SpecError

    spec = loaded.spec
    if spec.provider != "gcp":
        if dry_run:
            console.print(f"provider {spec.provider}: {workers or spec.service.workers} worker process(es), "
                          f"{spec.trainer.count} trainer(s) on this machine; nothing bills. Nothing was started.")
        return not dry_run
    from dsctl.provisioners.gcp import confirm_up, up_plan

    try:
        if dry_run:
            console.print(up_plan(spec, workers).render(), markup=False, highlight=False)
            console.print("dry run: nothing was created.")
            return False
        if not confirm_up(spec, workers, yes=yes, ask=typer.confirm,
                          echo=lambda text: console.print(text, markup=False, highlight=False)):
            console.print("nothing was created.")
            return False
    except SpecError as exc:
        raise loaded.locate(exc) from None
    return True


def _hand_off(loaded, workers: Optional[int], mode: str, autoscale: Optional[str], json_out: bool, resumed=None) -> None:
    """`dsctl up --detach` on Google Cloud: provision from here, hand the job to a supervisor on the dispatcher
    VM, and return once it trains; it tears everything down when the job ends (orchestrator/supervise.py)."""
    from dsctl.orchestrator.run import JobRunner

    if mode != "service":
        fail(f"--detach on Google Cloud runs the job through the service; --mode {mode} is measured attached.",
             EXIT_BAD_INPUT)
    if loaded.spec.gcp is not None and loaded.spec.gcp.supervisor != "vm":
        raise loaded.error(("gcp", "supervisor"), "a detached run is supervised by its dispatcher VM; with "
                                                  "gcp.supervisor: here, run it attached (without --detach).")
    _sigterm_as_interrupt()
    runner = JobRunner(loaded, mode=mode, workers=workers, autoscale=autoscale, resume=resumed)
    try:
        with LiveView(enabled=not json_out) as view:
            runner.listener = view
            latest = runner.hand_off()
    except KeyboardInterrupt:
        err_console.print(f"interrupted: everything run {runner.run_id} started has been deleted.")
        raise typer.Exit(EXIT_INTERRUPTED)
    rid = runner.run_id
    if json_out:
        print_json(latest)
        return
    limit = loaded.spec.gcp.max_duration_s / 3600 if loaded.spec.gcp else 24
    console.print(f"run {rid} is training on Google Cloud, supervised by its dispatcher VM; this machine is no "
                  f"longer needed. It tears itself down when the job ends or fails, or after {limit:g} h "
                  f"(gcp.max_duration_s). Follow it with `dsctl logs {rid} --follow`, see it with `dsctl runs show "
                  f"{rid}`, stop it with `dsctl down {rid}` (from any machine: add --project P --zone Z).")


@app.command(hidden=True)
def supervise(run_dir: Path = typer.Argument(..., help="the handed-over run's directory on this VM")) -> None:
    """Run a job handed over by `dsctl up --detach` to its end, on the cloud (orchestrator/supervise.py)."""
    from dsctl.orchestrator.supervise import supervise as run_supervised

    _sigterm_as_interrupt()
    raise typer.Exit(run_supervised(run_dir))


def _detach(spec: Path, workers: Optional[int], mode: str, autoscale: Optional[str], resume: Optional[str]) -> None:
    """Re-run `dsctl up` in its own session; it keeps supervising the service until `dsctl down`."""
    from dsctl.orchestrator.run import new_run_id
    from dsctl.orchestrator.store import dsctl_home

    loaded = load_spec(spec)
    run_id = new_run_id(loaded.spec.name)
    log = dsctl_home() / "runs" / run_id / "up.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    args = [sys.executable, "-m", "dsctl.cli.main", "up", str(spec), "--mode", mode, "--run-id", run_id, "--detached-child"]
    if workers:
        args += ["--workers", str(workers)]
    if autoscale:
        args += ["--autoscale", autoscale]
    if resume:
        args += ["--resume", resume]
    with open(log, "ab") as out:
        subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    console.print(f"started run {run_id} in the background; `dsctl status` shows it, `dsctl down {run_id}` removes it. Log: {log}")


@app.command()
def status(json_out: bool = typer.Option(False, "--json")) -> None:
    """Deployments that are up (or were left behind by a killed `dsctl up`)."""
    from dsctl.orchestrator import cloudruns
    from dsctl.orchestrator.deployments import UNREADABLE, active_deployments, live_nodes
    from dsctl.orchestrator.store import RunStore

    rows, deps = [], []
    for d in active_deployments():
        row = {"run": d.run_id, "provider": d.provider, "status": d.status, "dispatcher": d.dispatcher_address,
               "workers": len(d.by_role("worker")), "trainers": len(d.by_role("trainer")), "live_processes": live_nodes(d)}
        if cloudruns.supervised(d):
            # Seen through what its supervisor publishes; a run found ended is taken off this list.
            latest = cloudruns.refresh(RunStore(), d) or {}
            if cloudruns.ended(latest):
                continue
            p = latest.get("progress") or {}
            age = time.time() - latest["written_at"] if latest.get("written_at") else None
            row.update(status=f"supervised on the cloud: {p.get('phase', 'starting')}", workers=p.get("workers"),
                       batches=p.get("batches"), heard_from=None if age is None else f"{age:.0f} s ago",
                       live_processes="-")
        rows.append(row)
        deps.append(d)
    if json_out:
        print_json(rows)
        return
    if not rows:
        console.print("nothing is up.")
        return
    for d in deps:
        if d.status == UNREADABLE:
            err_console.print(f"{d.run_id}: its state file ({d.run_dir}/state.json) cannot be read; {len(d.nodes)} of "
                              "its processes were found by their command line, and `dsctl down` stops them. If it ran "
                              f"on Google Cloud, `dsctl down {d.run_id} --project P --zone Z` finds its VMs by label.")
    from rich.table import Table

    t = Table(title="deployments", title_justify="left")
    cols = list(dict.fromkeys(k for r in rows for k in r))
    for col in cols:
        t.add_column(col)
    for r in rows:
        t.add_row(*(str(r.get(c, "")) for c in cols))
    console.print(t)


@app.command()
def down(
    run: Optional[str] = typer.Argument(None, help="run id (or a unique prefix); default: the only deployment up"),
    all_: bool = typer.Option(False, "--all", help="take down every deployment that is up"),
    project: Optional[str] = typer.Option(None, "--project", help="Google Cloud project to search when RUN has no local state"),
    zone: Optional[str] = typer.Option(None, "--zone", help="Google Cloud zone to search when RUN has no local state"),
    bucket: Optional[str] = typer.Option(None, "--bucket", help="its staging bucket, if not <project>-dsctl (no local state)"),
) -> None:
    """Stop and remove everything a run started, even if `dsctl up` was killed or its state is gone."""
    from dsctl.orchestrator.deployments import UNREADABLE, active_deployments, find, take_down

    if run:
        dep = find(run)
        if dep is None:
            _down_by_label(run, project, zone, bucket)
            return
        targets = [dep]
    else:
        targets = active_deployments()
        if len(targets) > 1 and not all_:
            names = ", ".join(d.run_id for d in targets)
            fail(f"{len(targets)} deployments are up ({names}); name one with `dsctl down RUN` or use --all.", EXIT_BAD_INPUT)
    if not targets:
        console.print("nothing is up.")
        return
    for dep in targets:
        take_down(dep)
        found = f" ({len(dep.nodes)} process(es) found by command line: its state file could not be read)" \
            if dep.status == UNREADABLE else ""
        console.print(f"{dep.run_id}: down{found}")


def _down_by_label(run: str, project: Optional[str], zone: Optional[str], bucket: Optional[str]) -> None:
    """No local state for RUN: on Google Cloud its resources still carry its label. A run supervised on the
    cloud is asked to stop first, so its record says how it ended (and this machine gets a copy)."""
    if not (project or zone or os.environ.get("GOOGLE_CLOUD_PROJECT") or os.environ.get("CLOUDSDK_COMPUTE_ZONE")):
        fail(f"no deployment found for run '{run}' on this machine; `dsctl status` lists the ones that are up. "
             "For a Google Cloud run whose local state is gone, add --project P --zone Z to find it by label.",
             EXIT_BAD_INPUT)
    from dsctl.orchestrator import cloudruns
    from dsctl.orchestrator.store import RunStore
    from dsctl.provisioners.gcp import down_without_state, run_objects_without_state

    latest = cloudruns.stop(RunStore(), run_objects_without_state(run, project, bucket), run, "dsctl down")
    if latest is not None:
        console.print(f"{run}: its supervisor recorded it {latest['run']['status']}")

    found = down_without_state(run, project, zone, log=lambda msg: console.print(msg), bucket=bucket)
    console.print(f"{run}: nothing found on Google Cloud." if found.empty else f"{run}: deleted {found.summary()}")


@runs_app.callback()
def runs(ctx: typer.Context, limit: int = typer.Option(20, "--limit", "-n"), json_out: bool = typer.Option(False, "--json")) -> None:
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


def _cloud_objects(run: str, project: Optional[str], bucket: Optional[str]):
    """Where a run supervised on the cloud publishes its record: from its local state, or from --project
    (and --bucket) when this machine has none; None for any other run."""
    from dsctl.orchestrator import cloudruns
    from dsctl.orchestrator.deployments import find
    from dsctl.provisioners import get_provisioner

    dep = find(run)
    if dep is not None and cloudruns.supervised(dep):
        return get_provisioner(dep.provider).run_objects(dep), dep
    if project or bucket:
        from dsctl.provisioners.gcp import run_objects_without_state

        return run_objects_without_state(run, project, bucket), None
    return None, None


def _synced(store, run: str, project: Optional[str], bucket: Optional[str]) -> None:
    """A run supervised on the cloud: its record here brought up to date from what its supervisor published."""
    from dsctl.orchestrator import cloudruns

    objects, dep = _cloud_objects(run, project, bucket)
    if dep is not None:
        cloudruns.refresh(store, dep)
    elif objects is not None and cloudruns.sync(store, objects, run) is None:
        from dsctl.specs import SpecError

        raise SpecError(f"run '{run}' has published no record in that project's bucket; check --project and --bucket.")


@runs_app.command("show")
def runs_show(
    run: str = typer.Argument(..., help="run id or unique prefix"),
    json_out: bool = typer.Option(False, "--json"),
    timeline: bool = typer.Option(False, "--timeline", help="plot workers and batch time over time (PNG)"),
    out: Optional[Path] = typer.Option(None, "--out", help="where --timeline writes its PNG (default: the run dir)"),
    project: Optional[str] = typer.Option(None, "--project", help="read a cloud-supervised run's record from this project"),
    bucket: Optional[str] = typer.Option(None, "--bucket", help="... and bucket, if not <project>-dsctl"),
) -> None:
    """One run: its summary, events and per-window metrics; --timeline plots them."""
    from dsctl.orchestrator.store import RunStore

    store = RunStore()
    _synced(store, run, project, bucket)
    record = store.get(run)
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
        table.add_row("summary", "rebuilt from the run's stored metrics windows: its trainers' own end records are "
                                 "missing (the run ended abnormally)")
    console.print(table)
    for e in store.events(record.id):
        console.print(f"  {time.strftime('%H:%M:%S', time.localtime(e['t']))} {e['kind']}: {e['message']}")


@app.command()
def logs(
    run: str = typer.Argument(..., help="run id or unique prefix"),
    follow: bool = typer.Option(False, "--follow", "-f", help="keep printing until the run ends"),
    project: Optional[str] = typer.Option(None, "--project", help="read a cloud-supervised run's record from this project"),
    bucket: Optional[str] = typer.Option(None, "--bucket", help="... and bucket, if not <project>-dsctl"),
    interval: float = typer.Option(2.0, "--interval", min=0.2, max=600, help="seconds between looks with --follow"),
    output: bool = typer.Option(True, "--output/--events-only", help="also print what the trainers printed (their "
                                                                     "stdout and stderr: your command's output)"),
) -> None:
    """A run's events (workers restarted, VMs stopped, outages, scaling) and what its trainers printed; --follow until
    it ends."""
    from dsctl.orchestrator.store import RunStore
    from dsctl.orchestrator.tail import OutputTail, trainer_outputs
    from dsctl.specs import SpecError

    store = RunStore()
    shown: set[tuple] = set()
    outputs: dict[Path, OutputTail] = {}

    def show() -> object:
        _synced(store, run, project, bucket)
        record = store.get(run)
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
            for path in trainer_outputs(record.run_dir):
                tail = outputs.setdefault(path, OutputTail(path))
                for line in tail.read():
                    console.print(f"{tail.label} | {line}", markup=False, highlight=False)
        return record

    record = show()
    objects, _ = _cloud_objects(record.id, project, bucket) if follow else (None, None)
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


def _timeline(store, record, out: Optional[Path]) -> None:
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
