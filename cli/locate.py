"""The options that say where to look for a run with no local state (`--project P`), on the commands that need them.

They are the providers' (orchestrator/locate.py: each provider that finds runs by label declares its own), so the
commands offer what the installed providers take, and name no place themselves.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

import typer

from dsctl.orchestrator.locate import LocateUse, Where, locate_options

F = TypeVar("F", bound=Callable[..., Any])
PREFIX = "locate_"  # the options' parameter names: locate_project, ...


def locating(use: LocateUse) -> Callable[[F], F]:
    """Give a command the options that locate what `use` needs (down: a run's resources; record: its published record;
    check: a place); it receives their values as its `where` parameter (a Where)."""
    def wrap(command: F) -> F:
        options = locate_options(use)
        signature = inspect.signature(command)
        kept = [p for p in signature.parameters.values() if p.name != "where"]
        added = [inspect.Parameter(f"{PREFIX}{o.name}", inspect.Parameter.KEYWORD_ONLY, annotation="str | None",
                                   default=typer.Option(None, f"--{o.name}", help=o.help)) for o in options]

        @functools.wraps(command)
        def with_where(**kwargs: Any) -> Any:
            values = {o.name: kwargs.pop(f"{PREFIX}{o.name}", None) for o in options}
            return command(**kwargs, where=Where(**values))

        with_where.__signature__ = signature.replace(parameters=[*kept, *added])  # type: ignore[attr-defined]
        with_where.__annotations__ = {**{k: v for k, v in command.__annotations__.items() if k != "where"},
                                      **{p.name: p.annotation for p in added}}
        return with_where  # type: ignore[return-value]

    return wrap


def said(use: LocateUse) -> str:
    """The options as a user would add them: '--project P --zone Z' (empty when no provider has any)."""
    return " ".join(f"--{o.name} {o.name[0].upper()}" for o in locate_options(use) if o.hint)
