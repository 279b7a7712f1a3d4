"""`dsctl validate`, `dsctl up` and `dsctl supervise`: a job spec checked, run, or run to its end on the cloud."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TypeVar

import typer
from rich.markup import escape

from dsctl.errors import stop_on_signals
from dsctl.orchestrator.policies import POLICIES
from dsctl.orchestrator.preflight import load_job
from dsctl.specs import UsageError
from dsctl.specs.schema import MAX_WORKERS, MODES

from .errors import err_console
from .live import LiveView
from .locate import said
from .render import console, job_length, print_json, resume_line, summary_table


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


def supervise(run_dir: Path = typer.Argument(..., help="the handed-over run's directory on this VM")) -> None:
    """Run a job handed over by `dsctl up --detach` to its end, on the cloud (orchestrator/supervise.py)."""
    from dsctl.orchestrator.supervise import supervise as run_supervised

    stop_on_signals()
    raise typer.Exit(run_supervised(run_dir))
