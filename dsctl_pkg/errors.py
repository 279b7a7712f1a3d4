"""The one base of the errors dsctl explains to its users.

Every error a user should read (bad input, a run that failed, records that cannot be written, a
cloud that refused) is a DsctlError: its message is one paragraph saying what happened and what to
do, and it carries the exit code the command ends with. The CLI prints it and exits with that code
(cli/errors.py); anything else is a bug, and shows as one.
"""

from __future__ import annotations

import signal

EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 1, 2, 130

# Lines quoted after an error's paragraph (the end of a program's output) start with this: they are shown as lines,
# not joined into the paragraph.
QUOTED = "  | "


def quoted(lines: list[str]) -> str:
    """Lines to show after a paragraph, as they were (a traceback reads as one only line by line)."""
    return "".join(f"\n{QUOTED}{line}" for line in lines)


def split_quoted(text: str) -> tuple[str, str]:
    """(the paragraph, the quoted lines after it, each starting with a newline; "" when there are none)."""
    at = text.find("\n" + QUOTED)
    return (text, "") if at < 0 else (text[:at], text[at:])


class DsctlError(Exception):
    """One paragraph for the user (and the lines it quotes); `exit_code` is what the command exits with. `run_id`:
    the run the error ended, whose id the user is told with where to look."""

    exit_code = EXIT_FAILED
    run_id: str | None = None

    def for_user(self) -> str:
        """What the CLI prints after 'error: ': the paragraph, the run to look at, then any quoted lines."""
        paragraph, lines = split_quoted(str(self))
        return paragraph + self.run_hint() + lines

    def run_hint(self) -> str:
        rid = self.run_id
        return (f" (run {rid}: `dsctl logs {rid}` shows what it printed, `dsctl runs show {rid}` what it measured)"
                if rid else "")

    def paragraphs(self) -> list[str]:
        """Each problem the error reports, for the CLI to print as one 'error:' each."""
        return [self.for_user()]


class Signalled(KeyboardInterrupt):
    """A signal that ends a command the way Ctrl-C does (tear down, record, one line), and with its own exit code:
    128 + the signal's number (SIGINT 130, SIGTERM 143, SIGHUP 129), as a shell reports a process it ended."""

    def __init__(self, signum: int = signal.SIGINT):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def signum_of(exc: BaseException) -> int:
    """The signal a KeyboardInterrupt stands for: SIGINT unless it is a Signalled."""
    return exc.signum if isinstance(exc, Signalled) else signal.SIGINT


def stop_on_signals(*signums: int) -> None:
    """From now on these signals (default SIGTERM and SIGHUP: a scheduler, a closed terminal) end the command as
    Ctrl-C does, raising Signalled in the main thread."""
    def handler(signum, frame):
        raise Signalled(signum)

    for signum in signums or (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, handler)
