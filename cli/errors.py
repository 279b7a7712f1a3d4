"""Exit codes and the one place where exceptions become messages: never a traceback for users."""

from __future__ import annotations

import sys

import typer
from rich.console import Console
from rich.markup import escape

from dsctl.specs import SpecError

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130

err_console = Console(stderr=True, highlight=False, soft_wrap=True)


def fail(message: str, code: int) -> None:
    """Print one error paragraph and exit with `code`."""
    err_console.print(f"[bold red]error:[/] {escape(message)}")
    raise typer.Exit(code)


def run_app(app: typer.Typer) -> None:
    """Run the CLI, mapping dsctl's exceptions to exit codes: bad input 2, runtime failure 1.

    Typer itself turns usage errors into exit 2 and Ctrl-C into exit 130.
    """
    from dsctl.orchestrator.outcome import RunFailed
    from dsctl.provisioners.gcp.errors import GcpError

    try:
        app()
    except SpecError as exc:
        err_console.print(f"[bold red]error:[/] {escape(str(exc))}")
        sys.exit(EXIT_BAD_INPUT)
    except RunFailed as exc:
        hint = f" (run {exc.run_id}; `dsctl runs show {exc.run_id}` has what was measured)" if exc.run_id else ""
        err_console.print(f"[bold red]error:[/] {escape(str(exc) + hint)}")
        sys.exit(EXIT_FAILED)
    except GcpError as exc:
        err_console.print(f"[bold red]error:[/] {escape(str(exc))}")
        sys.exit(EXIT_FAILED)
