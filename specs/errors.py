"""One error type for everything a user wrote wrong, rendered as one paragraph."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from dsctl.errors import EXIT_BAD_INPUT, DsctlError, split_quoted


class SpecError(DsctlError):
    """A problem in a user's file or arguments; the CLI prints it and exits 2.

    `where` is "file:line" when known, `field` the dotted path of the offending
    value ("service.workers"). The message is kept to one paragraph: what is
    wrong, where, and what would be valid; lines it quotes after it (the end of a
    program's output, dsctl.errors.quoted) stay lines.
    """

    exit_code = EXIT_BAD_INPUT

    def __init__(self, message: str, *, where: str | None = None, field: str | None = None):
        self.message = message.strip()
        self.where = where
        self.field = field
        super().__init__(self.render())

    def render(self) -> str:
        prefix = ""
        if self.where:
            prefix += f"{self.where}: "
        if self.field:
            prefix += f"{self.field}: "
        paragraph, lines = split_quoted(prefix + self.message)
        return " ".join(paragraph.split()) + lines


class UsageError(SpecError):
    """Bad input on the command line, as Click's UsageError: a flag's value, or a run that does not exist. Exit 2,
    one paragraph naming the option or the run and what would be valid. A SpecError (bad input, exit 2), so that
    whatever takes a user's bad input as one takes this too."""


class SpecErrors(SpecError):
    """Several problems found in one spec, each its own paragraph: `dsctl validate` reports every one it finds.
    As a SpecError it reads as the first (message, where, field); str() and paragraphs() have them all."""

    problems: list[SpecError]

    def __init__(self, problems: list[SpecError]):
        self.problems = [p for e in problems for p in (e.problems if isinstance(e, SpecErrors) else [e])]
        first = self.problems[0]
        super().__init__(first.message, where=first.where, field=first.field)

    def render(self) -> str:
        return "\n".join(p.render() for p in getattr(self, "problems", [])) or super().render()

    def paragraphs(self) -> list[str]:
        return [p.for_user() for p in self.problems]


class Problems:
    """Collects the SpecErrors of several independent checks, to report them all at once:

        problems = Problems()
        with problems.check():
            check_one(...)          # a SpecError here is kept, and the next check still runs
        problems.raise_any()        # the one problem, or SpecErrors of several
    """

    def __init__(self) -> None:
        self.found: list[SpecError] = []

    @contextmanager
    def check(self) -> Iterator[None]:
        try:
            yield
        except SpecError as exc:
            self.found.append(exc)

    def raise_any(self) -> None:
        if len(self.found) == 1:
            raise self.found[0]
        if self.found:
            raise SpecErrors(self.found)


def dotted(path: tuple) -> str:
    """('service', 'coordinated_reads', 'bucket_boundaries', 2) -> 'service.coordinated_reads.bucket_boundaries[2]'."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out
