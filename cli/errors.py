"""Exit codes and the one place where exceptions become messages: never a traceback for users."""

from __future__ import annotations

import functools
import sys
from typing import Callable

import typer
from rich.console import Console

from dsctl.specs import SpecError

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130

err_console = Console(stderr=True, highlight=False, soft_wrap=True)


def fail(message: str, code: int) -> None:
    err_console.print(f"[bold red]error:[/] {message}", markup=True, highlight=False)
    raise typer.Exit(code)


def handle_errors(fn: Callable) -> Callable:
    """Map dsctl's exceptions to exit codes: bad input 2, runtime failure 1, Ctrl-C 130."""
    from dsctl.orchestrator.run import RunFailed

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except SpecError as exc:
            fail(_escape(str(exc)), EXIT_BAD_INPUT)
        except RunFailed as exc:
            suffix = f" (run {exc.run_id}; `dsctl runs show {exc.run_id}` has what was measured)" if exc.run_id else ""
            fail(_escape(f"{exc}{suffix}"), EXIT_FAILED)
        except KeyboardInterrupt:
            err_console.print("interrupted: everything this run started has been stopped; the partial run is recorded.")
            raise typer.Exit(EXIT_INTERRUPTED)
        except BrokenPipeError:
            sys.exit(EXIT_OK)

    return wrapper


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)
