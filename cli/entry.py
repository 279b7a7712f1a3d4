"""The `dsctl` console script: Ctrl-C from the very first moment exits 130 with one line.

Importing the CLI (typer, rich, the spec schema) takes about half a second, before any
command runs; a Ctrl-C then would otherwise print a KeyboardInterrupt traceback. Here the
import itself is inside the handler; cli.main.main() handles Ctrl-C from then on.
"""

from __future__ import annotations


def main() -> None:
    try:
        from .main import main as run
    except KeyboardInterrupt:
        from .errors import interrupted

        interrupted()
    run()


if __name__ == "__main__":
    main()
