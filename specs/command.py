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
# What execve takes (man 2 execve, "Limits on size of arguments and environment"; include/uapi/linux/binfmts.h): one
# argument or environment string at most MAX_ARG_STRLEN bytes with its terminating NUL, and all of them together
# (each with its NUL and its pointer) at most ARG_MAX, a quarter of the stack limit (sysconf(_SC_ARG_MAX)).
MAX_ARG_STRLEN = 32 * 4096
DEFAULT_ARG_MAX = 2 * 1024 * 1024  # with the usual 8 MiB stack limit: what a machine other than this one takes
DSCTL_ADDS = 16 * 1024  # what dsctl adds to the command's environment (DSCTL_TRAINER, PATH, VIRTUAL_ENV), at most
POINTER = 8


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


def _size(text: str) -> int:
    """Bytes a string takes in execve's arguments or environment: encoded as the kernel gets it, and its NUL."""
    return len(os.fsencode(text)) + 1


def exec_problem(argv: list[str], spec_env: dict[str, str], inherited: dict[str, str],
                 arg_max: int) -> tuple[tuple[str, ...], str] | None:
    """Why execve would refuse the command (E2BIG) with trainer.env on top of the `inherited` environment, as (the
    spec field to point at, why), or None. Checked before anything starts: otherwise the command fails only once
    the service is up, and its error could not say which value is at fault."""
    for name, value in spec_env.items():
        size = _size(f"{name}={value}")
        if size > MAX_ARG_STRLEN:
            return (("trainer", "env", name),
                    f"{name} is {size:,} bytes as the program would get it ({name}=value and its terminating NUL), and "
                    f"Linux starts no program with one environment string over {MAX_ARG_STRLEN:,} bytes "
                    "(MAX_ARG_STRLEN), so the command could never start. Put a value this large in a file, and pass "
                    "the file's path.")
    env = {**inherited, **spec_env}
    own = sum(_size(w) + POINTER for w in argv) + sum(_size(f"{k}={v}") + POINTER for k, v in spec_env.items())
    total = own + sum(_size(f"{k}={v}") + POINTER for k, v in env.items() if k not in spec_env) + DSCTL_ADDS
    if total > arg_max:
        field = ("trainer", "env") if spec_env else ("trainer", "command")
        return (field, f"the command's words and environment come to {total:,} bytes ({own:,} from trainer.command "
                       f"and trainer.env, the rest from the environment dsctl runs in and what dsctl adds), over the "
                       f"{arg_max:,} bytes execve takes here (ARG_MAX), so the command could never start. Shorten "
                       "trainer.env or trainer.command, or leave large variables out of the environment dsctl runs "
                       "in.")
    return None


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
