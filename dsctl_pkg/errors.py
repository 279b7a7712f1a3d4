"""The one base of the errors dsctl explains to its users.

Every error a user should read (bad input, a run that failed, records that cannot be written, a
cloud that refused) is a DsctlError: its message is one paragraph saying what happened and what to
do, and it carries the exit code the command ends with. The CLI prints it and exits with that code
(cli/errors.py); anything else is a bug, and shows as one.
"""

from __future__ import annotations

EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 1, 2, 130


class DsctlError(Exception):
    """One paragraph for the user; `exit_code` is what the command exits with."""

    exit_code = EXIT_FAILED

    def for_user(self) -> str:
        """What the CLI prints after 'error: '."""
        return str(self)
