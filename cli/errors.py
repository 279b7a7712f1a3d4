"""Exit codes and the one place where exceptions become messages: never a traceback for users."""

from __future__ import annotations

import errno
import logging
import os
import signal
import sys

import typer
from rich.console import Console
from rich.markup import escape

from dsctl.errors import EXIT_FAILED, EXIT_INTERRUPTED, DsctlError
from dsctl.orchestrator import home
from dsctl.orchestrator.outcome import Interrupted

err_console = Console(stderr=True, highlight=False, soft_wrap=True)


def interrupted() -> None:
    """Ctrl-C that no command handled: one line, exit 130, no traceback (a second Ctrl-C is ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    err_console.print("interrupted; `dsctl status` lists any deployment still up.")
    sys.exit(EXIT_INTERRUPTED)


class _Notices(logging.Handler):
    """What the orchestrator did on its own and the user must know (a damaged runs.db moved aside): one paragraph."""

    def emit(self, record: logging.LogRecord) -> None:
        err_console.print(f"[bold yellow]warning:[/] {escape(record.getMessage())}")


def run_app(app: typer.Typer) -> None:
    """Run the CLI, mapping dsctl's errors to one paragraph and their exit code (dsctl/errors.py: bad input 2,
    a runtime failure 1, an interrupted run 130).

    Typer itself turns usage errors into exit 2 and Ctrl-C inside a command into a silent exit 130; that one
    gets interrupted()'s line here. A run that was interrupted says what it stopped (Interrupted). A full disk,
    and a DSCTL_HOME that cannot be written (read-only, a file, not the user's), are one paragraph and exit 1.
    """
    home.private_umask()
    home.notices.addHandler(_Notices())
    home.notices.propagate = False
    try:
        app()
    except SystemExit as exc:
        if exc.code == EXIT_INTERRUPTED and isinstance(getattr(exc.__context__, "__cause__", None), KeyboardInterrupt):
            interrupted()
        raise
    except Interrupted as exc:
        err_console.print(escape(exc.for_user()))
        sys.exit(exc.exit_code)
    except DsctlError as exc:
        for paragraph in exc.paragraphs():  # validate reports every problem it found, each its own paragraph
            err_console.print(f"[bold red]error:[/] {escape(paragraph)}")
        sys.exit(exc.exit_code)
    except OSError as exc:
        unusable = home.home_error(exc)  # a read-only, file-shaped or otherwise unusable DSCTL_HOME, a name too long
        if unusable is not None:
            err_console.print(f"[bold red]error:[/] {escape(unusable.for_user())}")
            sys.exit(unusable.exit_code)
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        where = f"{exc.filename}: " if exc.filename else ""
        what = exc.strerror or os.strerror(exc.errno)  # None for an OSError raised without a message
        err_console.print(f"[bold red]error:[/] {escape(where + what)}; free some space there and run the "
                          "command again (`dsctl status` shows anything still up).")
        sys.exit(EXIT_FAILED)
