"""Exit codes and the one place where exceptions become messages: never a traceback for users."""

from __future__ import annotations

import errno
import signal
import sys

import typer
from rich.console import Console
from rich.markup import escape

from dsctl.orchestrator import store
from dsctl.specs import SpecError

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130

err_console = Console(stderr=True, highlight=False, soft_wrap=True)


def fail(message: str, code: int) -> None:
    """Print one error paragraph and exit with `code`."""
    err_console.print(f"[bold red]error:[/] {escape(message)}")
    raise typer.Exit(code)


def interrupted() -> None:
    """Ctrl-C that no command handled: one line, exit 130, no traceback (a second Ctrl-C is ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    err_console.print("interrupted; `dsctl status` lists any deployment still up.")
    sys.exit(EXIT_INTERRUPTED)


def notice(message: str) -> None:
    """What the orchestrator did on its own and the user must know (a damaged runs.db moved aside): one paragraph."""
    err_console.print(f"[bold yellow]warning:[/] {escape(message)}")


def run_app(app: typer.Typer) -> None:
    """Run the CLI, mapping dsctl's exceptions to exit codes: bad input 2, runtime failure 1.

    Typer itself turns usage errors into exit 2 and Ctrl-C inside a command into a silent
    exit 130; that one gets interrupted()'s line here. (`up` handles Ctrl-C itself, tears
    down and says so; its exit 130 is not typer's and gets no second line.) Records that
    cannot be used and a full disk are one paragraph and exit 1.
    """
    store.on_notice = notice
    try:
        app()
    except SystemExit as exc:
        if exc.code == EXIT_INTERRUPTED and isinstance(getattr(exc.__context__, "__cause__", None), KeyboardInterrupt):
            interrupted()
        raise
    except SpecError as exc:
        err_console.print(f"[bold red]error:[/] {escape(str(exc))}")
        sys.exit(EXIT_BAD_INPUT)
    except store.StoreError as exc:
        err_console.print(f"[bold red]error:[/] {escape(str(exc))}")
        sys.exit(EXIT_FAILED)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        where = f"{exc.filename}: " if exc.filename else ""
        err_console.print(f"[bold red]error:[/] {escape(where + exc.strerror)}; free some space there and run the "
                          "command again (`dsctl status` shows anything still up).")
        sys.exit(EXIT_FAILED)
    except Exception as exc:
        # Imported only now: the Google Cloud provider's package costs 0.1 s of every command's start.
        from dsctl.orchestrator.outcome import RunFailed
        from dsctl.provisioners.gcp.errors import GcpError

        if isinstance(exc, RunFailed):
            hint = f" (run {exc.run_id}; `dsctl runs show {exc.run_id}` has what was measured)" if exc.run_id else ""
            err_console.print(f"[bold red]error:[/] {escape(str(exc) + hint)}")
            sys.exit(EXIT_FAILED)
        if isinstance(exc, GcpError):
            err_console.print(f"[bold red]error:[/] {escape(str(exc))}")
            sys.exit(EXIT_FAILED)
        raise
