"""`dsctl tensorboard [RUN...]`: TensorBoard on recorded runs' event files, in the foreground."""

from __future__ import annotations

import socket
import subprocess
import sys

import typer

from .errors import EXIT_INTERRUPTED
from .render import console

DEFAULT_PORT = 6006


def tensorboard(
    runs: list[str] | None = typer.Argument(None, metavar="[RUN...]", help="run ids or unique prefixes; default: the latest run"),
    port: int | None = typer.Option(None, "--port", min=1, max=65535, help=f"default {DEFAULT_PORT}, or a free one if taken"),
    host: str = typer.Option("localhost", "--host", help="address TensorBoard listens on"),
) -> None:
    """Start TensorBoard on runs' event files (loss, batches/s, input stall, workers, cost so far); Ctrl-C stops it."""
    from dsctl.orchestrator.store import RunStore

    store = RunStore()
    logdirs = _logdirs(store, runs or [])
    port = port or _free_port(host)
    spec = ",".join(f"{rid}:{path}" for rid, path in logdirs.items())
    console.print(f"TensorBoard on run(s) {', '.join(logdirs)} at http://{host}:{port}/ (Ctrl-C stops it)",
                  markup=False, highlight=False)
    args = [sys.executable, "-m", "tensorboard.main", "--logdir_spec", spec, "--port", str(port), "--host", host]
    proc = subprocess.Popen(args)
    try:
        code = proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        raise typer.Exit(EXIT_INTERRUPTED) from None
    if code:
        raise typer.Exit(1)


def _logdirs(store, refs: list[str]) -> dict[str, str]:
    """Run id -> the folder TensorBoard reads: the event files here, else the copy the spec asked for."""
    from dsctl.orchestrator.tbevents import board_dir, event_files
    from dsctl.specs import SpecError

    if not refs:
        latest = store.list(limit=1, kinds=("job",))
        if not latest:
            raise SpecError("no runs are recorded yet, so there are no event files to show; `dsctl up JOB.yaml` "
                            "makes a run (each run writes them).")
        refs = [latest[0].id]
    out: dict[str, str] = {}
    for ref in refs:
        record = store.get(ref)
        if record is None:
            raise SpecError(f"no run '{ref}' is recorded (or that prefix names several runs); `dsctl runs` lists them.")
        board = record.summary.get("tensorboard") or {}
        here = board.get("dir") or (str(board_dir(record.run_dir)) if record.run_dir else None)
        copy = board.get("copy")
        if here and event_files(here):
            out[record.id] = here
        elif copy and (copy.startswith("gs://") or event_files(copy)):
            out[record.id] = copy
        else:
            looked = " or ".join(x for x in (here, copy) if x) or "its run directory"
            why = f" ({board['error']})" if board.get("error") else (
                " (it is still running and has not finished a metrics window)" if record.status == "running" else
                " (its trainers reported no metrics window, or it ran on another machine without trainer.tensorboard_dir)")
            raise SpecError(f"run {record.id} has no TensorBoard event files in {looked}{why}; choose another run "
                            "(`dsctl runs` lists them).")
    return out


def _free_port(host: str) -> int:
    """DEFAULT_PORT if nothing listens there, else one the system picks."""
    for port in (DEFAULT_PORT, 0):
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return s.getsockname()[1]
    return DEFAULT_PORT
