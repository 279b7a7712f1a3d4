"""Starting a run's local processes, each in its own session and process group, all in the run's cgroup.

Each process gets its own session, so Ctrl-C in the terminal reaches only dsctl, which then
stops them in order (provisioners/processes.py stop_groups); `dsctl down` can stop a whole
group later, identified by pid AND start time (never by process name). A process started
with a cgroup joins it before it runs a single instruction of its own (provisioners/containment.py),
so whatever it starts, in any session, is found and ended with the run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import psutil

from ..containment import Cgroup
from ..state import Node, ProcessRef


def child_env() -> dict:
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["PYTHONUNBUFFERED"] = "1"
    return env


PRIVATE_UMASK = 0o077  # what dsctl's processes write (logs, metrics, ready files) is the user's alone


def enter_namespaces_of(pid: int) -> list[str]:
    """The nsenter prefix that starts a command in the network namespace of process `pid` (and in its
    user namespace, keeping our own uid, when it has one of its own); [] if `pid` shares ours."""
    def ns(kind: str, of: int | str) -> str:
        return os.readlink(f"/proc/{of}/ns/{kind}")

    if ns("net", pid) == ns("net", "self"):
        return []
    nsenter = shutil.which("nsenter")
    if nsenter is None:
        raise FileNotFoundError("nsenter (util-linux) is not installed")
    prefix = [nsenter, f"--net=/proc/{pid}/ns/net"]
    if ns("user", pid) != ns("user", "self"):
        prefix[1:1] = [f"--user=/proc/{pid}/ns/user", "--preserve-credentials"]
    return [*prefix, "--"]


def spawn(node: Node | ProcessRef, args: list[str], log: Path, cpus: list[int] | None = None,
          prefix: list[str] | None = None, cgroup: Cgroup | None = None) -> subprocess.Popen:
    """Start `python -m <args>` for `node` (pinned to `cpus` if given, in `cgroup` if given), filling in its pid,
    pgid, start time and log.

    `prefix` (from enter_namespaces_of) starts it in another process's namespaces; nsenter execs
    python in place, so the pid and start time are python's."""
    log.parent.mkdir(parents=True, exist_ok=True)
    join = cgroup.joiner() if cgroup is not None else None

    def before_exec() -> None:  # in the child, between fork and exec
        if join is not None:
            join()  # first: nothing it runs, nor anything that forks, is ever outside the run's cgroup
        if cpus:
            os.sched_setaffinity(0, cpus)

    pin = before_exec if join is not None or cpus else None
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        proc = subprocess.Popen(
            [*(prefix or []), sys.executable, "-m", *args], stdout=out, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True, env=child_env(), preexec_fn=pin, umask=PRIVATE_UMASK,
        )
    finally:
        os.close(out)
    node.pid = proc.pid
    node.pgid = proc.pid
    node.log = str(log)
    try:
        node.create_time = psutil.Process(proc.pid).create_time()
    except psutil.NoSuchProcess:
        node.create_time = None
    return proc
