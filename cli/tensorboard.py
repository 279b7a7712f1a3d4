"""`dsctl tensorboard [RUN...]`: TensorBoard on recorded runs' event files, in the foreground.

The orchestrator starts and records it (orchestrator/boards.py), so `dsctl status` lists it and `dsctl down`
stops it even after `kill -9` of this command; here it is only parsed and rendered."""

from __future__ import annotations

import signal

import typer

from dsctl.errors import signum_of, stop_on_signals

from .render import console

DEFAULT_PORT = 6006


def tensorboard(
    runs: list[str] | None = typer.Argument(None, metavar="[RUN...]", help="run ids or unique prefixes; default: the latest run"),
    port: int | None = typer.Option(None, "--port", min=1, max=65535, help=f"default {DEFAULT_PORT}, or a free one if taken"),
    host: str = typer.Option("localhost", "--host", help="address TensorBoard listens on"),
) -> None:
    """Start TensorBoard on runs' event files (loss, batches/s, input stall, workers, cost so far), for you alone (a
    token in the URL it prints); Ctrl-C stops it (so do SIGTERM and SIGHUP; after kill -9 of this command, `dsctl
    down` does)."""
    from dsctl.orchestrator import boards
    from dsctl.orchestrator.outcome import Interrupted
    from dsctl.orchestrator.store import RunStore

    logdirs = boards.logdirs(RunStore(), runs or [])

    def started(board: boards.Board) -> None:
        console.print(f"TensorBoard on run(s) {', '.join(logdirs)} at {board.private_url} (Ctrl-C stops it; so does "
                      f"`dsctl down {board.id}`). The token in the URL is yours: without it the server answers "
                      "nothing, so other users of this machine cannot read your runs.", markup=False, highlight=False)

    stop_on_signals()
    try:
        boards.serve(logdirs, host, port, started)
    except KeyboardInterrupt as exc:
        signum = signum_of(exc)
        raise Interrupted(f"interrupted ({signal.Signals(signum).name}): TensorBoard is stopped.", signum) from None
