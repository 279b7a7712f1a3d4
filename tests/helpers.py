"""Helpers for tests that drive dsctl end to end: the CLI as a subprocess, specs on disk, leftovers."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "specs" / "examples"


def processes_under(home: Path) -> list[psutil.Process]:
    """Processes whose command line names a path inside `home` (every dsctl child does: its run dir)."""
    out = []
    for p in psutil.process_iter(["cmdline", "environ"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
            env_home = (p.info["environ"] or {}).get("DSCTL_HOME")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if p.pid == os.getpid():
            continue
        if str(home) in cmd or env_home == str(home):
            if p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
    return out


def dsctl(*args: str, timeout: float = 300, check: bool = False, **kw) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess (with the test's DSCTL_HOME), capturing output."""
    proc = subprocess.run([sys.executable, "-m", "dsctl.cli.main", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "COLUMNS": "200"}, **kw)
    if check and proc.returncode != 0:
        raise AssertionError(f"dsctl {' '.join(map(str, args))} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def write_spec(dir: Path, text: str, name: str = "job.yaml") -> Path:
    path = dir / name
    path.write_text(textwrap.dedent(text))
    return path


def wait_for(predicate, timeout: float = 60, interval: float = 0.2, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")
