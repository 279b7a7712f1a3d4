"""trainer.command: the program it names, found the way the runner will find it, without running anything.

`dsctl validate` and `dsctl up` check that the program exists and may be executed (a path relative
to the spec's folder, or a name on PATH), and, for `python script.py`, that the script is there; the
runner (runtime/command.py) finds the program with the same function when it starts it. On Google
Cloud the program runs on the trainer VMs, with their Python: only what lies in the spec's folder
(which is copied to them) can be checked here.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

PYTHON_RE = re.compile(r"^python(\d+(\.\d+)?)?$")


def activated(env: dict[str, str]) -> dict[str, str]:
    """The environment a command sees. When dsctl itself runs from a virtualenv that no shell activated
    (`.venv/bin/dsctl up job.yaml`), the command sees that virtualenv as activated, as `source
    .venv/bin/activate` would have made it: its bin folder first on PATH and VIRTUAL_ENV set, so `python`
    is the interpreter that has dsctl. An activated virtualenv (VIRTUAL_ENV set) is left as it is."""
    if env.get("VIRTUAL_ENV") or sys.prefix == sys.base_prefix:
        return env
    bin_dir = os.path.dirname(sys.executable)
    return {**env, "VIRTUAL_ENV": sys.prefix, "PATH": bin_dir + os.pathsep + env.get("PATH", os.defpath)}


def find_program(argv0: str, base_dir: Path, path_env: str | None) -> tuple[str | None, str | None]:
    """(the program's path, None), or (None, why it cannot be run: one sentence naming what was looked for)."""
    if "/" in argv0:
        path = Path(argv0) if os.path.isabs(argv0) else base_dir / argv0
        if not path.exists():
            return None, f"{argv0} does not exist (looked for {path}; a relative path is relative to the spec's folder)."
        if path.is_dir() or not os.access(path, os.X_OK):
            return None, (f"{path} is not an executable file; make it one (chmod +x), or run it with its interpreter, "
                          f"e.g. [python, {argv0}].")
        return str(path), None
    found = shutil.which(argv0, path=path_env)
    if found is None:
        return None, (f"the program {argv0!r} is not on PATH ({path_env or 'PATH is empty'}); give its path, set PATH "
                      "in trainer.env, or activate the environment that has it before running dsctl.")
    return found, None


def script_argument(argv: list[str]) -> str | None:
    """The script a `python script.py ...` command runs (relative to the spec's folder), or None."""
    if len(argv) > 1 and PYTHON_RE.match(os.path.basename(argv[0])) and not argv[1].startswith("-"):
        return argv[1]
    return None


def command_problem(argv: list[str], base_dir: Path, env: dict[str, str], on_this_machine: bool) -> str | None:
    """Why `argv` could not run as the trainer's command, or None. on_this_machine=False (the command runs on cloud
    VMs): only files in the spec's folder are checked."""
    program = argv[0]
    if on_this_machine:
        _, why = find_program(program, base_dir, activated(env).get("PATH"))
    elif "/" in program and not os.path.isabs(program):
        _, why = find_program(program, base_dir, None)  # in the spec's folder, which the VMs get a copy of
    else:
        why = None  # a name on the VM's PATH, or a path on the VM: only the VM can tell
    if why:
        return why
    script = script_argument(argv)
    if script is not None and not (base_dir / script).is_file():
        return (f"{argv[0]} would run {script}, which is not in the spec's folder ({base_dir / script} does not exist); "
                "the command runs from the spec's folder.")
    return None
