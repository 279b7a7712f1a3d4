"""Processes on this machine, identified by pid AND start time, stopped a process group at a time.

Used for every process dsctl starts locally: a run's servers and trainers (the local provider), a
detached `dsctl up` that owns a deployment, a caller waiting on a request (orchestrator/control.py).
`dsctl down` in a new process stops them from their recorded pid, process group and start time,
never by name: a pid that now belongs to another process is left alone.

A process group is signalled only where dsctl made it: every process dsctl starts leads a session (and
so a group) of its own, so a recorded process that still leads its recorded group owns it. A group
that is not such a leader's (a shell script's, with everything it runs in the background), or that
holds this process or one of its ancestors (the command that called `dsctl down`), never is: the
recorded process alone gets the signal.

When a run's state file cannot be read, its processes are recognised by what dsctl makes of each
(`run_processes`): it leads a session of its own and runs one of dsctl's modules naming the run. A
process that merely names the run's folder (`tail -f RUN_DIR/up.log`) is not one of them.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import psutil

from .state import ProcessRef


class Process(Protocol):
    """What identifies a process (a Node or a ProcessRef of provisioners/state.py)."""

    pid: int | None
    pgid: int | None
    create_time: float | None


# How far a process's start time, read twice, may differ and still name the same process. Linux keeps a process's
# start as clock ticks since boot; psutil adds the boot time, which the kernel recomputes on every read as the wall
# clock minus the uptime, in whole seconds, so an NTP adjustment between two reads (the one recorded, the one
# compared) moves it by a second. A pid reused by another process started within 1.5 s of the recorded one would
# need the whole pid space to wrap in that time.
START_TIME_TOLERANCE_S = 1.5


def is_ours(node: Process) -> bool:
    """True while the process recorded for `node` is still the same process and not a zombie."""
    if not node.pid:
        return False
    try:
        proc = psutil.Process(node.pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return node.create_time is None or abs(proc.create_time() - node.create_time) < START_TIME_TOLERANCE_S
    except psutil.NoSuchProcess:
        return False


def reap(pid: int | None) -> int | None:
    """Collect a child's exit status (if it is our child); None while it runs."""
    if not pid:
        return None
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return None
    if done == 0:
        return None
    return os.waitstatus_to_exitcode(status)


def own_groups() -> set[int]:
    """The process groups of this process and of every ancestor of it: groups no stop may signal, whatever a record
    says (the shell script that called dsctl runs in one of them, with whatever it started in the background)."""
    groups = {os.getpgrp()}
    try:
        for proc in psutil.Process().parents():
            try:
                groups.add(os.getpgid(proc.pid))
            except OSError:
                continue
    except psutil.Error:
        pass
    return groups


def group_to_signal(pid: int, recorded_pgid: int | None, current_pgid: int | None, forbidden: set[int]) -> int | None:
    """The group a stop signals for a recorded process: its recorded group when the process made it and still leads
    it (pid == group: dsctl starts every process with a session of its own), and it is none of `forbidden` (this
    process's and its ancestors'); None (the process alone is signalled) otherwise."""
    if not recorded_pgid or recorded_pgid != pid or current_pgid != recorded_pgid or recorded_pgid in forbidden:
        return None
    return recorded_pgid


def _signal(nodes: Sequence[Process], sig: int, forbidden: set[int]) -> None:
    for node in nodes:
        if not node.pid:
            continue
        try:
            group = group_to_signal(node.pid, node.pgid, os.getpgid(node.pid), forbidden)
            if group is not None:
                os.killpg(group, sig)
            elif node.pid != os.getpid() and is_ours(node):
                os.kill(node.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def stop_groups(nodes: Sequence[Process], grace_s: float = 8.0) -> None:
    """SIGTERM each node's process group (the process alone, where dsctl did not make its group: group_to_signal),
    then SIGKILL those left after `grace_s`. A stopped process (SIGSTOP, a debugger) is continued after the SIGTERM,
    so that it can end as asked.

    A node whose recorded process is gone (or whose pid now belongs to another
    process) is left alone: its pgid may have been reused by someone else.
    """
    live = [n for n in nodes if n.pid and n.pid != os.getpid() and is_ours(n)]
    for n in nodes:
        reap(n.pid)
    forbidden = own_groups() if live else set()
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 3.0)):
        if not live:
            return
        _signal(live, sig, forbidden)
        if sig == signal.SIGTERM:
            _signal(live, signal.SIGCONT, forbidden)
        deadline = time.monotonic() + wait
        while live and time.monotonic() < deadline:
            for n in live:
                reap(n.pid)
            live = [n for n in live if is_ours(n)]
            if live:
                time.sleep(0.05)


# -- a run's processes, when its state file cannot be read ------------------------------------------------------------

@dataclass
class RunProcesses:
    """What runs on this machine for a run whose state is unreadable: the processes dsctl provably started for it,
    and those that only name its folder (described, and never touched)."""

    proved: list[ProcessRef] = field(default_factory=list)
    unidentified: list[str] = field(default_factory=list)


def started_for_run(cmdline: list[str], pid: int, sid: int | None, run_dir: str, run_id: str | None) -> bool:
    """Whether a process is one dsctl started for the run: it leads a session of its own (every process dsctl
    starts does) and runs one of dsctl's modules (`python -m dsctl.<module>`: the launcher and what it forks, a
    server or trainer, a detached `dsctl up --run-id RUN`) with an argument naming the run's folder, or the run."""
    if sid != pid:
        return False
    try:
        module = cmdline[cmdline.index("-m") + 1]
    except (ValueError, IndexError):
        return False
    if not module.startswith("dsctl."):
        return False
    inside = run_dir.rstrip("/") + "/"
    args = cmdline[cmdline.index("-m") + 2:]
    if any(a == run_dir or a.startswith(inside) for a in args):
        return True
    return bool(run_id) and any(a == "--run-id" and b == run_id for a, b in zip(args, args[1:]))


def run_processes(run_dirs: set[str], run_id: str | None = None) -> RunProcesses:
    """The live processes that name the run (any of `run_dirs`, its folder as written and resolved, or `--run-id`),
    sorted by started_for_run; never this process nor an ancestor of it."""
    me = psutil.Process()
    mine = {me.pid, *(p.pid for p in me.parents())}
    out = RunProcesses()
    for proc in psutil.process_iter(["pid", "cmdline", "create_time", "status"]):
        try:
            argv = proc.info["cmdline"] or []
            cmd = " ".join(argv)
            if proc.pid in mine or proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            named = any(d in cmd for d in run_dirs)
            if not named and not (run_id and run_id in argv):
                continue
            if any(started_for_run(argv, proc.pid, os.getsid(proc.pid), d, run_id) for d in run_dirs):
                out.proved.append(ProcessRef(pid=proc.pid, pgid=proc.pid, create_time=proc.info["create_time"]))
            elif named:
                out.unidentified.append(f"pid {proc.pid} ({cmd[:120]})")
        except (psutil.Error, OSError):
            continue
    return out
