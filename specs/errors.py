"""One error type for everything a user wrote wrong, rendered as one paragraph."""

from __future__ import annotations

from dsctl.errors import EXIT_BAD_INPUT, DsctlError


class SpecError(DsctlError):
    """A problem in a user's file or arguments; the CLI prints it and exits 2.

    `where` is "file:line" when known, `field` the dotted path of the offending
    value ("service.workers"). The message is kept to one paragraph: what is
    wrong, where, and what would be valid.
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
        return " ".join((prefix + self.message).split())


def dotted(path: tuple) -> str:
    """('service', 'coordinated_reads', 'bucket_boundaries', 2) -> 'service.coordinated_reads.bucket_boundaries[2]'."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out
